"""``benchmarks/compare.py --summarize --db ...``: the finished ops of several comparison databases (or
their JSONL exports) pooled into one table and one geomean, as issue 15's halves are judged over both
suites (replay oracle only)."""
import gzip
import shutil
import sys
from pathlib import Path

import pytest

import felixjax as fj
from felixjax.compare import from_database
from felixjax.strategies.genetic import GeneticSearch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import compare as script  # noqa: E402

A, B = fj.ops.matmul(64, 48, 32), fj.ops.matmul(32, 32, 24)
OPS = "matmul:m=64;n=48;k=32,matmul:m=32;n=32;k=24"
KW = dict(trials=12, seeds=2, replay=True, progress=False, remeasure=2, defaults=False, reference=True)
STRATS = ["genetic", "random"]


def small_genetic():
    return GeneticSearch(population=128, batch_size=8)


def _summarize(tmp_path, *dbs):
    argv = ["--summarize", "--replay", "--ops", OPS, "--strategies", ",".join(STRATS), "--seeds", "2",
            "--trials", "12", "--out", str(tmp_path / "out")]
    for db in dbs:
        argv += ["--db", str(db)]
    return script.main(argv)


def test_summarize_pools_the_finished_ops_of_several_databases(tmp_path, capsys):
    fj.compare([A], [small_genetic, "random"], db=str(tmp_path / "a.db"), **KW)
    fj.compare([B], [small_genetic, "random"], db=str(tmp_path / "b.db"), **KW)
    # the second as docs/data ships it: a gzipped JSONL export
    with fj.Database(tmp_path / "b.db", readonly=True) as db:
        db.export_jsonl(tmp_path / "b.jsonl")
    with open(tmp_path / "b.jsonl", "rb") as src, gzip.open(tmp_path / "b.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)

    assert _summarize(tmp_path, tmp_path / "a.db") == 0
    alone = capsys.readouterr().out
    assert "1 of 2 op(s) finished" in alone and f"not yet: {B.name}" in alone

    assert _summarize(tmp_path, tmp_path / "a.db", tmp_path / "b.jsonl.gz") == 0
    pooled = capsys.readouterr().out
    assert pooled.startswith("Comparison pooled from") and "2 of 2 op(s) finished." in pooled
    assert "Geomean over 2 task(s)" in pooled and "not yet" not in pooled
    # each op's rows are those its own database gives
    for task, db in ((A, "a.db"), (B, "b.db")):
        own, _ = from_database(tmp_path / db, [task], STRATS, [0, 1], 12, replay=True, defaults=False)
        for row in own.rows():
            line = f"| {row['task']} | {row['strategy']} | {row['final_ms']:.4g} |"
            assert line in pooled
    assert (tmp_path / "out" / "curves_partial.png").exists()


def test_db_needs_summarize_and_one_half(tmp_path):
    with pytest.raises(SystemExit):
        script.parse_args(["--db", str(tmp_path / "x.db")])
    with pytest.raises(SystemExit):
        script.parse_args(["--summarize", "--defaults", "both", "--db", str(tmp_path / "x.db")])
    assert _summarize(tmp_path, tmp_path / "missing.db") == 1
