"""The packaged pretraining dataset's format and rules (benchmarks/make_pretrain_dataset.py): shapes
disjoint from both evaluation suites; provenance first; records load into a database pretrain reads."""
import gzip
import json

import pytest

import felixjax as fj
from benchmarks.make_pretrain_dataset import HELD_OUT, SHAPES, check_disjoint
from codegen.measure import MeasureResult
from codegen.ops import parse_spec
from codegen.spaces import spaces_for
from costmodels import Features
from felixjax.database import TuningRecord
from felixjax.model import PACKAGED_MODEL, load_pretrained
from felixjax.pretrain import PACKAGED, PACKAGED_B, load_dataset, packaged_database
from felixjax.suites import SUITES, suite


def test_shapes_are_disjoint_from_the_evaluation_suites():
    tasks = [parse_spec(s) for s in SHAPES]
    held = {t.key for name in HELD_OUT for t in suite(name)}
    assert not held & {t.key for t in tasks} and len({t.key for t in tasks}) == len(tasks)
    check_disjoint(tasks)
    with pytest.raises(SystemExit):
        check_disjoint([parse_spec(SUITES["fresh"][0])])


def test_packaged_format_round_trips(tmp_path):
    task = parse_spec(SHAPES[0])
    target = fj.Target.cpu()
    cfg = next(iter(spaces_for(task, target).values())).default()
    rec = TuningRecord(task, target.key, "random:0", 0, cfg, MeasureResult("ok", (1e-4, 2e-4)), 1.0)
    path = tmp_path / "d.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"provenance": {"commit": "abc", "machine": ["x"]}}) + "\n")
        f.write(json.dumps(rec.to_json()) + "\n")
    db, prov = packaged_database(path, tmp_path / "p.db")
    assert prov == {"commit": "abc", "machine": ["x"]}
    [back] = fj.Database(db).records()
    assert back.config == cfg and back.task.key == task.key and back.latency_s == pytest.approx(1.5e-4)
    with pytest.raises(FileNotFoundError, match="make_pretrain_dataset"):
        packaged_database(tmp_path / "missing.jsonl.gz")


# ---- the shipped files themselves (generated on the development machine, see their provenance) ----------



def _packaged_rows(path=PACKAGED):
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.parametrize("path", [PACKAGED, PACKAGED_B], ids=["first", "second_machine"])
def test_the_packaged_dataset_is_shipped_with_its_provenance(path):
    rows = _packaged_rows(path)
    prov = rows[0]["provenance"]
    assert prov["disjoint_from"] == ["ops", "fresh"] and prov["machine"] and prov["commit"]
    assert PACKAGED.stat().st_size + PACKAGED_B.stat().st_size <= 5 * 1024 * 1024
    recs = [TuningRecord.from_json(r) for r in rows[1:]]
    assert recs and all(r.ok for r in recs)
    held = {t.key for name in ("ops", "fresh") for t in suite(name)}
    keys = {r.task.key for r in recs}
    assert not keys & held and keys <= {parse_spec(s).key for s in SHAPES}


def test_the_packaged_model_ranks_its_data_and_starts_a_search():
    """The shipped checkpoint matches this feature set and ranks configs of its own dataset well above
    chance (it fails after a feature change that the checkpoint was not retrained for:
    ``python benchmarks/make_pretrain_dataset.py --model-only``)."""
    import numpy as np

    from costmodels import Features, pairwise_accuracy

    model = load_pretrained("packaged")
    assert load_pretrained(PACKAGED_MODEL).n_updates == model.n_updates and model.fitted
    report = json.loads(PACKAGED_MODEL.with_name(PACKAGED_MODEL.name + ".json").read_text())
    assert report["transfer_check"]["heldout_mlp_pairwise"] > report["transfer_check"]["heldout_prior_pairwise"]
    data = load_dataset([PACKAGED])
    rows = data.rows(list(data.tasks)[:3])  # three tasks: featurizing all of them takes longer
    f = data.features
    sub = Features(f.access[rows], f.mask[rows], f.glob[rows])
    mlp = pairwise_accuracy(model.predict(sub), data.latencies[rows], data.groups[rows])
    prior = pairwise_accuracy(data.prior[rows], data.latencies[rows], data.groups[rows])
    assert mlp > 0.75 and mlp > prior, (mlp, prior)
    task = fj.ops.matmul(96, 64, 32)
    cmp = fj.compare([task], ["gradient"], trials=16, seeds=[0], db=None, replay=True, progress=False, remeasure=0,
                     strategy_options={"gradient": {"cost_model": "packaged", "batch_size": 8, "starts": 8,
                                                    "steps": 4}}, defaults=False)
    (history,) = cmp.histories.values()
    assert len(history) == 16 and all(r.ok for r in history) and np.isfinite([r.latency_s for r in history]).all()


def test_pretrain_reads_dataset_files(tmp_path):
    task = parse_spec(SHAPES[-1])
    target = fj.Target.cpu()
    path = tmp_path / "d.jsonl.gz"
    import numpy as np

    rng = np.random.default_rng(0)
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"provenance": {"commit": "abc"}}) + "\n")
        for sp in spaces_for(task, target).values():
            for i, c in enumerate(dict.fromkeys(sp.sample(rng) for _ in range(12))):
                rec = TuningRecord(task, target.key, "random:0", i, c, MeasureResult("ok", (1e-4 * (1 + i),)), 1.0)
                f.write(json.dumps(rec.to_json()) + "\n")
    data = load_dataset([path], min_records=4)
    assert data.tasks == (task.name,) and len(data) >= 12



def test_damaged_or_plain_dataset_files(tmp_path, capsys):
    # session 73: a bad line, a truncated gzip or a plain file named .gz were tracebacks (KeyError, EOFError,
    # BadGzipFile); a plain .jsonl (what Database.export_jsonl writes) was "not an SQLite file"; every read
    # left a temporary database copy behind
    import os
    import tempfile

    task = parse_spec(SHAPES[-1])
    target = fj.Target.cpu()
    cfg = next(iter(spaces_for(task, target).values())).default()
    good = json.dumps(TuningRecord(task, target.key, "r:0", 0, cfg, MeasureResult("ok", (1e-4,)), 1.0).to_json())
    bad = tmp_path / "bad.jsonl.gz"
    with gzip.open(bad, "wt") as f:
        f.write(good + "\n" + good.replace('"task"', '"tsak"') + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl.gz, line 2: not a tuning record \(KeyError"):
        load_dataset([bad], min_records=1)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(((good + "\n") * 50).encode())[:-20])
    with pytest.raises(ValueError, match="not a readable gzip-compressed JSON-lines dataset"):
        load_dataset([cut], min_records=1)
    plain = tmp_path / "plain.jsonl"
    plain.write_text(good + "\n")
    before = set(os.listdir(tempfile.gettempdir()))
    assert load_dataset([plain], min_records=1).tasks == (task.name,)
    assert not {f for f in set(os.listdir(tempfile.gettempdir())) - before if f.startswith("fj_pretrain_")}
    # a mistyped --exclude is said (the task it meant stays in the training data)
    load_dataset([plain], min_records=1, exclude=["no_such_task"], progress=True)
    assert "--exclude names no task in the databases: no_such_task" in capsys.readouterr().err


def test_a_holdout_share_never_holds_out_every_task():
    from felixjax.pretrain import split_tasks

    train, held = split_tasks([f"t{i}" for i in range(6)], holdout=0.95, seed=0)  # was: all 6 held out, a crash
    assert len(train) == 1 and len(held) == 5


def test_the_packaged_ensemble_loads_and_its_members_disagree_off_the_data():
    """The shipped ensemble (``pessimism``'s uncertainty) matches this feature set, its members rank
    held-out tasks above the prior (its own transfer check), and they agree more on configs of
    their dataset than on the same tasks' configs scrambled knob by knob."""
    import numpy as np

    from costmodels import Features
    from felixjax.model import PACKAGED_ENSEMBLE, load_ensemble

    ens = load_ensemble("packaged")
    assert len(ens.members) == 4 and load_ensemble(PACKAGED_ENSEMBLE) is ens
    report = json.loads(PACKAGED_ENSEMBLE.with_name(PACKAGED_ENSEMBLE.name + ".json").read_text())
    assert report["members"] == 4
    assert report["transfer_check"]["heldout_mlp_pairwise"] > report["transfer_check"]["heldout_prior_pairwise"]
    data = load_dataset([PACKAGED])
    rows = data.rows(list(data.tasks)[:2])
    f = data.features
    _, std_data = ens.predict_with_std(Features(f.access[rows], f.mask[rows], f.glob[rows]))
    rng = np.random.default_rng(0)
    g = f.glob[rows] * np.exp(rng.normal(scale=1.0, size=f.glob[rows].shape))  # features no config of the data has
    _, std_off = ens.predict_with_std(Features(f.access[rows], f.mask[rows], g))
    assert np.median(std_off) > 2 * np.median(std_data), (np.median(std_off), np.median(std_data))


def test_the_judge_checkpoint_is_its_own_model_of_the_second_machines_data():
    """``judge="judge"``: the MLP pretrained on the second machine's dataset matches this feature set, beats the
    prior on its held-out tasks, and is not the first model (errors of its own are its point)."""
    import numpy as np

    from felixjax.model import PACKAGED_JUDGE, resolve_judge

    judge, first = load_pretrained(resolve_judge("judge")), load_pretrained("packaged")
    report = json.loads(PACKAGED_JUDGE.with_name(PACKAGED_JUDGE.name + ".json").read_text())
    assert report["data"].endswith(PACKAGED_B.name)
    assert report["transfer_check"]["heldout_mlp_pairwise"] > report["transfer_check"]["heldout_prior_pairwise"]
    assert _packaged_rows(PACKAGED_B)[0]["provenance"]["target_key"] != _packaged_rows()[0]["provenance"]["target_key"]
    data = load_dataset([PACKAGED_B])
    rows = data.rows(list(data.tasks)[:2])
    f = data.features
    sub = Features(f.access[rows], f.mask[rows], f.glob[rows])
    assert not np.allclose(judge.predict(sub), first.predict(sub))


def test_auto_uses_the_shipped_model_only_at_the_simd_width_it_was_measured_at():
    # session 78 (a portability review): "auto" loaded the shipped model on any CPU target without a word, and
    # replayed landscapes of another machine's latencies cost 1.5-4x a cold start's trials to 95% of the best
    from felixjax.model import packaged_lanes, resolve_cost_model

    lanes, machine = packaged_lanes()
    assert lanes == 16 and machine == "AMD EPYC"  # from the shipped provenance's machine line
    assert resolve_cost_model("auto", fj.Target.cpu(simd_lanes=lanes)) == "packaged"
    with pytest.warns(RuntimeWarning, match="measured on a CPU with 16 fp32 SIMD lanes .AMD EPYC.; this target has 8"):
        assert resolve_cost_model("auto", fj.Target.cpu(simd_lanes=8, vector_registers=16)) is None
    assert resolve_cost_model("packaged", fj.Target.cpu(simd_lanes=8)) == "packaged"  # asked for by name: as given
