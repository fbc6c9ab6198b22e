"""Search strategies on the synthetic oracle (no hardware): every registered strategy, then the
genetic search's mechanics (Ansor-faithful mutation, selection, seeding and eps-greedy picks)."""
import dataclasses
import math

import numpy as np
import pytest

import felixjax as fj
from codegen.measure import MeasureResult
from codegen.space import Space, sketches_for
from felixjax.database import TuningRecord
from felixjax.strategies import SearchContext, get_strategy, registered
from felixjax.strategies.genetic import CPU_MUTATION_WEIGHTS, GPU_MUTATION_WEIGHTS, MUTATIONS, Codec, GeneticSearch, selection_probs
from felixjax.testing import OracleScorer, SyntheticOracle

TARGET = fj.Target.cpu()
TASKS = [fj.ops.matmul(64, 48, 32), fj.ops.conv2d(1, 16, 14, 14, out_channels=32, kernel=3, padding=1)]
CONV = TASKS[1]
# small gradient rounds keep these search-logic tests quick (defaults are for real tuning)
OPTIONS = {"gradient": {"starts": 64, "steps": 16}}


def make_ctx(task, seed=0, history=()):
    spaces = {s.name: Space(task, s, TARGET) for s in sketches_for(task)}
    return SearchContext(task, TARGET, spaces, np.random.default_rng(seed), {r.config for r in history},
                         list(history))


def oracle_scorer(ctx):
    return OracleScorer(SyntheticOracle(ctx.task, ctx.target))


def records(task, configs, oracle, run="genetic:0"):
    return [TuningRecord(task, TARGET.key, run, i, c, MeasureResult("ok", (oracle(c),)), float(i))
            for i, c in enumerate(configs)]


# ----------------------------------------------------------------------------------------------
# Every registered strategy
# ----------------------------------------------------------------------------------------------

_RUNS: dict = {}


def replay_run(name, seed, trials=40, seconds=None):
    """One replayed comparison of a single strategy on both tasks (cached per arguments)."""
    key = (name, seed, trials, seconds)
    if key not in _RUNS:
        _RUNS[key] = fj.compare(TASKS, [name], trials=trials, seconds=seconds, seeds=[seed], db=None, replay=True,
                                progress=False, remeasure=0, strategy_options=OPTIONS)
    return _RUNS[key]


def test_registry_lists_only_strategies_that_register():
    names = registered()
    assert {"random", "genetic"} <= set(names)
    for name in names:
        assert get_strategy(name).name == name
    with pytest.raises(ValueError, match="unknown strategy"):
        get_strategy("annealing")


@pytest.mark.parametrize("name", registered())
def test_trial_budget_is_respected_and_every_config_is_valid_and_new(name):
    cmp = replay_run(name, 0)
    for task in TASKS:
        recs = cmp.histories[(task.name, name, 0)]
        assert len(recs) == 40 and [r.trial for r in recs] == list(range(40))
        assert len({r.config for r in recs}) == 40, "a config was proposed twice"
        spaces = {s.name: Space(task, s, TARGET) for s in sketches_for(task, TARGET)}  # padded variants too
        for r in recs:
            spaces[r.config.sketch].validate(r.config)
            assert r.ok


@pytest.mark.parametrize("name", registered())
def test_seconds_budget_is_respected(name):
    cmp = replay_run(name, 0, trials=100_000, seconds=3.0)  # replayed trials cost 0.3 simulated seconds
    for task in TASKS:
        recs = cmp.histories[(task.name, name, 0)]
        assert 1 <= len(recs) < 100_000
        assert all(r.elapsed_s < 3.0 for r in recs[:-1])  # the run stops at the first result past the budget
        assert recs[-1].elapsed_s >= 3.0 or len(recs) == 0


@pytest.mark.parametrize("name", registered())
def test_fixed_seed_reproduces_proposals(name):
    a = replay_run(name, 0)
    b = fj.compare(TASKS, [name], trials=40, seeds=[0], db=None, replay=True, progress=False, remeasure=0,
                   strategy_options=OPTIONS)
    c = replay_run(name, 1)
    for task in TASKS:
        key = (task.name, name, 0)
        assert [r.config for r in a.histories[key]] == [r.config for r in b.histories[key]]
        assert [r.config for r in a.histories[key]] != [r.config for r in c.histories[(task.name, name, 1)]]


@pytest.mark.parametrize("name", registered())
def test_propose_directly_gives_valid_distinct_unmeasured_configs(name):
    task = CONV
    ctx = make_ctx(task, seed=3)
    strat = get_strategy(name, **OPTIONS.get(name, {}))
    first = strat.propose(ctx, 16)
    oracle = SyntheticOracle(task)
    recs = records(task, first, oracle, run=f"{name}:3")
    ctx.history.extend(recs)
    ctx.measured.update(r.config for r in recs)
    strat.update(ctx, recs)
    second = strat.propose(ctx, 16)
    assert 0 < len(first) <= 16 and 0 < len(second) <= 16
    assert not set(second) & set(first)
    assert len(set(second)) == len(second)
    for c in first + second:
        ctx.spaces[c.sketch].validate(c)


# ----------------------------------------------------------------------------------------------
# Genetic search mechanics
# ----------------------------------------------------------------------------------------------

def _binomial_ok(observed, n, p, z=5.0):
    return abs(observed - n * p) <= z * math.sqrt(n * p * (1 - p)) + 1


@pytest.mark.parametrize("weights", [None, {"tile": 0.25, "unroll": 0.25, "parallel": 0.25, "vec": 0.25},
                                     {"tile": 0.5, "unroll": 0.0, "parallel": 0.3, "vec": 0.2}])
def test_mutation_kinds_occur_at_their_configured_frequencies(weights):
    g = GeneticSearch(population=20_000, mutation_weights=weights)
    ctx = make_ctx(CONV)
    codec = g.codec(ctx)
    rng = np.random.default_rng(0)
    pop = codec.sample(rng, 2000)
    g.evolve(codec, pop, np.zeros(len(pop)), rng)
    st = g.stats
    attempts = sum(st["attempted"].values()) + st["copied"]
    assert _binomial_ok(st["copied"], attempts, 1 - 0.85)
    mutated = sum(st["attempted"].values())
    want = CPU_MUTATION_WEIGHTS if weights is None else weights
    for kind in MUTATIONS:
        assert _binomial_ok(st["attempted"][kind], mutated, want[kind]), (kind, st["attempted"])
    if weights is None:  # Ansor's CPU weights: tile-size mutation dominates
        assert st["attempted"]["tile"] > 0.85 * mutated


def test_each_mutation_changes_only_its_knob_and_stays_valid():
    g = GeneticSearch(population=4000, mutation_weights={k: 0.25 for k in MUTATIONS})
    ctx = make_ctx(CONV)
    codec = g.codec(ctx)
    rng = np.random.default_rng(1)
    pop = codec.sample(rng, 500)
    kids, info = g.evolve(codec, pop, np.zeros(len(pop)), rng)
    parents = pop[info["parent"]]
    assert codec.valid(kids).all()
    for cfg in codec.decode_many(kids[:300]):
        ctx.spaces[cfg.sketch].validate(cfg)
    t_kid, t_par = codec.tiles(kids), codec.tiles(parents)
    tiles_changed = (t_kid != t_par).any(axis=2)  # (children, axes)
    cols = {"unroll": codec.c_unroll, "parallel": codec.c_par, "vec": codec.c_vec}
    for k, kind in enumerate(MUTATIONS):
        sel = info["kind"] == k
        assert sel.sum() > 100
        if kind == "tile":
            # one axis changed: a divisor moved from one level to another, the product kept
            assert (tiles_changed[sel].sum(axis=1) == 1).all()
            moved = (t_kid[sel] != t_par[sel]).sum(axis=2).max(axis=1)
            assert (moved == 2).all()
            assert (np.prod(t_kid[sel], axis=2) == np.prod(t_par[sel], axis=2)).all()
            assert (kids[sel][:, -3:] == parents[sel][:, -3:]).all()
        else:
            assert not tiles_changed[sel].any()
            assert (kids[sel][:, cols[kind]] != parents[sel][:, cols[kind]]).all()
            others = [c for n, c in cols.items() if n != kind]
            assert (kids[sel][:, others] == parents[sel][:, others]).all()
    copies = info["kind"] == -1
    assert (kids[copies] == parents[copies]).all()


def _evolved(task, target, seed=0, n=3000):
    from codegen.spaces import spaces_for
    g = GeneticSearch(population=n)
    codec = Codec(spaces_for(task, target))
    rng = np.random.default_rng(seed)
    pop = codec.sample(rng, 1000)
    kids, info = g.evolve(codec, pop, np.zeros(len(pop)), rng)
    return g, codec, pop[info["parent"]], kids, info


def test_every_mutated_child_differs_from_its_parent_where_a_knob_applies_to_some_sketches_only():
    # a depthwise conv's dw_stage knob applies to some of its sketches: rows of the others never draw it
    task = fj.ops.depthwise_conv2d(1, 32, 28, 28, kernel=3, padding=1)
    g, codec, parents, kids, info = _evolved(task, TARGET)
    assert "dw_stage" in [k.name for k in codec.knobs]
    mutated = info["kind"] >= 0
    assert mutated.sum() > 2000
    assert (kids[mutated] != parents[mutated]).any(axis=1).all()  # no mutation is a silent copy
    assert g.stats["attempted"]["dw_stage"] > 0
    # among the rows of sketches every kind applies to, tile keeps Ansor's share
    full = codec.mutable_kinds(g.kinds)[parents[:, 0]].sum(axis=1) == codec.mutable_kinds(g.kinds).sum(axis=1).max()
    tile = g.kinds.index("tile")
    assert full.any() and not full.all()
    rows = mutated & ~full  # rows of sketches without dw_stage: Ansor's CPU shares, no knob diluting them
    assert _binomial_ok(int((info["kind"][rows] == tile).sum()), int(rows.sum()), CPU_MUTATION_WEIGHTS["tile"])


@pytest.mark.parametrize("weights, why", [({"tile": math.inf}, "finite and >= 0"), ({"tile": math.nan}, "finite"),
                                          ({"tile": -1.0}, ">= 0"), ({"tile": 0.0}, "a positive weight for one of")])
def test_mutation_weights_that_would_switch_mutation_off_are_errors(weights, why):
    # session 76: inf gave NaN weights, {"tile": 0} left only knobs no dense sketch has: no child mutated
    with pytest.raises(ValueError, match=why):
        GeneticSearch(mutation_weights=weights)


def test_gpu_targets_mutate_by_ansors_gpu_weights():
    g, _, parents, kids, info = _evolved(fj.ops.matmul(256, 256, 256), fj.Target.parse("cuda-sim:a100"))
    mutated = info["kind"] >= 0
    drawn = {g.kinds[k]: int((info["kind"] == k).sum()) for k in np.unique(info["kind"][mutated])}
    assert set(drawn) == {"tile", "unroll"}, drawn  # vec has one value on a GPU; staging is no mutation
    assert _binomial_ok(drawn["unroll"], int(mutated.sum()), GPU_MUTATION_WEIGHTS["unroll"])
    assert (kids[mutated] != parents[mutated]).any(axis=1).all()


def test_three_of_sixty_four_picks_are_random_and_the_rest_the_best_predicted():
    g = GeneticSearch(population=512, scorer=oracle_scorer)
    ctx = make_ctx(CONV)
    out = g.propose(ctx, 64)
    lr = g.last_round
    assert len(out) == 64 and len(set(out)) == 64
    assert len(lr["random"]) == 3 and len(lr["good"]) == 61
    assert out == lr["good"] + lr["random"]
    # the 61 are the best predicted of every distinct unmeasured config scored in the round
    assert lr["good"] == [c for _, c in lr["heap"][:61]]
    assert len(lr["heap"]) == 128  # the heap keeps the best 2 x 64
    # the 3 are random samples of the initial population, not among the 61
    init = set(lr["codec"].decode_many(lr["init_random"]))
    assert set(lr["random"]) <= init and not set(lr["random"]) & set(lr["good"])
    assert len(GeneticSearch(population=128).propose(make_ctx(CONV), 20)) == 20  # int(0.05 * 20) = 1 random
    g2 = GeneticSearch(population=128)
    g2.propose(make_ctx(CONV), 20)
    assert len(g2.last_round["random"]) == 1


def test_top_twenty_percent_measured_seed_the_population():
    task = CONV
    oracle = SyntheticOracle(task)
    ctx = make_ctx(task)
    measured = list(dict.fromkeys(Codec(ctx.spaces).decode_many(Codec(ctx.spaces).sample(np.random.default_rng(5),
                                                                                              300))))
    hist = records(task, measured, oracle)
    hist.append(TuningRecord(task, TARGET.key, "genetic:0", len(hist), measured[0], MeasureResult("timeout"), 0.0))
    ctx = make_ctx(task, history=hist)
    g = GeneticSearch(population=500, generations=1)
    g.propose(ctx, 64)
    seeds = g.last_round["seeds"]
    k = int(0.2 * 500)
    best = sorted(measured, key=oracle)[:k]
    assert seeds == best
    # the initial population: those seeds, then random samples that were never measured
    assert len(g.last_round["scores_by_generation"][0]) == 500
    randoms = set(g.last_round["codec"].decode_many(g.last_round["init_random"]))
    assert not randoms & set(measured)
    # with few measurements, all the (correct) ones seed it
    ctx_few = make_ctx(task, history=hist[:30])
    g.propose(ctx_few, 64)
    assert g.last_round["seeds"] == sorted(measured[:30], key=oracle)


def test_selection_prefers_higher_predicted_throughput():
    s = np.log([1.0, 2.0, 4.0, 8.0])  # predicted -log latency: throughputs 1 : 2 : 4 : 8
    np.testing.assert_allclose(selection_probs(s), [1 / 15, 2 / 15, 4 / 15, 8 / 15])
    np.testing.assert_allclose(selection_probs(s + 100.0), selection_probs(s))  # only differences matter
    np.testing.assert_allclose(selection_probs(np.array([-np.inf, np.nan, 0.0])), [0, 0, 1])
    # roulette draws parents in those proportions
    g = GeneticSearch(population=30_000, mutation_prob=0.0)
    codec = g.codec(make_ctx(CONV))
    pop = codec.sample(np.random.default_rng(0), 4)
    _, info = g.evolve(codec, pop, s, np.random.default_rng(1))
    counts = np.bincount(info["parent"], minlength=4)
    for c, p in zip(counts, [1 / 15, 2 / 15, 4 / 15, 8 / 15]):
        assert _binomial_ok(c, 30_000, p)
    # over generations the population's predicted throughput rises
    g = GeneticSearch(population=1024, scorer=oracle_scorer)
    ctx = make_ctx(CONV)
    out = g.propose(ctx, 64)
    gens = g.last_round["scores_by_generation"]
    assert np.mean(gens[-1]) > np.mean(gens[0]) + 0.5
    oracle = SyntheticOracle(CONV)
    random_lat = np.median(oracle.latencies(get_strategy("random").propose(make_ctx(CONV, seed=9), 64)))
    assert np.median(oracle.latencies(out[:61])) < random_lat / 3


def test_scorer_factory_wiring(monkeypatch):
    import felixjax.model as model

    class Fixed:
        def score(self, configs):
            return np.zeros(len(configs))

        def update(self, records):
            self.seen = len(records)

    ctx = make_ctx(TASKS[0])
    monkeypatch.setattr(model, "make_scorer", lambda c: Fixed(), raising=False)
    # no scorer option: the context's scorer (outside a session, a model of its own via make_scorer(ctx))
    assert isinstance(GeneticSearch().scorer(ctx), Fixed)
    assert GeneticSearch().scorer(ctx) is GeneticSearch().scorer(ctx)  # built once per context
    # a session's context hands out its shared model's view of the task instead
    shared = Fixed()
    ctx2 = make_ctx(TASKS[1])
    ctx2.scorer_factory = lambda c: shared
    assert GeneticSearch().scorer(ctx2) is shared
    sc = Fixed()
    g = GeneticSearch(scorer=sc)
    assert g.scorer(ctx) is sc
    g.update(ctx, [1, 2])
    assert sc.seen == 2
    assert isinstance(GeneticSearch(scorer=lambda c: Fixed()).scorer(ctx), Fixed)


def test_codec_matches_the_space():
    ctx = make_ctx(CONV)
    codec = Codec(ctx.spaces)
    rng = np.random.default_rng(0)
    raw = np.concatenate([codec._draw(rng, sk, 400) for sk in range(len(codec.sketches))])
    for row, ok, cfg in zip(raw, codec.valid(raw), codec.decode_many(raw)):
        assert ok == ctx.spaces[cfg.sketch].is_valid(cfg)
    rows = codec.sample(rng, 300)
    cfgs = codec.decode_many(rows)
    assert (codec.encode_many(cfgs) == rows).all()
    assert codec.rows(codec.keys(rows)).tolist() == rows.tolist()
    tiny = fj.ops.matmul(4, 8, 4)
    sp = {s.name: Space(tiny, s, TARGET) for s in sketches_for(tiny)}
    enumerated = {c for rows in Codec(sp).enumerate() for c in Codec(sp).decode_many(rows)}
    assert enumerated == set(sp["gemm_packed"].enumerate())


def test_genetic_round_is_fast_enough_to_profile():
    """Not a timing verdict: the stats say where a round's time goes."""
    g = GeneticSearch()
    g.propose(make_ctx(CONV), 64)
    assert g.stats["rounds"] == 1 and g.stats["scored"] > 2048
    assert set(g.stats) >= {"sample_s", "evolve_s", "score_s", "pick_s", "propose_s"}


def test_strategy_options_are_checked():
    """Session 72: an unknown option was a raw TypeError ("RandomSearch() takes no arguments"), options given with a
    strategy instance were dropped silently, and a batch of 0 or less gave an empty run with no error."""
    import felixjax as fj
    from felixjax.strategies import get_strategy
    from felixjax.strategies.gradient import GradientSearch

    with pytest.raises(ValueError, match="has no option 'bogus'"):
        get_strategy("gradient", bogus=1)
    assert get_strategy("random", batch_size=8).batch_size == 8  # its class attribute, as random@8 sets it
    with pytest.raises(ValueError, match="has no option 'bogus'; its options: batch_size"):
        get_strategy("random", bogus=8)
    for bad in (-3, 2.5, "8", True):  # 2.5 ran at 2
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
            get_strategy("genetic", batch_size=bad)
    with pytest.raises(ValueError, match="set them on the GradientSearch instance"):
        get_strategy(GradientSearch(), batch_size=4)
    assert get_strategy("gradient", batch_size=8).batch_size == 8
    with pytest.raises(ValueError, match="batch must be >= 1"):
        fj.tune(fj.ops.matmul(8, 8, 8), strategy="random", trials=2, batch=-1, progress=False)


def test_a_user_strategys_mistakes_are_named():
    # session 75 (a user's review): register("alpha") on a class named "beta" stored its runs as beta:0,
    # register("random") silently replaced the built-in, and a strategy returning None, dicts or an invalid config
    # failed with "'NoneType' object is not iterable", "unhashable type: 'dict'" or a bare tile-size message
    from felixjax.strategies import register
    from felixjax.strategies.base import _REGISTRY
    from felixjax.testing import ReplayRunner

    with pytest.raises(ValueError, match="register\\('alpha'\\) on Beta, whose name is 'beta'"):
        register("alpha")(type("Beta", (), {"name": "beta"}))
    with pytest.raises(ValueError, match="'random' is a built-in strategy; register\\(..., replace=True\\)"):
        register("random")(type("Mine", (), {"name": "random"}))
    assert "alpha" not in _REGISTRY and _REGISTRY["random"].__module__ == "felixjax.strategies.random"
    register("nameless_s75")(type("Nameless", (), {}))
    try:
        with pytest.raises(TypeError, match="strategy 'nameless_s75' .Nameless. has no name: give the class name ="):
            get_strategy("nameless_s75")
    finally:
        _REGISTRY.pop("nameless_s75", None)

    class Broken:
        name, batch_size = "broken", 4

        def __init__(self, out):
            self.out = out

        def propose(self, ctx, n):
            return self.out(ctx)

        def update(self, ctx, records):
            pass

    def bad_tiles(ctx):
        return [dataclasses.replace(ctx.spaces[min(ctx.spaces)].sample(ctx.rng), tiles=((3, 3),))]

    for out, err, msg in ((lambda ctx: None, TypeError, "strategy 'broken': propose\\(\\) returned NoneType"),
                          (lambda ctx: [{"tiles": 1}], TypeError, "returned a dict .* codegen.space.Config objects"),
                          (bad_tiles, ValueError, "strategy 'broken' proposed an invalid config for matmul")):
        with pytest.raises(err, match=msg):
            fj.tune(TASKS[0], strategy=Broken(out), trials=8, progress=False, retime=0, defaults=False,
                    measurer=lambda t, tg: ReplayRunner.from_oracle(t, tg))


@pytest.mark.parametrize("name, options, message", [
    ("genetic", {"eps_greedy": 1.5}, "eps_greedy must be in \\[0, 1\\]"),  # 96 of 64 proposed, none random
    ("genetic", {"eps_greedy": -0.5}, "eps_greedy must be in"),
    ("genetic", {"measured_ratio": -1.0}, "measured_ratio must be in"),  # seeded 192 measured configs, not 12
    ("genetic", {"max_fail": -1}, "max_fail must be an integer >= 0"),  # a crash in numpy's concatenate
    ("genetic", {"population": "64"}, "population must be an integer >= 1"),  # a TypeError
    ("genetic", {"population": 64.7}, "population must be an integer >= 1"),  # truncated to 64
    ("genetic", {"min_unmeasured": -5}, "min_unmeasured must be an integer >= 0"),
    ("gradient", {"trust_radius": -1.0}, "trust_radius must be > 0"),
    ("gradient", {"local_of": -3}, "local_of >= 0"),
    ("gradient", {"ensemble_members": 0}, "ensemble_members must be an integer >= 1"),  # failed at its first fit
])
def test_options_outside_their_range_are_refused(name, options, message):
    """Session 82, a review of the baselines: each was accepted and ran as something else, or crashed later."""
    with pytest.raises(ValueError, match=message):
        get_strategy(name, **options)


def test_gradient_harvest_every_past_the_steps_keeps_the_last_step():
    # session 82: steps=1 (harvest_every 2) was an IndexError in the first round
    from felixjax.testing import ReplayRunner

    res = fj.tune(fj.ops.matmul(16, 16, 16), strategy="gradient", trials=8, progress=False, retime=0,
                  strategy_options={"steps": 1, "starts": 4}, measurer=lambda t, tg: ReplayRunner.from_oracle(t, tg))
    assert len(res.history) == 8 and len({r.config for r in res.history}) == 8


def test_random_search_measures_every_config_of_a_small_space_before_it_says_exhausted():
    """Session 82: with 3 of matmul(2, 2, 2)'s 896 configs left, 50 rounds of rejection sampling missed them
    about 7% of the time and the run ended 'exhausted' short of the space."""
    from felixjax.testing import ReplayRunner

    task = fj.ops.matmul(2, 2, 2)
    size = len({c for sk in sketches_for(task) for c in Space(task, sk, TARGET).enumerate()})
    res = fj.tune(task, strategy="random", trials=size + 100, seed=1, progress=False, retime=0,
                  measurer=lambda t, tg: ReplayRunner.from_oracle(t, tg))
    assert len(res.history) == len({r.config for r in res.history}) == size


def test_a_user_strategy_registered_before_the_built_ins_load_is_kept(tmp_path):
    """Session 82: `import felixjax` loads the built-in 'random' lazily; a user's register("random") before that
    was accepted without replace=True, then overwritten (even with replace=True) when the built-in loaded."""
    import os
    import subprocess
    import sys

    code = """
import felixjax as fj
from felixjax.strategies import get_strategy, register
class Mine:
    name, batch_size = "random", 4
    def propose(self, ctx, n): return []
    def update(self, ctx, records): pass
try:
    register("random")(Mine)
    print("accepted")
except ValueError as e:
    print("refused:", e)
register("random", replace=True)(Mine)
print(type(get_strategy("random")).__module__)
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True,
                         env={**os.environ, "PYTHONPATH": root}).stdout.split("\n")
    assert out[0].startswith("refused: 'random' is a built-in strategy") and out[1] == "__main__", out


def test_whole_number_floats_are_ints_and_options_reach_a_constructor_taking_them_all():
    """A code review: gradient kept steps=4.0 a float (a TypeError mid-run); batch_size=inf an OverflowError; a
    user strategy with **options no longer saw batch_size in its constructor."""
    from felixjax.strategies import register
    from felixjax.strategies.base import _REGISTRY

    g = get_strategy("gradient", steps=4.0, batch_size=8.0)
    assert (g.steps, g.batch_size) == (4, 8) and isinstance(g.steps, int) and isinstance(g.batch_size, int)
    for bad in (math.inf, math.nan):
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
            get_strategy("genetic", batch_size=bad)

    @register("kwuser_s82")
    class KwUser:
        name, batch_size = "kwuser_s82", 16

        def __init__(self, **opts):
            self.seen = dict(opts)

        def propose(self, ctx, n):
            return []

        def update(self, ctx, records):
            pass

    try:
        assert get_strategy("kwuser_s82", batch_size=8, other=1).seen == {"batch_size": 8, "other": 1}
    finally:
        _REGISTRY.pop("kwuser_s82", None)
