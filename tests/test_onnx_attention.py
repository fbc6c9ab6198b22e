"""ONNX ops run as the function body their schema defines (``felixjax.onnx_functions.expand_schema_functions``):
Attention (opset 23) in its variants, and a projection block whose projections stay tunable matmuls, against
onnxruntime through the numpy executor and the C build. (The onnx wheel's own Attention, RotaryEmbedding,
SwiGLU, ... cases run in tests/test_onnx_import.py's manifest.)"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import felixjax as fj
from felixjax.errors import UnsupportedModelError

RNG = np.random.default_rng(0)


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _model(nodes, inputs, outputs, inits=(), opset=23):
    g = helper.make_graph(nodes, "g", [_vi(n, s) for n, s in inputs], [_vi(o, None) for o in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _check(model, inputs):
    feeds = {n: RNG.standard_normal(s).astype(np.float32) for n, s in inputs}
    refs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    m = fj.load_onnx(model)
    for got in (m.run_numpy(feeds), fj.build_model(m, threads=1).run(feeds)):
        got = got if isinstance(got, list) else [got]
        assert len(got) == len(refs)
        for y, ref in zip(got, refs):
            assert y.shape == ref.shape
            np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5 * float(np.abs(ref).max()))
    return m


def test_grouped_query_attention_3d_causal_with_a_kv_cache_and_softcap():
    b, s, past, hq, hkv, d = 2, 5, 3, 4, 2, 8
    node = helper.make_node("Attention", ["q", "k", "v", "", "pk", "pv"], ["y", "pk2", "pv2"], q_num_heads=hq,
                            kv_num_heads=hkv, is_causal=1, softcap=5.0)
    inputs = [("q", (b, s, hq * d)), ("k", (b, s, hkv * d)), ("v", (b, s, hkv * d)), ("pk", (b, hkv, past, d)),
              ("pv", (b, hkv, past, d))]
    _check(_model([node], inputs, ["y", "pk2", "pv2"]), inputs)


def test_4d_attention_with_a_mask_computed_from_data_and_a_scale():
    nodes = [helper.make_node("Greater", ["mk", "zero"], ["mask"]),
             helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"], scale=0.3)]
    inputs = [("q", (1, 2, 4, 8)), ("k", (1, 2, 6, 8)), ("v", (1, 2, 6, 5)), ("mk", (1, 1, 4, 6))]
    _check(_model(nodes, inputs, ["y"], [numpy_helper.from_array(np.float32(0), "zero")]), inputs)


def test_multi_query_attention_with_a_constant_float_mask():
    mask = np.where(RNG.random((3, 7)) < 0.3, -np.inf, 0).astype(np.float32)
    mask[:, 0] = 0
    inputs = [("q", (2, 4, 3, 8)), ("k", (2, 1, 7, 8)), ("v", (2, 1, 7, 8))]
    _check(_model([helper.make_node("Attention", ["q", "k", "v", "m"], ["y"])], inputs, ["y"],
                  [numpy_helper.from_array(mask, "m")]), inputs)


def test_the_projections_of_an_attention_block_stay_tunable_matmuls():
    w = [numpy_helper.from_array((0.2 * RNG.standard_normal((16, 16))).astype(np.float32), f"w{i}") for i in range(3)]
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [c]) for i, c in enumerate("qkv")]
    nodes.append(helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=2, kv_num_heads=2, is_causal=1))
    m = _check(_model(nodes, [("x", (1, 6, 16))], ["y"], w), [("x", (1, 6, 16))])
    assert len(m.graph.anchors) == 3


@pytest.mark.parametrize("case,match", [("no_heads", "3-D inputs need both q_num_heads and kv_num_heads"),
                                        ("not_divisible", "hidden size 16 is not a multiple of its 3 heads"),
                                        ("head_sizes", "the query and key head sizes differ"),
                                        ("linear_attention", "LinearAttention")])
def test_what_cannot_be_expanded_is_a_clear_error(case, match):
    # a malformed Attention failed deep inside onnx's function body ("Incompatible dimensions" in an Expand, an
    # unfolded Mod): checked first, one line
    if case == "linear_attention":  # its body is a Scan: refused by name
        node = helper.make_node("LinearAttention", ["q", "k", "v"], ["y"])
        with pytest.raises(UnsupportedModelError, match=match):
            fj.load_onnx(_model([node], [("q", (1, 2, 4, 8)), ("k", (1, 2, 4, 8)), ("v", (1, 2, 4, 8))], ["y"],
                                opset=27))
        return
    attrs = {"no_heads": {}, "not_divisible": {"q_num_heads": 3, "kv_num_heads": 3},
             "head_sizes": {"q_num_heads": 4, "kv_num_heads": 2}}[case]
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], **attrs)  # 3-D needs heads; 16 is not 3 heads
    with pytest.raises(UnsupportedModelError, match=match):
        fj.load_onnx(_model([node], [("q", (1, 4, 16)), ("k", (1, 4, 16)), ("v", (1, 4, 16))], ["y"]))


def test_inlined_names_never_collide_and_a_missing_opset_is_named():
    # a session-81 code review: a local function called "Attention" and ONNX's Attention, both unnamed, gave their
    # intermediates one prefix ("invalid ONNX model: ... not in SSA form"), as did a user's value named like one;
    # Attention at opset 22 fell through to "malformed in a way felixjax does not check yet"
    local = helper.make_function("local", "Attention", ["a"], ["o"],
                                 [helper.make_node("Mul", ["a", "a"], ["ScaleFactor"]),
                                  helper.make_node("Add", ["ScaleFactor", "a"], ["o"])],
                                 [helper.make_opsetid("", 23)])
    nodes = [helper.make_node("Attention", ["q"], ["q2"], domain="local"),
             helper.make_node("Relu", ["q2"], ["Attention__fn0/QReshaped"]),
             helper.make_node("Attention", ["Attention__fn0/QReshaped", "k", "v"], ["y"])]
    inputs = [("q", (1, 2, 3, 8)), ("k", (1, 2, 5, 8)), ("v", (1, 2, 5, 8))]
    model = _model(nodes, inputs, ["y"])
    model.functions.append(local)
    model.opset_import.append(helper.make_opsetid("local", 1))
    _check(model, inputs)
    with pytest.raises(UnsupportedModelError, match="Attention does not exist at opset 22 .ONNX added it at opset 23"):
        fj.load_onnx(_model([helper.make_node("Attention", ["q", "k", "v"], ["y"])], inputs, ["y"], opset=22))
    bad = [("q", (1, 2, 3, 8)), ("k", (2, 2, 5, 8)), ("v", (2, 2, 5, 8))]
    with pytest.raises(UnsupportedModelError, match="one batch size"):
        fj.load_onnx(_model([helper.make_node("Attention", ["q", "k", "v"], ["y"])], bad, ["y"]))
