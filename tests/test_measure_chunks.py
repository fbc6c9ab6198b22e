"""Chunked builds in the Measurer (``build_chunk``: build k, measure them, build the next k) and the
ablation's memo passing each result on as it arrives, so an arm's clock reads per result, not per batch."""
import numpy as np
import pytest

import felixjax as fj
from benchmarks.ablation import Memo, _MemoRunner
from benchmarks.measure_chunks import random_batch
from codegen.run import ReplayRunner
from codegen.space import Space
from felixjax.measurer import Measurer

TARGET = fj.Target.cpu()
TASK = fj.ops.matmul(16, 16, 16)


class LoggingReplay(ReplayRunner):
    """A replay runner that logs its build and run calls in order."""

    def __init__(self):
        super().__init__(lambda source: 1e-6 * (1 + len(source) % 7))
        self.log: list = []

    def build(self, sources):
        self.log.append(("build", len(sources)))
        return super().build(sources)

    def run(self, request, *, build=None):
        self.log.append(("run",))
        return super().run(request, build=build)


def configs(n):
    sp = Space(TASK, "gemm_packed", TARGET)
    return list(dict.fromkeys([sp.default()] + sp.sample_many(np.random.default_rng(0), 3 * n)))[:n]


@pytest.mark.parametrize("chunk, builds", [(None, [5]), (2, [2, 2, 1]), (5, [5]), (9, [5])])
def test_builds_alternate_with_measurements_chunk_by_chunk(chunk, builds):
    runner = LoggingReplay()
    cfgs = configs(5)
    got = []
    Measurer(TASK, TARGET, runner, threads=1, build_chunk=chunk).measure(cfgs, lambda c, r: got.append(c) or True)
    assert got == cfgs
    expect = [e for b in builds for e in [("build", b)] + [("run",)] * b]
    assert runner.log == expect


def test_an_early_stop_builds_no_later_chunk():
    runner = LoggingReplay()
    got = []
    Measurer(TASK, TARGET, runner, threads=1, build_chunk=2).measure(configs(6), lambda c, r: got.append(c) and False)
    assert runner.log == [("build", 2), ("run",)] and len(got) == 1


def test_build_chunk_must_be_positive():
    with pytest.raises(ValueError, match="build_chunk"):
        Measurer(TASK, TARGET, LoggingReplay(), build_chunk=0)


class Inner:
    """A stand-in measurer: logs when each config is measured."""

    def __init__(self, log):
        self.log = log

    def measure(self, cfgs, on_result):
        for c in cfgs:
            self.log.append(("measured", c))
            if not on_result(c, f"res-{c}"):
                return


def test_memo_passes_each_result_on_as_it_arrives_in_batch_order():
    log: list = []
    memo = _MemoRunner(Inner(log), {"b": "cached-b"}, Memo())
    seen = []
    memo.measure(["a", "b", "c"], lambda c, r: log.append(("seen", c, r)) or True)
    assert log == [("measured", "a"), ("seen", "a", "res-a"), ("seen", "b", "cached-b"),
                   ("measured", "c"), ("seen", "c", "res-c")]
    assert memo.memo.hits == 1 and memo.memo.misses == 2
    # a hit at the head of the batch is passed on before anything is measured; a stop ends the measuring
    log.clear()
    memo.measure(["a", "d", "e"], lambda c, r: seen.append(c) or c != "d")
    assert log == [("measured", "d")] and seen == ["a", "d"] and "e" not in memo.cache


def test_random_batch_is_distinct_valid_and_seeded():
    a, b = random_batch(TASK, TARGET, 8, seed=3), random_batch(TASK, TARGET, 8, seed=3)
    assert a == b and len(set(a)) == 8
    spaces = {sk: Space(TASK, sk, TARGET) for sk in {c.sketch for c in a}}
    for c in a:
        spaces[c.sketch].validate(c)


def test_chunk_effect_reads_arrivals_and_one_bar_across_both_files(tmp_path):
    from benchmarks.chunk_effect import compare_files, tuning_runs

    head = "strategy,seed,task,phase,trial,elapsed_s,latency_s,best_so_far_s,status\n"

    def write(name, rows):
        p = tmp_path / name
        p.write_text(head + "".join(f"g,0,t,tune,{i},{s},{lat},{lat},ok\n" for i, (s, lat) in enumerate(rows)))
        return tuning_runs(p)

    # 32 results each; file a reaches the shared bar (95% of 1.0, the best of both) at 3 s, b never (its 20 s)
    a = write("a.csv", [(1.0, 1.2), (2.0, 2.0), (3.0, 1.0)] + [(3.0 + i, 2.0) for i in range(1, 30)])
    b = write("b.csv", [(5.0 + i / 2, 1.5) for i in range(30)] + [(19.0, 1.5), (20.0, 1.5)])
    row = compare_files(a, b)["g"]
    assert row["a_result1"] == 1.0 and row["b_result1"] == 5.0 and row["b_result32"] == 20.0
    assert row["a_to95"] == pytest.approx(3.0) and row["b_to95"] == pytest.approx(20.0)
    assert row["ratio"] == pytest.approx(20.0 / 3.0)


def test_round_clock_splits_each_round_at_its_first_result():
    from benchmarks.chunk_effect import round_clock

    # two rounds of 4: results at 1..4 s and 7..10 s; the second round's first result comes 3 s after the first's last
    runs = {("t", "g", "0"): [(i, s, 1.0) for i, s in enumerate([1.0, 2.0, 3.0, 4.0, 7.0, 8.0, 9.0, 10.0])],
            ("t", "g", "1"): [(i, s, 1.0) for i, s in enumerate([2.0, 2.5, 3.0, 3.5])]}  # one round, 2 s to its first
    first, rest = round_clock(runs, batch=4)["g"]
    assert first == pytest.approx((1.0 + 3.0 + 2.0) / 3) and rest == pytest.approx((3.0 + 3.0 + 1.5) / 3)
