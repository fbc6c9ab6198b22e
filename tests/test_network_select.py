"""Each task's schedule chosen by its layers' time inside the network (``tune_model(in_network=...)``)."""
from __future__ import annotations

import numpy as np
import pytest

from codegen.measure_records import MeasureResult
from codegen.space import Space, sketches_for
from codegen.target import Target

TARGET = Target.cpu()


def _two_convs():
    """x (1, 16, 8, 8) -> 3x3 conv + bias + relu -> 3x3 conv: two tasks, each with several conv sketches."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((0.1 * rng.standard_normal((16, 16, 3, 3))).astype(np.float32), n)
             for n in ("w1", "w2")] + [numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1], name="conv2")]
    g = helper.make_graph(nodes, "two_convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


class _Build:
    """Stands in for a CompiledModel: its layers take set times (ms, by task and sketch) inside the network;
    ``whole`` scales what the whole build takes (layers interacting through the cache)."""

    def __init__(self, model, configs, table, whole=1.0):
        self.model, self.configs, self.table, self.whole = model, configs, table, whole

        self.net = type("_Net", (), {"input_shapes": (model.input_shapes["x"],)})()

    def _ms(self):
        return [self.table[(n.task, self.configs[n.task].sketch)] if n.is_anchor else 0.01
                for n in self.model.graph.nodes]

    def run(self, x):
        return [np.zeros((1, 16, 8, 8), np.float32)]

    def profile(self, x, *, number=1):
        return [{"name": n.name, "ms": ms} for n, ms in zip(self.model.graph.nodes, self._ms())]

    def timeit(self, x=None, *, number=1):
        return self.whole * 1e-3 * sum(self._ms())


def test_the_choice_follows_the_layers_time_in_the_network_and_is_kept_only_if_the_build_gets_faster(tmp_path):
    import felixjax as fj
    from felixjax.database import NETWORK_PREFIX, Database, TuningRecord
    from felixjax.network_build import choose_schedules
    from felixjax.network_select import select_in_network

    model = fj.load_onnx(_two_convs())
    (a, _), (b, _) = model.tasks
    key = TARGET.at_threads(1).key
    fams = {t: [Space(t, s.name, TARGET).default() for s in sketches_for(t, TARGET)][:3] for t in (a, b)}
    assert all(len(f) == 3 and len({c.sketch for c in f}) == 3 for f in fams.values())
    kernel = [1.0e-3, 1.2e-3, 1.5e-3]  # alone: the first family of each task is the fastest
    db = Database(str(tmp_path / "sel.db"))
    for t in (a, b):
        for i, (cfg, lat) in enumerate(zip(fams[t], kernel)):
            db.add(TuningRecord(t, key, "random:0", i, cfg, MeasureResult("ok", (lat,))))
    sk = {t: [c.sketch for c in fams[t]] for t in (a, b)}
    from felixjax.network_select import family_candidates
    assert [r.sketch for r in family_candidates(db, a, key, 3)] == sk[a]
    assert [r.sketch for r in family_candidates(db, a, key, 3, max_ratio=1.3)] == sk[a][:2]  # 1.5x alone: not built
    # inside the network: a's second family is twice as fast as its best kernel; b's is 3% faster (< margin)
    table = {(a, sk[a][0]): 3.0, (a, sk[a][1]): 1.5, (a, sk[a][2]): 2.0,
             (b, sk[b][0]): 1.0, (b, sk[b][1]): 0.97, (b, sk[b][2]): 1.4}
    built = []

    def builder(model_, target, *, configs, threads):
        built.append(dict(configs))
        whole = slower if configs == {a: fams[a][1], b: fams[b][0]} else 1.0
        return _Build(model_, configs, table, whole)

    slower = 1.0  # the per-task choices are faster as a whole too
    sel = select_in_network(model, TARGET, db, builder, run="random:0", threads=1, families=3, rounds=2)
    assert len(built) == 4  # three variants (family 0, 1, 2 of every task), then the choices
    assert [c.sketch for c in built[1].values()] == [sk[a][1], sk[b][1]]
    ch = {c.task: c for c in sel.choices}
    assert ch[a].chosen == 1 and ch[b].chosen == 0  # b's 3% is within the margin: it keeps its best kernel
    assert [k.network_s for k in ch[a].candidates] == pytest.approx([3.0e-3, 1.5e-3, 2.0e-3])
    assert [k.kernel_s for k in ch[a].candidates] == pytest.approx(kernel)
    assert sel.kept and sel.picked_s < sel.baseline_s and sel.configs() == {a: fams[a][1], b: fams[b][0]}
    assert "kept" in sel.table() and sk[a][1] in sel.table()
    # stored: the build takes the in-network choice over the fastest kernel; kernel queries never see it
    assert db.network_choice(a, key).config == fams[a][1] and db.network_choice(a, key).run == NETWORK_PREFIX + "random:0"
    assert db.network_choice(b, key).config == fams[b][0]
    assert db.best(a, key).config == fams[a][0] and db.best(a, key, retimed=True) is None
    sched = {s.task: s for s in choose_schedules(model, TARGET, db=db, threads=1)}
    assert sched[a].config == fams[a][1] and "inside a network" in sched[a].note
    assert sched[b].config == fams[b][0]

    # the same choices, slower as a whole build: nothing is kept or stored
    db2 = Database(str(tmp_path / "sel2.db"))
    for rec in db.records(retimes=False):
        db2.add(TuningRecord(rec.task, rec.target_key, rec.run, rec.trial, rec.config, rec.result))
    slower = 2.0
    sel2 = select_in_network(model, TARGET, db2, builder, run="random:0", threads=1, families=3, rounds=2)
    assert [c.chosen for c in sel2.choices] == [1, 0] and not sel2.kept and sel2.picked_s > sel2.baseline_s
    assert sel2.configs() == {a: fams[a][0], b: fams[b][0]} and "not kept" in sel2.table()
    assert db2.network_choice(a, key) is None
    assert choose_schedules(model, TARGET, db=db2, threads=1)[0].config == fams[a][0]
    # a variant whose output differs from the best kernels' build is an error, not a choice
    class _Wrong(_Build):
        def run(self, x):
            return [np.ones((1, 16, 8, 8), np.float32)]

    with pytest.raises(RuntimeError, match="variant 1's output differs"):
        select_in_network(model, TARGET, db2, lambda m, t, *, configs, threads: (
            _Wrong if configs[a] == fams[a][1] else _Build)(m, configs, table), run="random:0", threads=1)
    # one family per task: nothing to choose between
    db3 = Database(str(tmp_path / "sel3.db"))
    db3.add(TuningRecord(a, key, "random:0", 0, fams[a][0], MeasureResult("ok", (1e-3,))))
    assert select_in_network(model, TARGET, db3, builder, run="random:0", threads=1) is None


@pytest.mark.cc
@pytest.mark.slow
def test_tune_model_chooses_in_the_network_and_builds_what_it_chose(tmp_path, runner, monkeypatch):
    """A real run: every sketch's default measured, then the in-network choice over the real builds; the
    choice is consistent with what it measured, and the build from the database computes the model."""
    import functools

    import felixjax as fj
    from felixjax import network_select
    from felixjax.database import Database
    from felixjax.network import build_model
    from felixjax.network_select import MARGIN

    # every measured family is a candidate, however slow alone: on a fast machine the default Winograd kernel
    # (measured first since session 73) can leave every other family over MAX_RATIO x slower, and nothing to choose
    monkeypatch.setattr(network_select, "family_candidates",
                        functools.partial(network_select.family_candidates, max_ratio=1e9))

    model = fj.load_onnx(_two_convs())
    db = str(tmp_path / "net.db")
    res = fj.tune_model(model, trials=2 * 6, strategy="random", db=db, runner=runner, threads=1, progress=False,
                        retime=1, in_network=2)
    sel = res.selection
    assert sel is not None and len(sel.choices) == 2 and len(sel.variants_s) == 2
    for c in sel.choices:
        assert len({k.record.sketch for k in c.candidates}) == len(c.candidates) == 2
        net = [k.network_s for k in c.candidates]
        assert all(np.isfinite(net)) and min(net) > 0
        best = int(np.argmin(net))
        assert c.chosen == (best if net[best] < (1 - MARGIN) * net[0] else 0)
    assert sel.kept == (sel.picked_s is not None and sel.picked_s < sel.baseline_s)
    exe = build_model(model, db=db, threads=1)
    assert {s.task: s.config for s in exe.schedules} == sel.configs()
    assert res.configs() == sel.configs()
    with Database(db) as d:
        assert all((d.network_choice(t, TARGET.at_threads(1).key) is not None) == sel.kept for t, _ in model.tasks)
    x = np.random.default_rng(1).standard_normal((1, 16, 8, 8)).astype(np.float32)
    ref = model.run_numpy(x)
    np.testing.assert_allclose(exe(x), ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


@pytest.mark.cc
def test_a_failed_in_network_choice_warns_and_keeps_every_record(tmp_path, runner, monkeypatch):
    import felixjax as fj
    from felixjax import pipeline
    from felixjax.database import Database

    def broken(*args, **kwargs):
        raise RuntimeError("building the network failed (compile_error): boom")

    monkeypatch.setattr(pipeline, "select_in_network", broken)
    model = fj.load_onnx(fj.zoo.make_model("transformer_block", seq=8, dim=16, heads=2))
    db = str(tmp_path / "w.db")
    with pytest.warns(UserWarning, match="in-network choice skipped.*boom"):
        res = fj.tune_model(model, trials=4, strategy="random", db=db, runner=runner, threads=1, progress=False,
                            retime=0)
    assert res.selection is None and res.trials == 4 and all(t.best is not None for t in res.tasks)
    with Database(db) as d:
        assert len(d.records()) == 4
