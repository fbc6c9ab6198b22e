"""``benchmarks/search_overhead.py``'s trace: every run's configs in trial order, compared across checkouts
(a speed-up of the search that should leave its proposals as they were is checked with it)."""
import felixjax as fj
from benchmarks.search_overhead import same_picks, trace_of


def test_a_trace_lists_each_runs_configs_and_the_same_seed_repeats_it():
    task = fj.ops.matmul(16, 16, 16)
    runs = [fj.compare([task], ["random"], trials=12, seeds=[s], db=None, replay=True, progress=False, remeasure=0,
                       defaults=False) for s in (0, 0, 1)]
    a, again, other = (trace_of(c) for c in runs)
    (key, configs), = a.items()
    assert key == f"{task.name}|random|0" and len(configs) == 12 and len(set(configs)) == 12
    assert same_picks(a, again) == {"runs": 1, "identical": 1, "first_difference": {}, "only_one_side": []}
    moved = {key: configs[:5] + [configs[6], configs[5]] + configs[7:]}  # two picks swapped from trial 5
    assert same_picks(moved, a)["first_difference"] == {key: 5}
    assert same_picks(a, {key: configs[:8]}) == {"runs": 1, "identical": 0, "first_difference": {key: 8},
                                                 "only_one_side": []}  # a shorter run differs where it ends
    cross = same_picks(a, other)
    assert cross["runs"] == 0 and cross["only_one_side"] == sorted([key, f"{task.name}|random|1"])
