"""The multilevel roofline prior (issue 15): finite, differentiable in the (soft) features, and it
tells register blocks apart by the FMA latency they hide. Features come from the enumerating
extractor (``felixjax.extract``, equal to the closed-form hard-mode features and seconds cheaper than
compiling them); the feature function's own soft-mode gradients are tested in test_features.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from codegen.ops import matmul
from codegen.space import Config, Space
from codegen.target import Target
from costmodels import Features
from felixjax.extract import extract
from felixjax.model import Blend, OnlineCostModel, multilevel_prior

TARGET = Target(cores=1, simd_lanes=8, vector_registers=16, fma=True)


def _space():
    return Space(matmul(64, 64, 64), "gemm_packed", TARGET)


def _features(configs) -> Features:
    fs = [extract(_space(), c) for c in configs]
    return Features(*(np.stack([getattr(f, k) for f in fs]) for k in ("access", "mask", "glob")))


def _block(m3: int, n3: int) -> Config:
    """gemm_packed with an ``m3 x n3`` register block (vec 8: ``m3 · n3 / 8`` accumulators)."""
    return Config("gemm_packed", ((1, 1, 1, 1), (64 // (8 * m3), 1, 8, m3), (64 // (4 * n3), 1, 4, n3), (1, 64)),
                  1, 8, 4)


def test_register_block_changes_the_prior_by_the_fma_latency():
    space = _space()
    one, eight = _block(1, 8), _block(4, 16)  # 1 and 8 accumulators; everything else equal
    for c in (one, eight):
        space.validate(c)
    f = _features([one, eight])
    prior = multilevel_prior(TARGET)
    s = np.asarray(prior.predict(f))
    assert np.all(np.isfinite(s))
    cyc = np.exp(np.asarray(prior.terms(prior.params, f)["cycles"]))
    # one accumulator: each iteration waits for the FMA latency (4 cycles) for 1 FMA; eight hide it
    assert 3.5 < cyc[0] < 6.0 and 3.5 < cyc[1] < 6.0
    assert s[1] - s[0] > np.log(3.0), s  # > 3x faster predicted (8 FMAs per latency instead of 1)


def test_gradient_in_the_features_is_finite_and_points_the_right_way():
    prior = multilevel_prior(TARGET)
    f = _features([_block(2, 8)])
    f = Features(*(jnp.asarray(a, jnp.float32) for a in f))
    grad = jax.grad(lambda f: prior.apply(prior.params, f).sum())(f)
    for a in (grad.glob, grad.access):
        assert np.all(np.isfinite(np.asarray(a)))
    from felixjax.features import GLOBAL_FEATURES as G

    g = np.asarray(grad.glob[0])
    assert g[G.index("flops")] < 0  # more work, lower score
    assert g[G.index("accumulators")] > 0  # 2 accumulators: latency-bound, more of them help
    assert g[G.index("vec")] > 0


def test_default_prior_and_compile_key():
    model = OnlineCostModel(TARGET)
    assert type(model.prior).__name__ == {"multilevel": "MultiLevelRoofline", "roofline": "RooflineModel"}[
        OnlineCostModel.prior_kind]
    old = Blend(model.prior, model.mlp, 0.0)
    new = Blend(multilevel_prior(TARGET), model.mlp, 0.0)
    assert old.prior_key != new.prior_key or OnlineCostModel.prior_kind == "multilevel"


def test_save_load_round_trip(tmp_path):
    from costmodels.roofline import MultiLevelRoofline

    prior = multilevel_prior(TARGET)
    prior.save(tmp_path / "p.npz")
    back = MultiLevelRoofline.load(tmp_path / "p.npz")
    f = _features([_block(1, 8), _block(4, 16)])
    np.testing.assert_allclose(back.predict(f), prior.predict(f), rtol=1e-6)


def test_load_model_dispatches_on_the_kind(tmp_path):
    from costmodels.loading import load_model

    multilevel_prior(TARGET).save(tmp_path / "p.npz")
    assert type(load_model(tmp_path / "p.npz")).__name__ == "MultiLevelRoofline"
