"""A layout mixed conv by conv (issue 14): some convs NCHW, the others NCHW8c, converted where they meet."""
from __future__ import annotations

import numpy as np
import pytest

from codegen import blocked
from codegen.target import Target

TARGET = Target.cpu()


def _mobilenet():
    import felixjax as fj

    return fj.zoo.make_model("mobilenet_v2", dataset="cifar10", seed=0)


@pytest.mark.cc
def test_a_mixed_layout_computes_what_the_nchw_one_does():
    """Convs kept NCHW in the middle of blocked regions (a 1x1 whose output is a blocked conv's residual, a
    depthwise conv, the last conv): each value is converted at most once per direction, the named convs keep their
    NCHW tasks, the others are blocked; numpy and the C build match the NCHW model."""
    import felixjax as fj
    from felixjax.network import build_model

    proto = _mobilenet()
    plain = fj.load_onnx(proto)
    convs = [n for n in plain.graph.nodes if n.is_anchor and n.task.op == "conv2d"]
    dw = next(n for n in convs if n.task.p["groups"] > 1 and n.task.p["h"] == 16)
    res = next(n for n in convs if n.task.residual)  # its residual comes from the conv kept NCHW below
    src = next(n for n in convs if res.inputs[-1] in n.outputs)
    keep = {src.name: "nchw", convs[4].name: "nchw", dw.name: "nchw", convs[-1].name: "nchw",
            convs[1].name: "nchwc"}
    mixed = fj.load_onnx(proto, layout=keep)
    by_name = {n.name: n for n in mixed.graph.nodes}
    for name, lay in keep.items():
        assert (by_name[name].task.op == blocked.OP) == (lay == "nchwc"), name
    assert sum(n.is_anchor and n.task.op == blocked.OP for n in mixed.graph.nodes) == \
        sum(n.is_anchor and n.task.op == blocked.OP for n in fj.load_onnx(proto, layout="nchwc").graph.nodes) - \
        sum(v == "nchw" for v in keep.values())
    reblocks = [(n.inputs[0], n.attrs["to"]) for n in mixed.graph.nodes if n.op == "Reblock"]
    assert len(reblocks) == len(set(reblocks)) and (src.outputs[0], "nchwc") in reblocks
    # a groups-1 conv after an NCHW one reads its data as it is (no reorder), a depthwise one cannot
    assert {to for _, to in reblocks} == {"nchw", "nchwc"}
    x = np.random.default_rng(0).standard_normal(plain.input_shapes["input"]).astype(np.float32)
    ref = plain.run_numpy(x)
    np.testing.assert_allclose(mixed.run_numpy(x), ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
    np.testing.assert_allclose(build_model(mixed, TARGET, threads=2)(x), ref, rtol=1e-4,
                               atol=1e-4 * float(np.abs(ref).max()))


def test_a_mixed_layout_names_what_it_cannot_use():
    import felixjax as fj

    proto = _mobilenet()
    with pytest.raises(ValueError, match="'nope' is not a convolution of this model"):
        fj.load_onnx(proto, layout={"nope": "nchw"})
    conv = next(n.name for n in fj.load_onnx(proto).graph.nodes if n.is_anchor and n.task.op == "conv2d")
    with pytest.raises(ValueError, match="unknown layout 'nhwc'"):
        fj.load_onnx(proto, layout={conv: "nhwc"})
    with pytest.raises(ValueError, match="layout must be one of"):
        fj.load_onnx(proto, layout="nhwc")


class _Profiled:
    """Stands in for a CompiledModel: ``profile`` returns set times (ms per node name)."""

    def __init__(self, graph, ms):
        self.graph, self.ms, self.calls = graph, ms, 0

    def profile(self, number):
        self.calls += 1
        return [{"name": n.name, "ms": self.ms.get(n.name, 0.0)} for n in self.graph.nodes]


def test_mixed_layout_keeps_a_conv_nchw_only_where_it_pays_for_its_conversions():
    """The rule on set profiles: a conv stays NCHW where its NCHW time plus the conversions of its input
    and output (at the blocked build's measured Reblock rate) is below its blocked time; no plan when
    every conv goes one way."""
    import math

    import felixjax as fj
    from felixjax.pipeline import fastest_plan, mixed_layout

    proto = _mobilenet()
    models = {lay: fj.load_onnx(proto, layout=lay) for lay in ("nchw", "nchwc")}
    g = models["nchwc"].graph
    reblock = next(n for n in g.nodes if n.op == "Reblock")
    rate = 0.001  # ms per element
    convs = [n for n in g.nodes if n.is_anchor and n.task.op == blocked.OP]
    plain = {n.name: n for n in models["nchw"].graph.nodes}

    def switch(name):
        n = plain[name]
        return rate * sum(math.prod(models["nchw"].graph.shapes[v]) for v in (n.inputs[0], n.outputs[0]))

    a, b, c = convs[2].name, convs[6].name, convs[9].name
    fast = {n.name: 1.0 for n in convs} | {reblock.name: rate * math.prod(g.shapes[reblock.outputs[0]])}
    slow = {n.name: 2.0 for n in convs} | {a: 1.0 - switch(a) - 0.01,   # pays: NCHW
                                            b: 1.0 - switch(b) + 0.01}   # faster alone, not with conversions
    builds = {"nchw": _Profiled(models["nchw"].graph, slow), "nchwc": _Profiled(g, fast)}
    plan, rows = mixed_layout(models, builds, rounds=3, number=1)
    assert builds["nchw"].calls == builds["nchwc"].calls == 3
    assert plan == {a: "nchw"}
    assert [r["name"] for r in rows] == [n.name for n in convs]
    row = {r["name"]: r for r in rows}
    assert row[b]["layout"] == "nchwc" and row[b]["nchw_ms"] < row[b]["nchwc_ms"]
    assert row[c]["switch_ms"] == pytest.approx(switch(c))
    # the plan that ignores conversions (choose_layout times it as a whole build too): b joins a
    assert fastest_plan(rows) == {a: "nchw", b: "nchw"}
    assert fastest_plan([{**r, "nchw_ms": 0.0} for r in rows]) is None  # all NCHW: no mix
    # every conv faster blocked, or every one faster NCHW: no mixed layout to build
    assert mixed_layout(models, {"nchw": _Profiled(models["nchw"].graph, {n.name: 3.0 for n in convs}),
                                 "nchwc": builds["nchwc"]}, rounds=1)[0] is None
    assert mixed_layout(models, {"nchw": _Profiled(models["nchw"].graph, {n.name: 0.0 for n in convs}),
                                 "nchwc": builds["nchwc"]}, rounds=1)[0] is None


@pytest.mark.cc
def test_choose_layout_checks_each_build_before_timing_it(monkeypatch):
    # a build that computes something else must not win on speed (session 77: the builds were timed unchecked)
    import felixjax as fj
    from felixjax.network_build import CompiledModel

    checked, run = [], CompiledModel.run

    def blocked_is_off(self, *a, **k):  # every build with a blocked conv computes out + 1
        outs = run(self, *a, **k)
        if any(n.is_anchor and n.task.op == "conv2d_nchwc" for n in self.model.graph.nodes):
            return [o + 1 for o in outs] if isinstance(outs, list) else outs + 1
        return outs

    def spy(self, *a, **k):
        checked.append(self)
        return check(self, *a, **k)

    check = CompiledModel.check
    monkeypatch.setattr(CompiledModel, "check", spy)
    layout, times = fj.choose_layout(_mobilenet(), rounds=1, number=1, mixed=False)
    assert layout in ("nchw", "nchwc") and len(checked) == 3 and len({id(c) for c in checked}) == 2  # + the kept one
    monkeypatch.setattr(CompiledModel, "run", blocked_is_off)
    with pytest.warns(RuntimeWarning, match="choosing the layout: the nchwc build is wrong .output 0.*left out"):
        layout, times = fj.choose_layout(_mobilenet(), rounds=1, number=1, mixed=False)
    assert layout == "nchw" and set(times) == {"nchw"}  # the wrong one never timed, never kept
    def all_off(self, *a, **k):
        outs = run(self, *a, **k)
        return [o + 1 for o in outs] if isinstance(outs, list) else outs + 1

    monkeypatch.setattr(CompiledModel, "run", all_off)
    with pytest.raises(RuntimeError, match="every layout's build differs"), pytest.warns(RuntimeWarning):
        fj.choose_layout(_mobilenet(), rounds=1, number=1, mixed=False)


@pytest.mark.cc
def test_choose_layout_without_winograd_builds_no_contender_with_it(monkeypatch):
    # `felixjax build --layout auto --no-winograd` chose its layout by timing builds with Winograd convs
    # (session 78): each contender is now built as the final build will be
    from test_network_select import _two_convs

    import felixjax as fj
    from felixjax.network_build import CompiledModel, is_winograd

    built, check = [], CompiledModel.check

    def spy(self, *a, **k):
        built.append([s.config.sketch for s in self.schedules])
        return check(self, *a, **k)

    monkeypatch.setattr(CompiledModel, "check", spy)
    fj.choose_layout(_two_convs(), rounds=1, number=1, mixed=False, winograd=False)
    assert len(built) == 3 and not any(is_winograd(s) for b in built for s in b), built
    built.clear()
    fj.choose_layout(_two_convs(), rounds=1, number=1, mixed=False)
    assert any(is_winograd(s) for b in built for s in b), built  # these 3x3 convs' default is Winograd


def _convs(names, batch=1, shapes=((16, 3, 3, 3), (16, 1, 3, 3), (16, 16, 1, 1), (16, 16, 3, 3))):
    """A 3 -> 16 conv, a depthwise, a 1x1 and a 3x3 conv (``shapes``: their weights'; a second one of 1 input
    channel is depthwise), then GlobalAveragePool; node names as given."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((0.2 * rng.standard_normal(s)).astype(np.float32), f"w{i}")
             for i, s in enumerate(shapes)]
    nodes, x = [], "x"
    for i, (s, name) in enumerate(zip(shapes, names)):
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"y{i}"], name=name, pads=[s[2] // 2] * 4,
                                      group=16 if i and s[1] == 1 else 1))
        x = f"y{i}"
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["out"], name="gap"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         [batch, shapes[0][1], 8, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [batch, 16, 1, 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_generated_node_name_never_takes_a_real_ones_and_a_mapping_names_one_conv():
    """Session 82, a review: an unnamed node became 'Conv_0' beside a node named 'Conv_0'; {'Conv_0': 'nchw'}
    kept both NCHW, and mixed_layout timed both as the second."""
    import felixjax as fj

    model = _convs(["", "dw", "pw", "Conv_0"])
    names = [n.name for n in fj.load_onnx(model).graph.nodes]
    assert len(set(names)) == len(names) and "Conv_0" in names, names
    mixed = fj.load_onnx(model, layout={"Conv_0": "nchw"})
    ops = {n.name: n.task.op for n in mixed.graph.nodes if n.is_anchor}
    assert ops["Conv_0"] == "conv2d" and sum(op == "conv2d" for op in ops.values()) == 1, ops


def test_layouts_it_cannot_use_are_said():
    """Session 82, a review: layout=None failed after the whole import with an AttributeError; a conv mapped to
    'nchwc' that cannot be blocked, and layout='nchwc' at batch 2 (no 3x3 conv fits the 8 axes), stayed NCHW
    silently."""
    import felixjax as fj

    for bad in (None, ["nchwc"], 3):
        with pytest.raises(ValueError, match="layout must be one of"):
            fj.load_onnx(b"never read", layout=bad)
    with pytest.warns(UserWarning, match="'Conv_3' cannot be blocked"):
        fj.load_onnx(_convs(["Conv_0", "dw", "pw", "Conv_3"], batch=2), layout={"Conv_3": "nchwc"})
    with pytest.warns(UserWarning, match="none of the 2 convolution.s. can be blocked"):
        m = fj.load_onnx(_convs(["a", "b"], batch=2, shapes=((16, 16, 3, 3), (16, 16, 3, 3))), layout="nchwc")
    assert not any(n.is_anchor and n.task.op != "conv2d" for n in m.graph.nodes)
