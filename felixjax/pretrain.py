"""Cross-task pretraining of the MLP cost model from tuning databases (DESIGN.md ⑥, the cold start).

A fresh tuning run has no measurements of its task, so its first rounds are ranked by the roofline
prior. Felix and Ansor start from a model pretrained on TenSet instead; here the data are the user's
own databases: every correctly measured config of every task in them (other operators, other
networks), featurized exactly as the tuner does (hard-mode features of the config's relaxed point).

``pretrain`` holds out whole tasks (never rows of a task it trains on), trains the MLP on the rest
with the within-task rank loss, reports the held-out tasks' pairwise accuracy of the MLP next to the
prior's (the number that says whether the pretrained model transfers), and saves the model as a
``.npz`` checkpoint (arrays plus JSON metadata, no pickle) that ``fj.tune(strategy_options=
{"cost_model": path})``, ``felixjax tune --cost-model`` and ``felixjax compare --cost-model`` load.

Example:
    >>> from felixjax.pretrain import split_tasks
    >>> train, held = split_tasks(["a", "b", "c", "d", "e"], holdout=0.2, seed=0)
    >>> len(train), len(held), sorted(train + held) == ["a", "b", "c", "d", "e"]
    (4, 1, True)
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from costmodels import Features

from .database import finite_json
from .model import CostModelScorer, load_pretrained  # noqa: F401  (load_pretrained: public here too)


@dataclass(frozen=True)
class PretrainData:
    """Features and latencies of many tasks; ``groups[i]`` indexes ``tasks``.

    ``prior`` holds the roofline prior's score of every row (computed with each record's own
    target), so held-out comparisons need no second pass over the configs.
    """

    features: Features
    latencies: np.ndarray
    groups: np.ndarray
    prior: np.ndarray
    tasks: tuple[str, ...]  # per group: the task's name (a task measured on two machines is two groups)
    #: (task name, distinct correctly measured configs) of each task left out for having fewer than ``min_records``
    skipped: tuple[tuple[str, int], ...] = ()

    def __len__(self) -> int:
        return len(self.latencies)

    def rows(self, tasks: Iterable[str]) -> np.ndarray:
        keep = [i for i, t in enumerate(self.tasks) if t in set(tasks)]
        return np.flatnonzero(np.isin(self.groups, keep))


def split_tasks(tasks: Sequence[str], *, holdout: float, seed: int) -> tuple[list[str], list[str]]:
    """(training tasks, held-out tasks): a seeded share ``holdout`` of whole tasks, at least one
    held out when there are three or more, none with fewer, and never all of them."""
    order = [tasks[i] for i in np.random.default_rng(seed).permutation(len(tasks))]
    n_out = max(1, int(round(holdout * len(tasks)))) if len(tasks) >= 3 and holdout > 0 else 0
    n_out = min(n_out, len(tasks) - 1)  # at least one task to train on (0.95 of 6 tasks held out all 6)
    return order[n_out:], order[:n_out]


def load_dataset(dbs: Sequence[str | os.PathLike], *, exclude: Iterable[str] = (), min_records: int = 16,
                 progress: bool = False) -> PretrainData:
    """Every correctly measured config of every task in ``dbs`` (one row per task and config: the
    fastest measurement), featurized in hard mode.

    Args:
        dbs: database paths (``fj.Database`` files), or dataset files in the packaged format
            (``.jsonl.gz``, :func:`packaged_database`).
        exclude: task names (``Task.name``) to leave out, e.g. the tasks a comparison will tune, so
            the pretrained model has never seen their measurements.
        min_records: tasks with fewer distinct measured configs are skipped.
        progress: print a line per task to stderr.
    """
    import sys

    from codegen.space import Space, sketches_for
    from codegen.target import Target
    from costmodels import concat_features

    from .database import Database

    excluded, seen_names = set(exclude), set()
    per_task: dict[tuple, dict] = {}  # (task key, target key) -> {config: record}: one group per task and machine
    meta: dict[tuple, tuple] = {}
    for path in dbs:
        if not Path(path).exists():
            raise FileNotFoundError(f"no tuning database at {path}")
        temporary = None
        try:
            if str(path).endswith((".jsonl.gz", ".jsonl")):  # a dataset file (the packaged one's format, export_jsonl's)
                temporary = tempfile.mkdtemp(prefix="fj_pretrain_")
                path, _ = packaged_database(path, os.path.join(temporary, "records.db"))
            with Database(path, readonly=True) as db:
                for task, target_key in db.tasks():
                    seen_names.add(task.name)
                    if task.name in excluded:
                        continue
                    best = per_task.setdefault((task.key, target_key), {})
                    for r in db.records(task=task, target=target_key):
                        if r.ok and (r.config not in best or r.latency_s < best[r.config].latency_s):
                            best[r.config] = r
                    meta.setdefault((task.key, target_key), (task, target_key))
        finally:
            if temporary is not None:
                shutil.rmtree(temporary, ignore_errors=True)
    unmatched = sorted(excluded - seen_names)
    if unmatched:  # a mistyped name leaves the task it meant in the training data
        msg = f"exclude names no task in the databases: {', '.join(unmatched)}"
        if progress:
            print(f"[pretrain] warning: --{msg}", file=sys.stderr, flush=True)
        else:
            warnings.warn(msg, UserWarning, stacklevel=2)
    feats, lats, groups, priors, names, skipped = [], [], [], [], [], []
    for key in sorted(per_task, key=lambda k: (meta[k][0].name, k)):
        recs = list(per_task[key].values())
        task, _ = meta[key]
        name = task.name
        target = Target.from_json(recs[0].target) if recs and recs[0].target else Target.cpu()
        spaces = {s.name: Space(task, s, target) for s in sketches_for(task, target)}
        for sketch in {r.config.sketch for r in recs} - set(spaces):  # a padded variant: its name spells its extents
            try:
                spaces[sketch] = Space(task, sketch, target)
            except (KeyError, ValueError):  # a sketch this version no longer has: its records are left out
                pass
        if target.is_gpu:  # its records' features are the GPU set: a CPU checkpoint cannot learn from them
            skipped.append((f"{name} ({target.kind}: pretraining learns CPU records only)", len(recs)))
            if progress:
                print(f"[pretrain] {name}: {len(recs)} configs on a {target.kind} target: skipped (pretraining learns "
                      "CPU records only)", file=sys.stderr, flush=True)
            continue
        recs = [r for r in recs if r.config.sketch in spaces]
        if len(recs) < min_records:
            skipped.append((name, len(recs)))
            if progress:
                print(f"[pretrain] {name}: {len(recs)} configs, fewer than {min_records}: skipped",
                      file=sys.stderr, flush=True)
            continue
        scorer = CostModelScorer(spaces, target)
        f = scorer.features([r.config for r in recs])
        feats.append(f)
        priors.append(np.asarray(scorer.prior.predict(f), np.float64))
        lats.append(np.array([r.latency_s for r in recs]))
        groups.append(np.full(len(recs), len(names), np.int64))
        names.append(name)
        if progress:
            print(f"[pretrain] {name}: {len(recs)} configs", file=sys.stderr, flush=True)
    if skipped and all(n.endswith("pretraining learns CPU records only)") for n, _ in skipped) and not names:
        raise ValueError(f"{', '.join(map(str, dbs))}: GPU records only; pretraining learns CPU records (a GPU "
                         "target's cost model starts from its roofline prior)")
    if not names:
        raise ValueError(f"no task with >= {min_records} correctly measured configs in {list(map(str, dbs))}"
                         + (f" (excluded: {sorted(excluded)})" if excluded else "")
                         + (f" (skipped: {', '.join(f'{n} {k}' for n, k in skipped)})" if skipped else ""))
    return PretrainData(concat_features(feats), np.concatenate(lats), np.concatenate(groups), np.concatenate(priors),
                        tuple(names), tuple(skipped))


def _take(data: PretrainData, rows: np.ndarray) -> tuple[Features, np.ndarray, np.ndarray]:
    f = data.features
    return Features(f.access[rows], f.mask[rows], f.glob[rows]), data.latencies[rows], data.groups[rows]


def _check_output(out: str | os.PathLike, dbs: Sequence[str | os.PathLike]) -> None:
    """Before any training: ``out`` (and its ``.json`` report) must be a file path that is none of the inputs
    (``pretrain db -o db`` replaced the database with the checkpoint); its folder is made."""
    for path in (Path(out), Path(str(out) + ".json")):
        if path.is_dir():
            raise ValueError(f"{path}: a folder is there; give the checkpoint a file name, e.g. model.npz")
        if path.exists() and any(Path(db).exists() and os.path.samefile(path, db) for db in dbs):
            raise ValueError(f"{path} is one of the databases to learn from; give the checkpoint another name")
    Path(out).parent.mkdir(parents=True, exist_ok=True)


def pretrain(dbs: Sequence[str | os.PathLike], out: str | os.PathLike, *, exclude: Iterable[str] = (),
             holdout: float = 0.2, seed: int = 0, hidden: int = 128, sample_budget: int = 200_000,
             max_epochs: int = 200, min_records: int = 16, progress: bool = False, members: int = 1) -> dict:
    """Trains the MLP on the measurements of many tasks and saves it to ``out`` (``.npz``).

    Args:
        dbs: tuning databases to learn from.
        out: checkpoint path; a JSON report is written next to it (``<out>.json``).
        exclude: task names left out entirely (see :func:`load_dataset`).
        holdout: share of the tasks held out whole, to measure transfer to unseen tasks; the saved
            model never trains on them (0: train on every task, no transfer measurement).
        seed: seeds the task split, initialization and batching.
        hidden: MLP width (the tuner's default is 128).
        sample_budget: samples seen in training (epochs = budget / rows, up to ``max_epochs``).
        max_epochs: epoch cap.
        min_records: tasks with fewer distinct measured configs are skipped.
        progress: print per-task lines.
        members: 1 (the default): one MLP, the tuner's cost model. More: an
            :class:`~costmodels.ensemble.EnsembleCostModel` of that many MLPs (own seeds, bootstrap
            resamples of the rows), whose disagreement says where the data do not reach (the gradient
            strategy's ``pessimism`` reads it); the held-out check scores the members' mean.

    Returns:
        The report (also written as JSON): tasks trained on and held out, rows, seconds, the
        held-out tasks' mean within-task pairwise accuracy of the MLP and of the roofline prior
        (``nan`` without held-out tasks) and per held-out task.
    """
    from costmodels import EnsembleCostModel, MLPCostModel, TrainConfig, pairwise_accuracy

    from .features import N_ACCESS_FEATURES, N_GLOBAL_FEATURES

    t0 = time.perf_counter()
    _check_output(out, dbs)
    data = load_dataset(dbs, exclude=exclude, min_records=min_records, progress=progress)
    train_tasks, held_tasks = split_tasks(list(dict.fromkeys(data.tasks)), holdout=holdout, seed=seed)
    cfg = TrainConfig(sample_budget=sample_budget, max_epochs=max_epochs)
    if members > 1:
        model = EnsembleCostModel(N_ACCESS_FEATURES, N_GLOBAL_FEATURES, num_members=members, hidden=hidden,
                                  seed=seed, config=cfg)
    else:
        model = MLPCostModel(N_ACCESS_FEATURES, N_GLOBAL_FEATURES, hidden=hidden, seed=seed, config=cfg)
    f, lat, groups = _take(data, data.rows(train_tasks))
    fit = model.update(f, lat, groups)
    per_task = {}
    for name in held_tasks:
        rows = data.rows([name])
        hf, hlat, hgroups = _take(data, rows)
        pred = np.asarray(model.predict(hf))
        per_machine = [np.flatnonzero(hgroups == g) for g in np.unique(hgroups)]  # pairs within one machine only
        per_task[name] = {"configs": len(rows),
                          "mlp_pairwise": float(np.mean([pairwise_accuracy(pred[i], hlat[i]) for i in per_machine])),
                          "prior_pairwise": float(np.mean([pairwise_accuracy(data.prior[rows][i], hlat[i])
                                                           for i in per_machine]))}

    def mean(key: str) -> float:
        return float(np.mean([v[key] for v in per_task.values()])) if per_task else float("nan")

    report = {"checkpoint": str(out), "databases": [str(p) for p in dbs], "excluded": sorted(set(exclude)),
              "train_tasks": sorted(train_tasks), "heldout_tasks": sorted(held_tasks), "rows": len(data),
              "train_rows": int(len(lat)), "min_records": min_records,
              "skipped": [{"task": n, "configs": k} for n, k in data.skipped],
              "seed": seed, "hidden": hidden, "members": members,
              "fit": {k: float(v) for k, v in fit.items()},
              "heldout_mlp_pairwise": mean("mlp_pairwise"), "heldout_prior_pairwise": mean("prior_pairwise"),
              "heldout": per_task, "seconds": time.perf_counter() - t0}
    model.save(out)
    # strict JSON: a mean over no held-out task is NaN in the returned report, null in the file
    Path(str(out) + ".json").write_text(json.dumps(finite_json(report), indent=2, sort_keys=True, allow_nan=False) + "\n")
    return report


PACKAGED = Path(__file__).resolve().parent / "data" / "pretrain_cpu.jsonl.gz"
#: The same shapes measured on a second machine (session 36, a Zen 5 EPYC; the first file is a Zen 4's): the data
#: of the judge model (:data:`felixjax.model.PACKAGED_JUDGE`).
PACKAGED_B = Path(__file__).resolve().parent / "data" / "pretrain_cpu_b.jsonl.gz"


def packaged_database(path: str | os.PathLike | None = None, db: str | os.PathLike | None = None) -> tuple[str, dict]:
    """The pretraining dataset shipped as package data (``benchmarks/make_pretrain_dataset.py``:
    CIFAR-size layers, shapes disjoint from the ``ops`` and ``fresh`` suites) as a database file
    ``pretrain`` can read, and its provenance (command, commit, date, machine).

    On another CPU a model pretrained on it is a warm start only: the tuner's online model compares
    it with the roofline prior on held-out measurements after each update and ranks with the prior
    where it ranks worse.

    Args:
        path: a ``.jsonl.gz`` in that format (default: the packaged file).
        db: database file to write (default: a fresh temporary file).

    Raises:
        FileNotFoundError: the dataset has not been generated (it needs hours on a quiet machine).

    Example:
        >>> packaged_database("/nonexistent.jsonl.gz")
        Traceback (most recent call last):
        ...
        FileNotFoundError: /nonexistent.jsonl.gz: no pretraining dataset (generate it with python benchmarks/make_pretrain_dataset.py on a quiet machine)
    """
    import gzip
    import tempfile

    from .database import Database, TuningRecord

    src = Path(path) if path is not None else PACKAGED
    if not src.exists():
        raise FileNotFoundError(f"{src}: no pretraining dataset (generate it with python "
                                "benchmarks/make_pretrain_dataset.py on a quiet machine)")
    out = str(db) if db is not None else os.path.join(tempfile.mkdtemp(), "pretrain.db")
    prov: dict = {}
    store = Database(out)
    n = 0
    try:
        with (gzip.open(src, "rt") if src.suffix == ".gz" else open(src)) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    if "provenance" in row:
                        prov = row["provenance"]
                        continue
                    rec = TuningRecord.from_json(row)
                except (ValueError, KeyError, TypeError, AttributeError) as e:
                    raise ValueError(f"{src}, line {n}: not a tuning record ({type(e).__name__}: {e})") from None
                store.add(rec)
    except (OSError, EOFError, UnicodeDecodeError) as e:  # a truncated or non-gzip file named .gz, binary data
        raise ValueError(f"{src}: not a readable {'gzip-compressed ' if src.suffix == '.gz' else ''}JSON-lines "
                         f"dataset (line {n + 1}: {type(e).__name__}: {e})") from None
    finally:
        store.close()
    return out, prov
