"""Cross-task pretraining of the cost model: whole tasks held out, exclusions honoured, the checkpoint
starts the scorer of both learned strategies, and bad input is one clear error."""
import json
import math

import numpy as np
import pytest

import felixjax as fj
from codegen.measure import MeasureResult
from codegen.space import Space, sketches_for
from costmodels import MLPCostModel, pairwise_accuracy
from felixjax.cli import main as cli
from felixjax.database import TuningRecord
from felixjax.features import N_ACCESS_FEATURES, N_GLOBAL_FEATURES
from felixjax.model import CostModelScorer
from felixjax.pretrain import load_dataset, load_pretrained, pretrain, split_tasks
from felixjax.testing import SyntheticOracle

TARGET = fj.Target.cpu()
TASKS = [fj.ops.matmul(64, 48, 32), fj.ops.matmul(32, 64, 64), fj.ops.matmul(48, 32, 96),
         fj.ops.dense(1, 128, 64)]


@pytest.fixture(scope="module")
def oracle_db(tmp_path_factory):
    """A database of synthetic-oracle measurements: 48 random configs per sketch of four small tasks."""
    path = tmp_path_factory.mktemp("pre") / "runs.db"
    with fj.Database(path) as db:
        for task in TASKS:
            oracle = SyntheticOracle(task, TARGET)
            trial = 0
            for sk in sketches_for(task):
                sp = Space(task, sk, TARGET)
                rng = np.random.default_rng(trial)
                for c in dict.fromkeys(sp.sample(rng) for _ in range(48)):
                    db.add(TuningRecord(task, TARGET.key, "random:0", trial, c, MeasureResult("ok", (oracle(c),)), 0))
                    trial += 1
    return path


@pytest.fixture(scope="module")
def checkpoint(oracle_db, tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "cm.npz"
    report = pretrain([oracle_db], out, holdout=0.25, seed=0, sample_budget=20_000, max_epochs=40)
    return out, report


def test_split_holds_out_whole_tasks():
    names = [f"t{i}" for i in range(10)]
    train, held = split_tasks(names, holdout=0.2, seed=3)
    assert len(held) == 2 and not set(train) & set(held) and sorted(train + held) == sorted(names)
    assert split_tasks(names, holdout=0.2, seed=3) == (train, held)  # seeded
    assert split_tasks(names[:2], holdout=0.5, seed=0)[1] == []  # too few tasks to hold one out


def test_dataset_rows_features_and_exclusion(oracle_db):
    data = load_dataset([oracle_db])
    assert set(data.tasks) == {t.name for t in TASKS}
    assert len(data) == len(data.groups) == len(data.prior) == data.features.glob.shape[0]
    assert np.isfinite(data.features.glob).all() and (data.latencies > 0).all()
    less = load_dataset([oracle_db], exclude=[TASKS[0].name])
    assert TASKS[0].name not in less.tasks and len(less) == len(data) - len(data.rows([TASKS[0].name]))
    with pytest.raises(ValueError, match="no task with"):
        load_dataset([oracle_db], exclude=[t.name for t in TASKS])
    with pytest.raises(FileNotFoundError):
        load_dataset([oracle_db.parent / "missing.db"])


def test_a_task_measured_on_two_machines_is_two_groups(oracle_db, tmp_path):
    """Datasets of two CPUs (say the packaged one and this host's) train one model: each machine's
    measurements of a task stay one group of their own (ranked against each other only, features from
    their own target), never merged config by config; holding a task out holds it out on both."""
    import dataclasses

    other = dataclasses.replace(TARGET, name="other cpu", l1d_bytes=2048, l2_bytes=16384)  # small: other fits
    assert other.key != TARGET.key
    path = tmp_path / "two.db"
    with fj.Database(path) as db, fj.Database(oracle_db, readonly=True) as src:
        for rec in src.records(task=TASKS[0], target=TARGET.key):
            db.add(rec)
            db.add(dataclasses.replace(rec, target_key=other.key, target=other.to_json(), id=None,
                                       result=MeasureResult("ok", (1e-8 / rec.latency_s,))))  # the reverse order there
    data = load_dataset([path])
    assert data.tasks == (TASKS[0].name, TASKS[0].name) and set(np.unique(data.groups)) == {0, 1}
    first, second = (np.flatnonzero(data.groups == g) for g in (0, 1))
    assert len(first) == len(second) == len(data) // 2
    lat = {tuple(data.features.glob[i]): data.latencies[i] for i in first}
    assert not all(tuple(data.features.glob[i]) in lat for i in second)  # the other machine's caches: other features
    assert len(data.rows([TASKS[0].name])) == len(data)
    rep = pretrain([path, oracle_db], tmp_path / "m.npz", holdout=0.25, seed=0, max_epochs=2)
    assert sorted(rep["train_tasks"] + rep["heldout_tasks"]) == sorted(t.name for t in TASKS)


def test_pretrain_report_and_checkpoint(checkpoint, oracle_db):
    out, rep = checkpoint
    assert len(rep["heldout_tasks"]) == 1 and len(rep["train_tasks"]) == 3
    assert not set(rep["heldout_tasks"]) & set(rep["train_tasks"])
    assert json.loads(open(str(out) + ".json").read())["heldout_tasks"] == rep["heldout_tasks"]
    for key in ("heldout_mlp_pairwise", "heldout_prior_pairwise"):
        assert 0.0 <= rep[key] <= 1.0
    # the model learned its training tasks: within-task ranking well above chance on their rows
    model = load_pretrained(out)
    data = load_dataset([oracle_db])
    rows = data.rows(rep["train_tasks"])
    f = data.features
    sub = type(f)(f.access[rows], f.mask[rows], f.glob[rows])
    assert pairwise_accuracy(model.predict(sub), data.latencies[rows], data.groups[rows]) > 0.7


def test_scorer_starts_from_the_pretrained_model(checkpoint):
    out, _ = checkpoint
    task = fj.ops.matmul(96, 64, 32)  # a task the model never saw
    spaces = {s.name: Space(task, s, TARGET) for s in sketches_for(task)}
    fresh = CostModelScorer(spaces, TARGET)
    pre = CostModelScorer(spaces, TARGET, pretrained=str(out))
    assert fresh.active == "prior" and pre.active == "mlp" and pre.pretrained == str(out)
    cfgs = [sp.sample(np.random.default_rng(i)) for i, sp in enumerate(spaces.values())]
    want = load_pretrained(out).predict(pre.features(cfgs))
    np.testing.assert_allclose(pre.score(cfgs), want, rtol=1e-5, atol=1e-5)
    sk = next(iter(spaces))
    xs = np.stack([pre.relaxations[sk].to_x(c) for c in cfgs if c.sketch == sk])
    np.testing.assert_allclose(pre.score_x(sk, xs), pre.score([c for c in cfgs if c.sketch == sk]), rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("strategy", ["gradient", "genetic"])
def test_strategies_tune_from_a_pretrained_model(checkpoint, strategy):
    out, _ = checkpoint
    task = fj.ops.matmul(96, 64, 32)
    opts = {"cost_model": str(out), "batch_size": 16}
    opts.update({"starts": 16, "steps": 8} if strategy == "gradient" else {"population": 128})
    cmp = fj.compare([task], [strategy], trials=32, seeds=[0], db=None, replay=True, progress=False, remeasure=0,
                     strategy_options={strategy: opts}, defaults=False)
    (history,) = cmp.histories.values()
    assert len(history) == 32 and all(r.ok for r in history)


def test_bad_checkpoints_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="felixjax pretrain"):
        load_pretrained(tmp_path / "none.npz")
    MLPCostModel(3, 2, hidden=8).save(tmp_path / "small.npz")
    with pytest.raises(ValueError, match="features"):
        load_pretrained(tmp_path / "small.npz")


def test_cli_pretrain_and_cost_model_errors(oracle_db, tmp_path, capsys):
    out = tmp_path / "m.npz"
    assert cli(["pretrain", str(oracle_db), "-o", str(out), "--holdout", "0.25"]) == 0
    text = capsys.readouterr().out
    assert "held-out tasks (1)" in text and out.exists()
    for argv, msg in ((["pretrain", str(tmp_path / "nope.db"), "-o", str(out)], "no such database"),
                      (["tune", "--op", "matmul:m=8,n=8,k=8", "--cost-model", str(tmp_path / "x.npz")],
                       "no such cost-model"),
                      (["tune", "--op", "matmul:m=8,n=8,k=8", "--strategy", "random", "--cost-model", str(out)],
                       "needs a strategy with a cost model")):
        assert cli(argv) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and "Traceback" not in err and len(err.splitlines()) == 1
    # Python as the command line (session 73's known gap: fj.tune ignored the checkpoint for a random search)
    for call in (lambda: fj.tune("matmul:m=8,n=8,k=8", strategy="random", cost_model=str(out), progress=False),
                 lambda: fj.tune_model(b"not read", strategy="random", cost_model=str(out), progress=False)):
        with pytest.raises(ValueError, match="needs a strategy with a cost model"):
            call()


def test_dataset_keeps_padded_variants_and_lists_the_tasks_it_skips(tmp_path, capsys):
    """Session 72: ``load_dataset`` built its spaces from the task's sketches alone and silently dropped every record
    of a padded variant (``gemm_packed.pad_m264``: a sketch named after its extents, as the measurer builds them);
    and a task under ``min_records`` was skipped without a word."""
    task, small = fj.ops.matmul(257, 48, 32), fj.ops.matmul(32, 32, 32)
    # pad_m264 is this target's own variant (sketches_for(task, target)); pad_m272 one another run may have built
    spaces = [Space(task, name, TARGET) for name in ("gemm_packed", "gemm_packed.pad_m264", "gemm_packed.pad_m272")]
    rng = np.random.default_rng(0)
    cfgs = list(dict.fromkeys(sp.sample(rng) for sp in spaces for _ in range(8)))
    assert {c.sketch for c in cfgs} == {sp.sketch.name for sp in spaces}
    path = tmp_path / "pad.db"
    with fj.Database(path) as db:
        for i, c in enumerate(cfgs):
            db.add(TuningRecord(task, TARGET.key, "random:0", i, c, MeasureResult("ok", (1e-3 * (1 + i / 50),)), 0))
        for i, c in enumerate(Space(small, "gemm_packed", TARGET).sample_many(rng, 3)):
            db.add(TuningRecord(small, TARGET.key, "random:0", i, c, MeasureResult("ok", (1e-3 + i * 1e-4,)), 0))
    data = load_dataset([path], min_records=4, progress=True)
    assert data.tasks == (task.name,) and len(data) == len(cfgs)  # both padded variants' configs kept
    assert data.skipped == ((small.name, 3),)
    assert f"{small.name}: 3 configs, fewer than 4: skipped" in capsys.readouterr().err
    assert cli(["pretrain", str(path), "-o", str(tmp_path / "m.npz"), "--min-records", "4", "--holdout", "0"]) == 0
    out = capsys.readouterr().out
    assert (f"left out 1 task(s) (fewer than 4 correctly measured configs, --min-records, unless said otherwise): "
            f"{small.name} (3 configs)") in out
    assert json.loads((tmp_path / "m.npz.json").read_text())["skipped"] == [{"task": small.name, "configs": 3}]
    assert cli(["pretrain", str(path), "-o", str(tmp_path / "m.npz"), "--min-records", "0"]) == 2


def test_pretrain_never_writes_over_its_inputs_or_into_a_folder(oracle_db, tmp_path):
    """Session 82, a review: ``felixjax pretrain runs.db -o runs.db`` trained, then replaced the database with
    the checkpoint (exit 0); ``-o a_folder`` trained, then failed on the folder. Both are refused first."""
    import shutil

    db = tmp_path / "runs.db"
    shutil.copy(oracle_db, db)
    before = db.read_bytes()
    (tmp_path / "link.db").symlink_to(db)
    for out in (db, tmp_path / "link.db"):  # the same file by another name too
        with pytest.raises(ValueError, match="one of the databases to learn from"):
            pretrain([db], out, holdout=0)
    assert db.read_bytes() == before
    (tmp_path / "dir.npz").mkdir()
    with pytest.raises(ValueError, match="a folder is there"):
        pretrain([db], tmp_path / "dir.npz", holdout=0)


def test_records_without_a_usable_time_are_no_measurement(oracle_db, tmp_path):
    """An ``ok`` record with a NaN, infinite, zero or negative time (written by hand or imported: the tuner
    stores such a timer's answer as a runtime error) is not ok: pretraining and the tree ranker's rows leave
    it out, and it no longer hides a real measurement of the same config (session 82, a review: NaN rows were
    trained on, a NaN record shadowed the config's good one, and ranker="gbdt" stopped in scikit-learn)."""
    import shutil

    from felixjax.model import ranker_rows

    for bad in (math.nan, math.inf, 0.0, -1e-6):
        assert not MeasureResult("ok", (bad,)).ok and MeasureResult("ok", (bad,)).latency_s == math.inf
    db = tmp_path / "bad.db"
    shutil.copy(oracle_db, db)
    good = load_dataset([oracle_db])
    with fj.Database(db) as d:
        task = TASKS[0]
        recs = d.records(task=task, target=TARGET.key)
        for k, bad in enumerate((math.nan, math.inf, 0.0, -1e-6)):
            # the NaN one first: it used to hide the config's real measurement
            d.add(TuningRecord(task, TARGET.key, "import:0", k, recs[k].config, MeasureResult("ok", (bad,)), 0))
        best = d.best(task, TARGET.key)  # (the zero-time row sorted first: its latency is NULL)
        assert best.ok and best.latency_s == min(r.latency_s for r in recs if r.ok)
    data = load_dataset([db])
    assert np.isfinite(data.latencies).all() and (data.latencies > 0).all()
    np.testing.assert_array_equal(data.latencies, good.latencies)
    _, y = ranker_rows(str(db), per_task=64)
    assert len(y) and np.isfinite(y).all()


def test_exclude_naming_no_task_warns_in_python_too(oracle_db):
    with pytest.warns(UserWarning, match="exclude names no task in the databases: matmul_64x48x3$"):
        load_dataset([oracle_db], exclude=["matmul_64x48x3"])


def test_damaged_checkpoint_metadata_is_a_clear_error(tmp_path):
    """A zero standardization scale (every score NaN), a ``hidden`` that asks for terabytes, another format
    version: each a ValueError naming the file (session 82, a review)."""
    from costmodels.checkpoint import load_npz

    src = tmp_path / "m.npz"
    pretrained = MLPCostModel(3, 2, hidden=8)
    pretrained.fitted = True
    pretrained.save(src)
    flat, meta = load_npz(src)

    def write(name, arrays, meta):
        with open(tmp_path / name, "wb") as fh:
            np.savez(fh, **arrays, __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8))
        return tmp_path / name

    zero = write("zero.npz", {**flat, "norm/glob_std": np.zeros(2, np.float32)}, meta)
    with pytest.raises(ValueError, match="zero.npz holds a standardization scale that is not positive"):
        load_pretrained(zero, widths=(3, 2))
    huge = write("huge.npz", flat, {**meta, "config": {**meta["config"], "hidden": 10**6}})
    with pytest.raises(ValueError, match=r"huge.npz: a damaged 'mlp' checkpoint .*hidden=1000000"):
        MLPCostModel.load(huge)
    other = write("v2.npz", flat, {**meta, "format_version": 99})
    with pytest.raises(ValueError, match="v2.npz: unsupported checkpoint format 99"):
        MLPCostModel.load(other)


def test_damaged_ensemble_checkpoints_are_clear_errors(tmp_path):
    """A code review: only the first member's sizes were checked (member 1's damaged hidden: a 298 GiB
    allocation), a missing array was a bare KeyError, and a zero standardization scale loaded."""
    from costmodels import EnsembleCostModel
    from costmodels.checkpoint import load_npz
    from felixjax.model import load_ensemble

    src = tmp_path / "e.npz"
    EnsembleCostModel(3, 2, num_members=2, hidden=8).save(src)
    flat, meta = load_npz(src)

    def write(name, arrays, meta):
        with open(tmp_path / name, "wb") as fh:
            np.savez(fh, **arrays, __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8))
        return tmp_path / name

    members = [dict(m) for m in meta["members"]]
    members[1] = {**members[1], "config": {**members[1]["config"], "hidden": 10**6}}
    with pytest.raises(ValueError, match="huge.npz: a damaged 'ensemble' checkpoint .*hidden=1000000"):
        EnsembleCostModel.load(write("huge.npz", flat, {**meta, "members": members}))
    with pytest.raises(ValueError, match="missing.npz: a damaged 'ensemble' checkpoint"):
        EnsembleCostModel.load(write("missing.npz", {k: v for k, v in flat.items() if k != "net/glob_in/kernel"},
                                     meta))
    trained = EnsembleCostModel(N_ACCESS_FEATURES, N_GLOBAL_FEATURES, num_members=2, hidden=8)
    trained.save(tmp_path / "z.npz")
    flat, meta = load_npz(tmp_path / "z.npz")
    zero = write("zero.npz", {**flat, "norm/glob_std": np.zeros_like(flat["norm/glob_std"])}, meta)
    with pytest.raises(ValueError, match="zero.npz holds a standardization scale that is not positive"):
        load_ensemble(zero)
