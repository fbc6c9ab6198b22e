"""Features: hard mode equals the independent extractor, soft converges to hard, gradients, one jit."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from codegen.lower import lower
from codegen.ops import conv2d, dense, depthwise_conv2d, matmul
from codegen.space import Space, sketches_for
from codegen.target import Target
from costmodels.base import Features
from felixjax.extract import extract
from felixjax.features import (
    ACCESS_FEATURES,
    GLOBAL_FEATURES,
    N_ACCESS_FEATURES,
    N_GLOBAL_FEATURES,
    SLOTS,
    batch_features,
    config_features,
    feature_inputs,
    features,
    trace_count,
)
from felixjax.relax import I_PAR, Relaxation
from felixjax.smooth import Smooth, algebraic_sigmoid, hump

TARGET = Target(cores=2, simd_lanes=16, vector_registers=32, l1d_bytes=48 * 1024, l2_bytes=2 << 20,
                l3_bytes=4 << 20)
TASKS = [
    matmul(12, 16, 20),
    conv2d(1, 4, 6, 6, out_channels=8, kernel=3, padding=1),
    depthwise_conv2d(1, 8, 6, 6, kernel=3, padding=1, bias=True, act="relu"),
    matmul(7, 13, 6, bias=True),  # prime extents
    conv2d(1, 4, 7, 7, out_channels=8, kernel=3, stride=2, padding=1, residual=True),
    conv2d(1, 4, 9, 9, out_channels=6, kernel=3, dilation=2, padding=2),
    conv2d(1, 6, 5, 5, out_channels=4, kernel=1, groups=2),
    dense(3, 20, 12, bias=True, act="relu"),
    matmul(4, 32, 8, batch=2),
]
SPACES = [Space(t, sk, TARGET) for t in TASKS for sk in sketches_for(t)]
RELAX = [Relaxation(sp) for sp in SPACES]
INPUTS = [feature_inputs(r) for r in RELAX]
B = 16  # one batch size everywhere: one compilation per mode for the whole file
HARD = Smooth.hard_mode()


def _configs(sp: Space, seed: int) -> list:
    return sp.sample_many(np.random.default_rng(seed), B - 1) + [sp.default()]


def _x(rel: Relaxation, configs) -> jax.Array:
    return jnp.asarray(np.stack([rel.to_x(c) for c in configs]))


def test_feature_layout():
    assert len(ACCESS_FEATURES) == len(set(ACCESS_FEATURES)) == N_ACCESS_FEATURES
    assert len(GLOBAL_FEATURES) == len(set(GLOBAL_FEATURES)) == N_GLOBAL_FEATURES
    f = batch_features(INPUTS[0], RELAX[0].sample_x(jax.random.PRNGKey(0), B), Smooth.soft(1.0))
    assert isinstance(f, Features)
    assert f.access.shape == (B, len(SLOTS), N_ACCESS_FEATURES)
    assert f.mask.shape == (B, len(SLOTS)) and f.glob.shape == (B, N_GLOBAL_FEATURES)
    assert all(bool(jnp.isfinite(a).all()) for a in f)


def test_hard_features_equal_the_extractor():
    seen = {"scratch": 0, "in_place": 0, "data_copy": 0, "blocked_data": 0, "epilogue": 0, "parallel": 0}
    for i, (sp, rel, inp) in enumerate(zip(SPACES, RELAX, INPUTS)):
        configs = _configs(sp, i)
        hard = batch_features(inp, _x(rel, configs), HARD)
        for b, cfg in enumerate(configs):
            ref = extract(sp, cfg)
            where = f"{sp} {cfg}"
            np.testing.assert_array_equal(np.asarray(hard.mask[b]), ref.mask, err_msg=where)
            m = ref.mask[:, None]
            np.testing.assert_allclose(np.asarray(hard.access[b]) * m, ref.access * m, atol=1e-5, rtol=0,
                                       err_msg=where)
            np.testing.assert_allclose(np.asarray(hard.glob[b]), ref.glob, atol=1e-5, rtol=0, err_msg=where)
            plan = lower(sp, cfg)
            seen["scratch" if plan.acc == "scratch" else "in_place"] += 1
            seen["data_copy"] += plan.data_copy
            seen["blocked_data"] += any(d.kind == "block" for d in plan.buffers["data"].layout.dims)
            seen["epilogue"] += plan.epilogue
            seen["parallel"] += cfg.parallel > 0
    assert min(seen.values()) >= 5, seen  # every layout and statement kind was exercised


# padded sketches (codegen.padding): prime extents computed over padded ranges
PADDED_TASKS = [
    matmul(7, 13, 6, bias=True),  # n 13 -> 16 (the vector axis)
    matmul(17, 16, 5, residual=True, act="relu"),  # m 17 -> 20 (register rows)
    dense(2, 9, 13, bias=True),
    conv2d(1, 3, 13, 13, out_channels=13, kernel=3, padding=1, bias=True),
    depthwise_conv2d(1, 13, 9, 9, kernel=3, stride=2, padding=1, act="relu"),
]
PADDED = [Space(t, sk, TARGET) for t in PADDED_TASKS for sk in sketches_for(t, TARGET) if sk.pad]


def test_padded_hard_features_equal_the_extractor():
    assert len(PADDED) >= 6 and {sp.sketch.base for sp in PADDED} == {"gemm_packed", "conv_direct",
                                                                        "conv_spatial_pack", "dw_rows"}
    for i, sp in enumerate(PADDED):
        rel = Relaxation(sp)
        configs = _configs(sp, 100 + i)
        hard = batch_features(feature_inputs(rel), _x(rel, configs), HARD)
        for b, cfg in enumerate(configs):
            ref = extract(sp, cfg)
            where = f"{sp} {cfg}"
            np.testing.assert_array_equal(np.asarray(hard.mask[b]), ref.mask, err_msg=where)
            m = ref.mask[:, None]
            np.testing.assert_allclose(np.asarray(hard.access[b]) * m, ref.access * m, atol=1e-5, rtol=0,
                                       err_msg=where)
            np.testing.assert_allclose(np.asarray(hard.glob[b]), ref.glob, atol=1e-5, rtol=0, err_msg=where)
            assert lower(sp, cfg).acc == "scratch"


def test_one_compilation_serves_every_shape_and_sketch():
    shapes = [matmul(12, 16, 20), matmul(64, 48, 32, bias=True), dense(1, 197, 1000, act="relu"),
              conv2d(1, 8, 14, 14, out_channels=16, kernel=3, padding=1), depthwise_conv2d(1, 32, 7, 7)]
    pairs = [(Relaxation(Space(t, sk, TARGET)), sk) for t in shapes for sk in sketches_for(t)]
    before = trace_count()
    counts = []
    for rel, _ in pairs:
        f = batch_features(feature_inputs(rel), rel.sample_x(jax.random.PRNGKey(1), B), HARD)
        assert bool(jnp.isfinite(f.glob).all())
        counts.append(trace_count())
    assert len(pairs) >= 7
    assert counts[0] - before <= 1  # 0 when an earlier test already compiled this mode and batch size
    assert counts == [counts[0]] * len(pairs)  # no retrace for any other shape or sketch


def test_soft_converges_to_hard_as_temperature_falls():
    errors = []
    for temperature in (1.0, 1e-1, 1e-2, 1e-4):
        worst = 0.0
        for i in (0, 2, 5, 6):  # matmul, depthwise (epilogue), stride 2 (copy), spatial pack (scratch)
            x = _x(RELAX[i], _configs(SPACES[i], 100 + i))
            hard = batch_features(INPUTS[i], x, HARD)
            soft = batch_features(INPUTS[i], x, Smooth.soft(temperature))
            for h, s in zip(hard, soft):
                worst = max(worst, float(jnp.abs(h - s).max()))
        errors.append(worst)
    assert errors[0] > 0.05  # soft is not exact at integer points: σ(log 2) ≈ 0.79
    assert all(b <= a for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 1e-3, errors


def test_soft_gradients_are_finite_and_match_finite_differences():
    i = 6  # spatial-pack conv: data copy, blocked weights, scratch accumulator
    rel, inp = RELAX[i], INPUTS[i]
    soft = Smooth.soft(1.0)
    rng = np.random.default_rng(0)
    x = np.asarray(rel.sample_x(jax.random.PRNGKey(2), B)).copy()
    x[:, I_PAR] = np.floor(x[:, I_PAR]) + 0.5  # away from the parallel ramp's kinks
    w_access = jnp.asarray(rng.normal(size=(len(SLOTS), N_ACCESS_FEATURES)) / 100, jnp.float32)
    w_glob = jnp.asarray(rng.normal(size=N_GLOBAL_FEATURES) / 10, jnp.float32)

    def objective(f: Features) -> jax.Array:
        return (f.access * w_access).sum((-1, -2)) + (f.mask * w_access[:, 0]).sum(-1) + f.glob @ w_glob

    grad = jax.jit(jax.vmap(jax.grad(lambda v: objective(features(inp, v, soft))), in_axes=0))
    g = np.asarray(grad(jnp.asarray(x)))
    assert np.isfinite(g).all() and np.abs(g).sum() > 0
    d = rng.normal(size=x.shape).astype(np.float32)
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    h = 1e-2
    up = objective(batch_features(inp, jnp.asarray(x + h * d), soft))
    down = objective(batch_features(inp, jnp.asarray(x - h * d), soft))
    fd = np.asarray(up - down) / (2 * h)
    np.testing.assert_allclose((g * d).sum(1), fd, rtol=1e-2, atol=1e-4)  # clean: 1.9e-5 worst (a zeroed sigmoid slope: 5.2e-3)


def test_config_features_are_hard_features():
    rel, inp = RELAX[0], INPUTS[0]
    configs = _configs(SPACES[0], 7)
    f = config_features(rel, configs, inp)
    ref = batch_features(inp, _x(rel, configs), HARD)
    np.testing.assert_array_equal(f.access, np.asarray(ref.access))


# ---- the smoothing module ------------------------------------------------------------------------

def test_custom_gradients_pass_check_grads():
    t = jnp.array([-30.0, -2.0, -0.3, 0.0, 0.7, 5.0])
    check_grads(algebraic_sigmoid, (t,), order=2, modes=["fwd", "rev"])
    check_grads(hump, (t,), order=2, modes=["fwd", "rev"])
    assert bool(jnp.isfinite(jax.vmap(jax.grad(algebraic_sigmoid))(jnp.array([1e9, -1e9, 1e30]))).all())


def test_soft_operations_are_smooth_and_converge_to_hard():
    a = jnp.array([1.0, 3.0, 7.0, 16.0, 17.0, 40.0])
    b = jnp.array([2.0, 3.0, 5.0, 16.0, 16.0, 8.0])
    ops = {
        "lt": lambda s, u, v: s.lt(u, v), "le": lambda s, u, v: s.le(u, v), "eq": lambda s, u, v: s.eq(u, v),
        "min": lambda s, u, v: s.minimum(u, v), "max": lambda s, u, v: s.maximum(u, v),
        "ceil_div": lambda s, u, v: s.ceil_div(u, v), "floor_div": lambda s, u, v: s.floor_div(u, v),
    }
    hard = Smooth.hard_mode()
    for name, op in ops.items():
        exact = op(hard, a, b)
        assert float(jnp.abs(op(Smooth.soft(1e-7), a, b) - exact).max()) < 1e-3 or name in ("lt", "le"), name
        check_grads(lambda u, v, op=op: op(Smooth.soft(1.0), u, v), (a, b), order=1, modes=["rev"], atol=1e-2,
                    rtol=1e-2)
    # comparisons at an exact tie stay at ½ in soft mode; elsewhere they converge
    tie = a == b
    np.testing.assert_allclose(np.asarray(ops["lt"](Smooth.soft(1e-7), a, b))[~tie], np.asarray(hard.lt(a, b))[~tie],
                               atol=1e-6)
    assert float(Smooth.soft(1.0).lt(1.0, 2.0)) == pytest.approx(float(algebraic_sigmoid(np.log(2.0))))
    assert float(Smooth.select(1.0, 5.0, 9.0)) == 5.0 and float(Smooth.select(0.0, 5.0, 9.0)) == 9.0
