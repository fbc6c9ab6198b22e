"""Precision as a per-layer knob (issue 17): int8 layers in the C network build (a uint8 quantize step,
int8 kernels with 7-bit weights quantized at load) against the fake-quant reference in JAX, mixed
int8 / float32 networks, 8-bit buffers in the memory plan, and fj.approximate with precisions on.

Tolerance: the built int8 layer and its fake-quant reference do the same integer arithmetic (the
int32 accumulation is exact); they differ by float32 roundings of the dequantization and the float
sums after it, and where an activation sits within a rounding of a quantization step's midpoint
(x / scale in float32 against the same division in C) one input may land one step apart. So: atol
1e-4 of the output range (observed ~1e-7 on these networks).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import felixjax as fj
from codegen import netbuild, ops
from codegen.lower import lower
from codegen.space import Space, default_sketch
from felixjax.approx import executor, precision
from felixjax.approx.digits import untrained_model
from felixjax.approx.quality import metric_value
from felixjax.approx.search import probe_knobs
from felixjax.network_build import graph_to_spec
from felixjax.pipeline import build_model
from felixjax.quantize import (
    fake_quant_layer,
    precision_of,
    with_precisions,
)

pytestmark = pytest.mark.cc


@pytest.fixture(scope="module")
def digits():
    """The digits CNN of tests/test_approx.py (four convs, one with a residual add, and a dense layer)."""
    return untrained_model(8, 0)


def _anchors(model):
    return [n.name for n in model.graph.nodes if n.is_anchor]


def _check(model, x, int8):
    """Build ``model`` with ``int8`` at int8 (calibrated on ``x``); compare with the JAX fake-quant run."""
    q = precision.quantized(model, int8, x)
    assert sorted(n.name for n in q.graph.nodes if n.is_anchor and precision_of(n.task) == "int8") == sorted(int8)
    exe = build_model(q, fj.Target.cpu(cores=1))
    g = q.graph
    for xi in x[:6]:
        xi = xi.reshape(g.shapes[g.inputs[0]])
        ref = np.asarray(executor.run(g, {g.inputs[0]: xi}, anchor_inputs=fake_quant_layer)[g.outputs[0]])
        out = exe.run(xi)[0]
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-4 * max(1.0, float(np.abs(ref).max())))
    return q, exe


def test_one_int8_layer_matches_the_fake_quant_reference(digits):
    model, _, x = digits
    q, exe = _check(model, x, ["conv2"])
    assert "conv2" in [n.name for n in q.graph.nodes if n.attrs.get("quant")]
    assert any("int8" in s.task.name for s in exe.schedules)
    rows = exe.profile(number=2)  # one row per graph node; the int8 layer's includes its quantize step
    assert [r["name"] for r in rows] == [n.name for n in q.graph.nodes] and all(r["ms"] >= 0 for r in rows)
    # fake quantization changes the output: the reference is not just the float32 network
    xi = x[:1].reshape(model.graph.shapes[model.graph.inputs[0]])
    assert not np.allclose(exe.run(xi)[0], model.run_numpy(xi), atol=1e-6)


def test_mixed_int8_and_float32_layers_with_a_residual_match(digits):
    model, _, x = digits
    names = _anchors(model)
    # conv4 takes a residual; fc is a dense layer; conv3 stays float32 between int8 layers
    _check(model, x, [n for n in names if n != "conv3"])


def test_8bit_buffers_are_sized_and_never_overlap_live_values(digits):
    model, _, x = digits
    q = precision.quantized(model, _anchors(model), x)
    target = fj.Target.cpu(cores=1)
    spaces = {t: Space(t, default_sketch(t, target), target) for t, _ in q.tasks}
    plans = {t: lower(sp, sp.default()) for t, sp in spaces.items()}
    spec = graph_to_spec(q.graph, plans)
    mem = netbuild.plan_memory(spec)
    u8 = [v for v, val in enumerate(spec.values) if val.dtype == "uint8"]
    assert len(u8) == len(_anchors(model)) and all(mem.placement[v][1] == -(-spec.values[v].size // 4) for v in u8)
    items = [(k, mem.lifetimes[k], mem.placement[k]) for k in mem.placement]
    for i, (a, (fa, la), (oa, na)) in enumerate(items):
        for b, (fb, lb), (ob, nb) in items[i + 1:]:
            if fa <= lb and fb <= la:  # live at the same time: disjoint memory
                assert oa + na <= ob or ob + nb <= oa, (a, b)
    zp = [v for v, val in enumerate(spec.values) if val.dtype == "int32"]
    assert zp and all(spec.values[v].data.dtype == np.int32 for v in zp)


def test_a_layer_that_cannot_be_int8_is_a_clear_error(digits):
    model = digits[0]
    with pytest.raises(ValueError, match="not a conv / dense / matmul layer"):
        with_precisions(model, {"nope": "int8"}, {})
    with pytest.raises(ValueError, match="precision 'int4'"):
        with_precisions(model, {"conv1": "int4"}, {})
    with pytest.raises(ValueError, match="calibrated range"):
        with_precisions(model, {"conv1": "int8"}, {})
    fc = ops.dense(1, 256, 10, bias=True, sparsity=0.5)
    sparse = replace(model, graph=model.graph.replace(nodes=tuple(
        replace(n, attrs={**n.attrs, "task": fc}) if n.name == "fc" else n for n in model.graph.nodes)))
    with pytest.raises(ValueError, match="'fc' cannot be built at int8"):
        with_precisions(sparse, {"fc": "int8"}, {"fc": (0.0, 1.0)})


def test_approximate_with_int8_reports_measured_layers_and_points(digits):
    from felixjax.approx.objective import round_precisions

    _, proto, x = digits
    assert "int8" in probe_knobs()[0]
    # one descent round at lam ~ 0 (the latency term alone: it prunes, so a point is built whatever
    # int8 / float32 ratios this machine measured), then the front search with its greedy int8 pass
    res = fj.approximate(proto, fj.Target.cpu(cores=1), data=(x,), metric="fidelity", quality_budget=0.2,
                         trials=0, rounds=1, steps=20, lam=1e-6, batch=16, multiple=4, seeds=(0.5,), measure=1,
                         progress=False, precisions=("float32", "int8"))
    assert {d.precision for d in res.layers} <= {"float32", "int8"}
    int8_points = [p for p in res.pareto if p.int8]
    assert int8_points and int8_points[0].note == "seed int8" and res.quality_evals == len(res.pareto)
    # the descent proposed precisions: one relaxed share per int8-capable layer, rounded at 0.5, built
    rnd = res.trace[0]
    shares = rnd["int8_share"]
    assert set(shares) == set(precision.eligible(fj.load_onnx(proto))) and all(0 < s < 1 for s in shares.values())
    assert set(rnd["int8"]) == round_precisions(shares) == {n for n, s in shares.items() if s >= 0.5}
    descended = [p for p in res.pareto if p.note.startswith("lam=")]
    if descended:  # the rounded point was new: built as proposed
        assert len(descended) == 1 and list(descended[0].int8) == rnd["int8"]
    else:  # the measured tables (timing) may round it onto a point already measured (or the full network)
        proposed = (tuple(sorted((g, int(n)) for g, n in rnd["keep"].items())), tuple(sorted(rnd["int8"])))
        assert proposed in {(p.keep, tuple(sorted(p.int8))) for p in res.pareto}
    # what the result reports is the returned executable, measured: its layers' precisions and quality
    built = {n.name: precision_of(n.task) for n in res.executable.model.graph.nodes if n.is_anchor}
    assert {d.name: d.precision for d in res.layers} == built
    ref = np.stack([res.baseline(x[i: i + 1]) for i in range(len(x))])
    out = np.stack([res.executable(x[i: i + 1]) for i in range(len(x))])
    assert metric_value(out, "fidelity", reference=ref) == pytest.approx(res.quality)
    assert res.quality_loss <= 0.2 + 1e-9 and np.isfinite(res.latency_s)
    with pytest.raises(ValueError, match="precisions"):
        fj.approximate(proto, data=(x,), metric="fidelity", precisions=("float16",), progress=False)


def test_docstring_examples_and_the_cli_flag():
    import argparse
    import doctest

    from felixjax import fake_quant, quantize
    from felixjax.approx import cli

    for module in (quantize, fake_quant):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__
    sub = argparse.ArgumentParser().add_subparsers()
    cli.add_parser(lambda name, text: sub.add_parser(name, help=text))
    args = sub.choices["approx"].parse_args(["m.onnx", "--data", "d.npz", "-o", "out", "--int8"])
    assert args.int8


def _relaxed_objective(model, x, lam=1.0):
    """The joint objective of the digits CNN with int8 shares, on tables from a synthetic predictor that
    sees dtype (an int8 task costs half its float32 twin: ``r = 0.5``), so the test needs no tuning."""
    from felixjax.approx.knobs import analyze
    from felixjax.approx.objective import LatencyTable, RelaxedPrecision, objective
    from felixjax.quantize import act_qparams

    groups = analyze(model.graph)
    table = LatencyTable(model.graph, groups, fj.Target.cpu(cores=1), measured={}, multiple=4,
                         predictor=lambda t: 1e-9 * t.flops * (0.5 if precision_of(t) == "int8" else 1.0))
    names = precision.eligible(model)
    ranges = precision.calibrate_ranges(model, x, names)
    plat = precision.PrecisionLatency(model, table, names)
    relax = RelaxedPrecision({n: act_qparams(*ranges[n]) for n in names}, plat.relaxed)
    loss, relaxed, _ = objective(model.graph, groups, table, metric="accuracy", lam=lam, multiple=4, precision=relax)
    return loss, relaxed, relax, plat, groups, table


def test_the_objective_is_differentiable_in_the_int8_shares(digits):
    import jax
    import jax.numpy as jnp

    model, _, x = digits
    loss, relaxed, relax, plat, _, _ = _relaxed_objective(model, x)
    y = np.random.default_rng(1).integers(0, 10, len(x))
    rb = np.zeros((len(x), 1), np.float32)
    params = {"c": jnp.asarray(relaxed.theta_of({})), "q": jnp.zeros(len(relax.names), jnp.float32)}
    vg = jax.jit(jax.value_and_grad(lambda p: loss(p, x, y, rb), has_aux=True))  # one compile
    (_, (lat, _)), g = vg(params)
    g = np.asarray(g["q"])
    assert np.isfinite(g).all() and np.all(g != 0)
    # the last layer's share: its rounding feeds no later rounding, so the objective is smooth in it
    k, eps = relax.names.index("fc"), 0.05
    e = jnp.zeros(len(relax.names)).at[k].set(eps)
    fd = (vg({**params, "q": params["q"] + e})[0][0] - vg({**params, "q": params["q"] - e})[0][0]) / (2 * eps)
    assert float(g[k]) == pytest.approx(float(fd), rel=2e-2, abs=1e-6)
    # d latency / d share: the table's int8 saving of that layer (r = 0.5 here), not a FLOPs count
    kappa = relaxed.kappa(params["c"])
    dl = jax.grad(lambda q: plat.relaxed(kappa, {"fc": q}))(0.3)
    assert plat.ratio("fc") == pytest.approx(0.5)
    assert float(dl) == pytest.approx(-(1 - plat.ratio("fc")) * float(plat.layer("fc", kappa)), rel=1e-5)
    # d quality / d q (lam = 1): the objective's slope less the latency's (share 0.5: dq/dphi = 1/4)
    per_second = float(lat) / float(plat.relaxed(kappa, dict.fromkeys(relax.names, 0.5)))
    assert abs(float(g[k]) - 0.25 * float(dl) * per_second) > 1e-6


def test_run_numpy_and_check_take_int8_layers(digits):
    """``Model.run_numpy`` runs an int8 layer as its kernel computes it (``fake_quant_run``), so a build's
    ``check()`` works on int8 networks (session 82, a review: both stopped with 'takes 5 inputs ... got 2')."""
    from felixjax.quantize import fake_quant_run

    model, _, x = digits
    q, exe = _check(model, x, ["conv2", "fc"])
    xi = x[:1].reshape(model.graph.shapes[model.graph.inputs[0]])
    ref = fake_quant_run(q.graph, {q.graph.inputs[0]: xi})[q.graph.outputs[0]]
    np.testing.assert_array_equal(q.run_numpy(xi), ref)
    assert not np.allclose(ref, model.run_numpy(xi), atol=1e-6)  # not the float32 network's answer
    assert exe.check(xi) <= 1e-4
