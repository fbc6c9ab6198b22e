"""Walkthrough "add a knob" (docs/ARCHITECTURE.md), done once: a test-only knob declared in this file.

``prefetch``: on ``gemm_packed``, prefetch the packed weight row ``distance`` iterations ahead in the
reduction (``R1``) loop (``__builtin_prefetch``; a hint, semantics-preserving), distance in
{0, 1, 2, 4}, default 0, relaxed by its index in that domain, with one feature ``log2(1 + distance)``.
Its declaration below (domain, default, relaxation, lowering, features, mutation weight) is all it
takes: the space, the relaxation, the features and the extractor, the genetic codec, the three
strategies through ``fj.tune``, the database and the renderer pick it up from the registry.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest

import felixjax as fj
from codegen.build import build
from codegen.knobs import Knob, add_hook, feature_slots, knob_slot, register_knob, unregister_knob
from codegen.lower import lower
from codegen.measure import check_output
from codegen.ops import conv2d, matmul
from codegen.renderers.c import render
from codegen.runtime import Kernel
from codegen.space import Config, Space, sketches_for
from codegen.target import Target
from felixjax.database import Database
from felixjax.extract import extract
from felixjax.features import GLOBAL_FEATURES, batch_features, feature_inputs, features
from felixjax.relax import I_EXTRA, Relaxation
from felixjax.smooth import Smooth
from felixjax.strategies import SearchContext
from felixjax.strategies.genetic import GeneticSearch
from felixjax.testing import ReplayRunner

# ---- the declaration: everything about the knob, side by side -------------------------------------


def _prefetch_line(distance: int):
    def emit(site) -> list[str]:
        """``__builtin_prefetch`` of the weight row ``distance`` iterations of the innermost R1 loop ahead."""
        w = site.plan.buffers["weight"]
        if not site.loops or not w.stride(site.loops[-1].var):
            return []
        now = " + ".join(f"{w.stride(lp.var)}*{lp.var}" for lp in site.loops if w.stride(lp.var))
        ahead = distance * w.stride(site.loops[-1].var)
        return [f"__builtin_prefetch({site.pointers['weight']} + {now} + {ahead}, 0, 3);"]
    return emit


PREFETCH = Knob(
    name="prefetch",
    sketches=("gemm_packed",),
    domain=(0, 1, 2, 4),
    default=0,
    relax="index",
    lower=lambda plan, d: plan if d == 0 else add_hook(plan, "r1_body", _prefetch_line(d), "prefetch"),
    features=lambda xp, d, info: {"prefetch_log2": xp.log2(1.0 + d)},
    feature_names=("prefetch_log2",),
    mutation_weight=0.05,
)

# ---- the checks ------------------------------------------------------------------------------------

TARGET = Target(cores=2, simd_lanes=8, vector_registers=16, l1d_bytes=32 * 1024, l2_bytes=1 << 20,
                l3_bytes=4 << 20)
TASK = matmul(24, 32, 40)


@pytest.fixture
def knob():
    register_knob(PREFETCH)
    try:
        yield PREFETCH
    finally:
        unregister_knob(PREFETCH)


def _space() -> Space:
    return Space(TASK, "gemm_packed", TARGET)


def test_space_samples_validates_and_enumerates_it(knob):
    sp = _space()
    assert sp.knobs == (knob,)
    seen = {c.knob("prefetch", 0) for c in sp.sample_many(np.random.default_rng(0), 64)}
    assert seen == {0, 1, 2, 4}
    assert sp.default().extra == ()  # at its default the knob stays out of the config (and its key)
    cfg = sp.with_knobs(sp.default(), {"prefetch": 2})
    sp.validate(cfg)
    assert '"extra":{"prefetch":2}' in cfg.dumps()
    with pytest.raises(ValueError, match="prefetch=3"):
        sp.validate(Config(cfg.sketch, cfg.tiles, cfg.parallel, cfg.vec, cfg.unroll, (("prefetch", 3),)))
    conv = Space(conv2d(1, 4, 6, 6, out_channels=8, padding=1), "conv_direct", TARGET)
    assert conv.knobs == ()
    d = conv.default()
    with pytest.raises(ValueError, match="prefetch"):
        conv.validate(Config(d.sketch, d.tiles, d.parallel, d.vec, d.unroll, (("prefetch", 1),)))


def test_relaxation_round_trips_and_rounds_to_valid_configs(knob):
    sp = _space()
    rel = Relaxation(sp)
    cfgs = sp.sample_many(np.random.default_rng(1), 40)
    for c in cfgs:
        x = rel.to_x(c)
        assert x[I_EXTRA + knob_slot("prefetch")] == (0, 1, 2, 4).index(c.knob("prefetch", 0))
        assert rel.from_x(x) == c
    rounded = rel.round_x(rel.sample_x(jax.random.PRNGKey(0), 256))
    assert all(sp.is_valid(c) for c in rounded)
    assert {c.knob("prefetch", 0) for c in rounded} == {0, 1, 2, 4}
    nb = rel.neighbours(sp.default())
    assert sp.with_knobs(sp.default(), {"prefetch": 1}) in nb and all(sp.is_valid(c) for c in nb)


def test_hard_features_include_it_and_equal_the_extractor(knob):
    sp = _space()
    rel = Relaxation(sp)
    cfgs = sp.sample_many(np.random.default_rng(2), 15) + [sp.with_knobs(sp.default(), {"prefetch": 4})]
    hard = batch_features(feature_inputs(rel), np.stack([rel.to_x(c) for c in cfgs]), Smooth.hard_mode())
    col = GLOBAL_FEATURES.index(f"knob_{feature_slots('prefetch')[0]}")
    for b, c in enumerate(cfgs):
        ref = extract(sp, c)
        np.testing.assert_allclose(np.asarray(hard.glob[b]), ref.glob, atol=1e-5, rtol=0, err_msg=str(c))
        np.testing.assert_allclose(np.asarray(hard.access[b]) * ref.mask[:, None], ref.access * ref.mask[:, None],
                                   atol=1e-5, rtol=0)
        assert float(hard.glob[b, col]) == pytest.approx(np.log1p(np.log2(1 + c.knob("prefetch", 0))), abs=1e-6)
    # where the knob does not apply its feature slot is zero
    conv = Space(conv2d(1, 4, 6, 6, out_channels=8, padding=1), "conv_direct", TARGET)
    assert float(extract(conv, conv.default()).glob[col]) == 0.0


def test_soft_features_are_differentiable_in_it(knob):
    sp = _space()
    rel = Relaxation(sp)
    i = I_EXTRA + knob_slot("prefetch")
    col = GLOBAL_FEATURES.index(f"knob_{feature_slots('prefetch')[0]}")
    x = jax.numpy.asarray(rel.to_x(sp.default())).at[i].set(1.5)  # between distances 1 and 2
    g = jax.jit(jax.grad(lambda v: features(feature_inputs(rel), v, Smooth.soft(1.0)).glob[col]))(x)
    assert np.isfinite(np.asarray(g)).all() and float(g[i]) > 0 and float(np.abs(np.delete(g, i)).max()) == 0.0


def test_genetic_mutates_it(knob):
    spaces = {s.name: Space(TASK, s, TARGET) for s in sketches_for(TASK)}
    g = GeneticSearch(population=2000)
    assert "prefetch" in g.kinds and g.mutation_weights["prefetch"] > 0
    codec = g.codec(SearchContext(TASK, TARGET, spaces, np.random.default_rng(0)))
    rng = np.random.default_rng(3)
    pop = codec.sample(rng, 300)
    kids = codec.mutate(pop, "prefetch", rng)
    col = codec.c_extra + [k.name for k in codec.knobs].index("prefetch")
    assert (kids[:, col] != pop[:, col]).all() and codec.valid(kids).all()
    cfgs = codec.decode_many(kids)
    assert (codec.encode_many(cfgs) == kids).all()
    for c in cfgs:
        spaces[c.sketch].validate(c)
    g.evolve(codec, pop, np.zeros(len(pop)), rng)
    assert g.stats["attempted"]["prefetch"] > 0


# gradient: stats=False skips the rounding statistics (same proposals; tests/test_gradient_levers.py checks them)
@pytest.mark.parametrize("strategy,options", [("random", {}), ("genetic", {"population": 256}),
                                              ("gradient", {"starts": 8, "steps": 4, "stats": False})])
def test_tuning_proposes_configs_with_it(knob, strategy, options):
    res = fj.tune(TASK, TARGET, strategy=strategy, trials=24, progress=False, retime=0, strategy_options=options,
                  measurer=lambda t, tg: ReplayRunner.from_oracle(t, tg))
    values = {r.config.knob("prefetch", 0) for r in res.history}
    assert len(res.history) == 24 and len(values - {0}) >= 1, values


def test_database_round_trips_a_config_carrying_it(knob, tmp_path):
    sp = _space()
    cfg = sp.with_knobs(sp.default(), {"prefetch": 4})
    assert Config.from_json(cfg.dumps()) == cfg and Config.from_json(sp.default().dumps()) == sp.default()
    res = fj.tune(TASK, TARGET, strategy="random", trials=8, progress=False, retime=0, db=str(tmp_path / "t.db"),
                  measurer=lambda t, tg: ReplayRunner.from_oracle(t, tg))
    with Database(str(tmp_path / "t.db"), readonly=True) as db:
        stored = {r.config for r in db.records(task=TASK)}
    assert stored == {r.config for r in res.history}
    assert any(c.knob("prefetch") for c in stored)


@pytest.mark.cc
def test_rendered_source_changes_with_it_and_the_kernel_matches_numpy(knob):
    sp = _space()
    base = sp.default()
    sources = {}
    for d in (0, 2):
        cfg = sp.with_knobs(base, {"prefetch": d})
        plan = lower(sp, cfg)
        sources[d] = render(plan)
        b = build(sources[d])
        assert b.status == "ok", b.error
        arrays = TASK.random_inputs(seed=4)
        ok, msg = check_output(Kernel(plan, b.lib_path, threads=1)(*arrays), TASK.reference(*arrays),
                               plan.con.reduction_size)
        assert ok, msg
    assert "__builtin_prefetch" not in sources[0] and "__builtin_prefetch" in sources[2]
