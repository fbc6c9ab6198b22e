"""The nine real-architecture ``light_*`` graphs shipped in the onnx wheel, with seeded random weights,
imported, compiled to C and compared with onnxruntime (the final output and the pre-softmax tensor).

The graphs make every weight with ``ConstantOfShape`` (one repeated value), so their outputs are uniform
and an unmodified comparison cannot fail. :func:`randomize` replaces each with seeded random values:
fan-in-scaled normal weights for Conv / Gemm (He: std sqrt(2 / fan_in)), BatchNormalization scale and
variance and per-channel multipliers in U(0.5, 1.5), everything else N(0, 0.1). The last layer before the
softmax is then rescaled (using onnxruntime's logits on the test input) so the logits have standard
deviation 2 and the softmax is not saturated: a one-hot output would hide errors. The path from that
layer to the softmax is positively homogeneous (Relu, pooling, reshapes), so the references after the
rescaling are onnxruntime's logits times the factor and their softmax (float64): one onnxruntime run
per graph instead of two (the fc layers of VGG-19 alone are 0.5 GB).

Builds go through the default build cache, shared by every graph and every run.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import felixjax as fj

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
NAMES = sorted(p.stem for p in LIGHT.glob("light_*.onnx"))
_PASS_THROUGH = ("Unsqueeze", "Reshape", "Identity")
_HOMOGENEOUS = ("Reshape", "Flatten", "Relu", "GlobalAveragePool", "AveragePool", "Dropout", "Identity")


def _consumer(uses: dict, name: str):
    """The first real consumer of ``name`` (through Unsqueeze / Reshape) and the input slot it uses."""
    for node, k in uses.get(name, []):
        if node.op_type in _PASS_THROUGH and k == 0:
            return _consumer(uses, node.output[0])
        return node, k
    return None, -1


def randomize(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy of a light graph with every ConstantOfShape replaced by a seeded random initializer, and the
    pre-softmax tensor added as a second graph output (when there is a Softmax)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    rng = np.random.default_rng(seed)
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    uses: dict[str, list] = {}
    for n in g.node:
        for k, i in enumerate(n.input):
            uses.setdefault(i, []).append((n, k))
    kept = []
    for n in g.node:
        if n.op_type != "ConstantOfShape":
            kept.append(n)
            continue
        shape = [int(v) for v in inits[n.input[0]].reshape(-1)]
        node, k = _consumer(uses, n.output[0])
        op = node.op_type if node is not None else ""
        if op in ("Conv", "Gemm", "MatMul") and k == 1:
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            fan_in = shape[0] if op == "MatMul" or (op == "Gemm" and not trans_b) else int(np.prod(shape[1:]))
            w = rng.standard_normal(shape, dtype=np.float32)
            w *= np.float32(np.sqrt(2.0 / fan_in))
        elif (op == "BatchNormalization" and k in (1, 4)) or op == "Mul":
            w = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        else:
            w = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)
        g.initializer.append(numpy_helper.from_array(w, n.output[0]))
    del g.node[:]
    g.node.extend(kept)
    softmax = [n for n in kept if n.op_type == "Softmax"]
    if softmax:
        g.output.append(helper.make_tensor_value_info(softmax[-1].input[0], onnx.TensorProto.FLOAT, None))
    return m


def calibrate_logits(model: onnx.ModelProto, feeds: dict, target_std: float = 2.0) -> list[np.ndarray]:
    """Scale (in place) the weights and bias of the layer that makes the logits so they have
    ``target_std`` (the path from it to the Softmax is positively homogeneous: Relu, pooling, reshapes);
    returns onnxruntime's outputs for the scaled model (see the module docstring)."""
    refs = _ort(model, feeds)
    if len(model.graph.output) < 2:
        return refs
    logits = refs[1]
    factor = target_std / max(float(logits.std()), 1e-30)
    producers = {o: n for n in model.graph.node for o in n.output}
    node = producers[model.graph.output[1].name]
    while node.op_type in _HOMOGENEOUS:
        node = producers[node.input[0]]
    assert node.op_type in ("Conv", "Gemm"), node.op_type
    inits = {t.name: t for t in model.graph.initializer}
    for name in node.input[1:3]:
        while name not in inits:   # a weight reshaped on its way in
            name = producers[name].input[0]
        t = inits[name]
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * np.float32(factor), name))
    scaled = logits.astype(np.float64) * np.float32(factor)
    flat = scaled.reshape(scaled.shape[0], -1)       # opset < 13 Softmax: over every axis after the first
    e = np.exp(flat - flat.max(axis=1, keepdims=True))
    probs = (e / e.sum(axis=1, keepdims=True)).reshape(refs[0].shape)
    return [probs.astype(np.float32), scaled.astype(np.float32)]


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.slow  # ~50 s for the nine with a warm build cache (vgg19, zfnet512, alexnet: their 0.2-0.5 GB fc layers)
@pytest.mark.parametrize("name", NAMES)
def test_light_graph_matches_onnxruntime(name):
    proto = randomize(onnx.load(str(LIGHT / f"{name}.onnx")))
    (inp,) = [i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}]
    shape = [d.dim_value for d in next(i for i in proto.graph.input if i.name == inp).type.tensor_type.shape.dim]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    refs = calibrate_logits(proto, {inp: x})
    model = fj.load_onnx(proto)
    exe = fj.build_model(model, threads=1)
    got = exe.run({inp: x})
    assert len(got) == len(refs)
    for y, ref in zip(got, refs):
        assert y.shape == ref.shape and np.isfinite(y).all()
        assert float(ref.std()) > 1e-3                       # not a constant output
        err = float(np.abs(y - ref).max()) / float(np.abs(ref).max())
        assert err <= 1e-3, f"{name}: relative error {err:.2e}"
    if len(refs) > 1:   # the softmax is not saturated: the comparison of probabilities means something
        assert 0.5 < float(refs[1].std()) < 8 and float(refs[0].max()) < 0.999
