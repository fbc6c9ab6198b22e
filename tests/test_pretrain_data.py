"""The packaged pretraining dataset's format and rules (benchmarks/make_pretrain_dataset.py): shapes
disjoint from both evaluation suites; provenance first; records load into a database pretrain reads."""
import gzip
import json

import pytest

import felixjax as fj
from benchmarks.make_pretrain_dataset import SHAPES, check_disjoint
from codegen.measure import MeasureResult
from codegen.ops import parse_spec
from codegen.spaces import spaces_for
from felixjax.database import TuningRecord
from felixjax.pretrain import packaged_database
from felixjax.suites import SUITES, suite


def test_shapes_are_disjoint_from_the_evaluation_suites():
    tasks = [parse_spec(s) for s in SHAPES]
    held = {t.key for name in ("ops", "fresh") for t in suite(name)}
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
