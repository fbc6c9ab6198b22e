"""GPU features and the GPU relaxation (issue 18): hard features equal the integer config's geometry
and the simulator's occupancy, soft features approach them and have finite gradients matching finite
differences, every rounded point is a valid GPU config, the cost model serves cuda-sim tasks with the
GPU feature set, and the gradient strategy descends on the GPU knobs. Evaluated eagerly (no jit) where
possible, to keep the XLA compilation time out of CI."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jax
import jax.numpy as jnp

import felixjax as fj
from codegen.cuda.sim import occupancy, profile
from codegen.cuda.space import CudaSpace
from codegen.ops import conv2d, dense, matmul
from codegen.space import Config, random_factorization
from costmodels.base import Features
from felixjax.features_gpu import (GPU_ACCESS_FEATURES, GPU_GLOBAL_FEATURES, batch_gpu_features, gpu_feature_inputs,
                                   gpu_features)
from felixjax.relax import I_PAR, I_UNROLL, N_TILE, N_X
from felixjax.relax_gpu import GpuRelaxation, gpu_penalty
from felixjax.smooth import Smooth
from felixjax.strategies import get_strategy

TASKS = [matmul(2048, 2048, 2048), matmul(96, 80, 200, bias=True),
         conv2d(2, 16, 9, 9, out_channels=16, kernel=3, stride=2, padding=(1, 0, 2, 1), groups=4, residual=True),
         dense(3, 40, 50, bias=True, act="relu")]
_REL: dict = {}


def _rel(i: int, gpu: str) -> GpuRelaxation:
    if (i, gpu) not in _REL:
        _REL[(i, gpu)] = GpuRelaxation(CudaSpace(TASKS[i], fj.Target.cuda_sim(gpu)))
    return _REL[(i, gpu)]


def _glob(rel, x, smooth):
    """Features of one point through the jitted batch function (one compilation per mode for every
    task: cheaper than eager evaluation's per-operation compilations)."""
    fb = batch_gpu_features(gpu_feature_inputs(rel), jnp.asarray(x, jnp.float32)[None], smooth)
    f = Features(*(np.asarray(a)[0] for a in fb))
    return np.expm1(np.asarray(f.glob, np.float64)), f


G = GPU_GLOBAL_FEATURES.index


@pytest.mark.parametrize("i", range(len(TASKS)))
def test_hard_features_equal_the_geometry_and_occupancy(i):
    rel = _rel(i, "a100" if i % 2 else "orin")
    sp = rel.space
    rng = np.random.default_rng(i)
    for cfg in [sp.default()] + [sp.sample(rng) for _ in range(6)]:
        g, f = _glob(rel, rel.to_x(cfg), Smooth.hard_mode())
        geo = sp.geometry(cfg)
        want = {"blocks": geo.n_blocks, "threads": geo.n_threads, "outputs_per_thread": geo.outputs_per_thread,
                "registers": sp.registers(cfg, geo), "smem_bytes": geo.smem_bytes, "steps": geo.steps,
                "depth": geo.step_depth, "unroll": cfg.unroll, "staged": cfg.parallel, "flops": sp.task.flops,
                "blocks_per_sm": occupancy(profile(sp, cfg), sp.spec), "warps": -(-geo.n_threads // 32), "valid": 1}
        for name, v in want.items():
            assert g[G(name)] == pytest.approx(v, rel=1e-4), (name, cfg)
        acc = np.expm1(np.asarray(f.access, np.float64))
        box = GPU_ACCESS_FEATURES.index("box_bytes")
        assert acc[0, box] == pytest.approx(4 * geo.box_elems("data"), rel=1e-4)
        assert acc[1, box] == pytest.approx(4 * geo.box_elems("weight"), rel=1e-4)
        assert f.access.shape == (3, len(GPU_ACCESS_FEATURES)) and np.isfinite(f.access).all()


def test_soft_features_approach_hard_at_integer_points():
    rel = _rel(0, "h100")
    sp = rel.space
    rng = np.random.default_rng(3)
    exact = ("blocks", "threads", "outputs_per_thread", "registers", "smem_bytes", "steps", "depth", "unroll",
             "staged", "fma_per_thread", "l2_bytes", "compulsory_bytes", "flops")
    for cfg in [sp.default(), sp.sample(rng), sp.sample(rng)]:
        x = rel.to_x(cfg)
        hard, _ = _glob(rel, x, Smooth.hard_mode())
        warm, _ = _glob(rel, x, Smooth.soft(1.0))
        cold, _ = _glob(rel, x, Smooth.soft(1e-6))
        for name in exact:  # no smoothing on these: equal at any temperature
            assert warm[G(name)] == pytest.approx(hard[G(name)], rel=1e-4), name
        np.testing.assert_allclose(cold, hard, rtol=2e-2, atol=1e-2)


def test_soft_gradients_are_finite_and_match_finite_differences():
    rel = _rel(2, "a100")
    inp = gpu_feature_inputs(rel)
    rng = np.random.default_rng(0)
    x0 = np.asarray(rel.project(np.asarray(rel.sample_x(jax.random.PRNGKey(1), 1))[0]), np.float32)
    mask = np.zeros(N_X, np.float32)  # the coordinates that exist: tile exponents, unroll, staging
    mask[:N_TILE] = np.asarray(rel.arrays.slot_mask).reshape(-1)
    mask[[I_UNROLL, I_PAR]] = 1.0
    x0[I_PAR] = 0.5

    def total(x):
        f = gpu_features(inp, x, Smooth.soft(1.0))
        return f.glob.sum() + f.access.sum()

    # every partial derivative by forward mode over the basis (compiles in about half the time of
    # jax.grad here; both differentiate the same function through the same custom_jvp rules)
    partials = jax.jit(jax.vmap(lambda e: jax.jvp(total, (jnp.asarray(x0),), (e,))[1]))
    g = np.asarray(partials(jnp.eye(N_X, dtype=jnp.float32)))
    assert np.isfinite(g).all() and np.abs(g * mask).max() > 0
    dirs = rng.normal(size=(3, N_X)).astype(np.float32) * mask
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    eps = 1e-2
    pts = np.concatenate([x0 + eps * dirs, x0 - eps * dirs])
    f = batch_gpu_features(inp, jnp.asarray(pts), Smooth.soft(1.0))
    tot = np.asarray(f.glob, np.float64).sum(1) + np.asarray(f.access, np.float64).sum((1, 2))
    fd = (tot[:3] - tot[3:]) / (2 * eps)
    np.testing.assert_allclose(dirs @ g, fd, rtol=0.05, atol=0.05)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(TASKS) - 1), st.sampled_from(["a100", "h100", "orin", "a10g"]), st.integers(0, 2**31 - 1))
def test_every_rounded_point_is_a_valid_gpu_config(i, gpu, seed):
    rel = _rel(i, gpu)
    rng = np.random.default_rng(seed)
    xs = rng.uniform(-3, 14, size=(8, N_X))
    cfgs = rel.round_x(xs)
    assert len(cfgs) == 8 and all(rel.space.is_valid(c) for c in cfgs)
    pts, _ = rel.round_points(xs)
    assert rel.valid_x(pts).all()
    # the vectorized validity agrees with the space on arbitrary (often invalid) tilings
    sp = rel.space
    raw = [Config("cuda_tiled", tuple(random_factorization(rng, a.extent, lv) for a, lv in zip(sp.axes, sp.levels)),
                  int(rng.integers(0, 2)), 1, int(2 ** rng.integers(0, 10))) for _ in range(8)]
    assert rel.valid_x(np.stack([rel.to_x(c) for c in raw])).tolist() == [sp.is_valid(c) for c in raw]


def test_gpu_penalty_pushes_into_the_limits():
    rel = _rel(0, "a100")
    sp = rel.space
    bad = Config("cuda_tiled", ((1, 1, 1, 1), (16, 1, 128, 1), (16, 1, 128, 1), (256, 8)), 1, 1, 8)  # 16384 threads
    pen = jax.jit(jax.value_and_grad(gpu_penalty, argnums=1))
    x = jnp.asarray(rel.to_x(bad))
    p, g = pen(rel.descent_arrays, x)
    assert not sp.is_valid(bad) and float(p) > 0 and np.isfinite(np.asarray(g)).all()
    assert float(pen(rel.descent_arrays, jnp.asarray(rel.to_x(sp.default())))[0]) == 0.0
    assert float(pen(rel.descent_arrays, x - 0.05 * g)[0]) < float(p)


def _gpu_context():
    from felixjax.context import SearchContext
    from felixjax.model import OnlineCostModel

    tg = fj.Target.cuda_sim("orin")
    t = fj.ops.matmul(256, 256, 256)
    spaces = {"cuda_tiled": CudaSpace(t, tg)}
    model = OnlineCostModel(tg)
    return model, SearchContext(t, tg, spaces, np.random.default_rng(0), scorer_factory=lambda c: model.scorer(c.spaces))


def test_cost_model_uses_gpu_features():
    model, ctx = _gpu_context()
    assert (model.mlp.n_access_features, model.mlp.n_glob_features) == (len(GPU_ACCESS_FEATURES),
                                                                         len(GPU_GLOBAL_FEATURES))
    assert ctx.scorer.gpu and isinstance(ctx.scorer.relaxations["cuda_tiled"], GpuRelaxation)
    sp = ctx.spaces["cuda_tiled"]
    assert ctx.scorer.features([sp.default()]).glob.shape == (1, len(GPU_GLOBAL_FEATURES))
    # the prior ranks the conventional default above a one-thread-per-block schedule
    one = Config("cuda_tiled", ((1, 1, 1, 1), (256, 1, 1, 1), (256, 1, 1, 1), (256, 1)), 0, 1, 1)
    s = ctx.scorer.score([sp.default(), one])
    assert s[0] > s[1]


@pytest.mark.slow
@pytest.mark.skipif(bool(os.environ.get("CI")), reason="the descent's XLA compilation takes ~100 s on a loaded "
                                                       "2-core machine: too much for CI's budget; run it locally")
def test_gradient_descends_on_the_gpu_knobs():
    _, ctx = _gpu_context()
    strat = get_strategy("gradient", starts=8, steps=4, batch_size=8, warmup_passes=1)
    cfgs = strat.propose(ctx, 8)
    assert len(cfgs) == 8 and all(ctx.spaces["cuda_tiled"].is_valid(c) for c in cfgs)
    assert strat.last_round["harvested"] > 0 and strat.last_round["rounded"] > 0
