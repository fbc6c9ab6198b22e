"""The ONNX backend test cases as felixjax test cases (tooling; tests/test_onnx_import.py runs them).

Sources, all offline and shipped with the ``onnx`` wheel:

- ``node``: ``onnx.backend.test.case.node.collect_testcases()`` builds every node test (model + inputs +
  expected outputs) in memory in ~10 s;
- ``pytorch-converted``, ``pytorch-operator``, ``simple``: folders of model.onnx + input/output protobufs.

A case enters the manifest when every node is a supported op, its data tensors are float32 (or a bool / int
output of a comparison, logic op or ArgMax / ArgMin, held as float32 and compared by value), and its
convolutions / pools are 1-D or 2-D. Graph inputs that only feed *parameter* slots (:data:`PARAMETER_SLOTS`:
Reshape's shape, Pad's pads and axes, reduction axes, Slice's starts / ends / axes / steps, Gather's
indices, Resize's roi / scales / sizes, Where's condition, ...) are frozen into initializers with their
test values, as a static-shape exporter would emit them; the manifest lists them per case. Everything else is excluded with its reason.

    python tests/onnx_cases.py      # classify all cases, run the included ones, write
                                    # tests/data/onnx_node_manifest.json and docs/onnx_node_tests.md
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from felixjax.errors import UnsupportedModelError  # noqa: E402
from felixjax.onnx_import import MIN_OPSET, SUPPORTED_OPS, load_onnx  # noqa: E402
from felixjax.onnx_logic import OPS as LOGIC_OPS

HELD_AS_FLOAT = (TensorProto.BOOL, TensorProto.INT64, TensorProto.INT32)

MANIFEST = ROOT / "tests" / "data" / "onnx_node_manifest.json"
REPORT = ROOT / "docs" / "onnx_node_tests.md"
FILE_KINDS = ("pytorch-converted", "pytorch-operator", "simple")
# (op, input index) slots whose value must be known at import time; int/bool graph inputs there are frozen
PARAMETER_SLOTS = {("Reshape", 1), ("Pad", 1), ("Pad", 3), ("ReduceMean", 1), ("ConstantOfShape", 0),
                   ("Dropout", 2), ("Slice", 1), ("Slice", 2), ("Slice", 3), ("Slice", 4), ("Gather", 1),
                   ("Expand", 1), ("Split", 1), ("Squeeze", 1), ("Unsqueeze", 1), ("ReduceSum", 1),
                   ("ReduceMax", 1), ("ReduceMin", 1), ("ReduceProd", 1), ("ReduceL1", 1), ("ReduceL2", 1),
                   ("ReduceSumSquare", 1), ("ReduceLogSum", 1), ("ReduceLogSumExp", 1), ("Resize", 1), ("Resize", 2), ("Resize", 3), ("Upsample", 1),
                   ("Where", 0), ("Tile", 1), ("Trilu", 1), ("GatherND", 1), ("CumSum", 1),
                   ("RotaryEmbedding", 3), ("CenterCropPad", 1), ("Attention", 6), ("TopK", 1),
                   ("GatherElements", 1)}
SPATIAL_OPS = ("Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "ConvTranspose", "GlobalMaxPool")


@dataclass
class Case:
    name: str
    kind: str
    model: onnx.ModelProto
    inputs: list    # numpy arrays (or non-tensor values, which exclude the case)
    outputs: list
    rtol: float
    atol: float

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.name}"


def _array(v):
    return numpy_helper.to_array(v) if isinstance(v, TensorProto) else v


def collect_cases() -> list[Case]:
    """Every node case plus the file-based cases of the onnx wheel, in a stable order."""
    import onnx.backend.test.case.node as node_cases

    with warnings.catch_warnings(), np.errstate(all="ignore"), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        generated = node_cases.collect_testcases()
    cases = []
    for c in generated:
        inputs, outputs = c.data_sets[0]
        cases.append(Case(c.name, "node", c.model, [_array(v) for v in inputs], [_array(v) for v in outputs],
                          c.rtol, c.atol))
    data = Path(onnx.__file__).parent / "backend" / "test" / "data"
    for kind in FILE_KINDS:
        for folder in sorted((data / kind).iterdir()):
            model = onnx.load(str(folder / "model.onnx"))
            ds = folder / "test_data_set_0"
            inputs, outputs = [], []
            for prefix, dest in (("input", inputs), ("output", outputs)):
                for k in range(len(list(ds.glob(f"{prefix}_*.pb")))):
                    t = TensorProto()
                    t.ParseFromString((ds / f"{prefix}_{k}.pb").read_bytes())
                    dest.append(numpy_helper.to_array(t))
            cases.append(Case(folder.name, kind, model, inputs, outputs, 1e-3, 1e-7))
    return cases


def _runtime_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def classify(case: Case) -> tuple[str | None, list[str]]:
    """``(None, frozen input names)`` if the case belongs in the manifest, else ``(reason, [])``."""
    g = case.model.graph
    ops = sorted({n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in g.node})
    bad = [op for op in ops if op not in SUPPORTED_OPS]
    if bad:
        return f"unsupported ops: {', '.join(bad)}", []
    opset = max((o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset < MIN_OPSET:
        return f"opset {opset} < {MIN_OPSET}", []
    for vi in list(g.input) + list(g.output):
        if not vi.type.HasField("tensor_type"):
            return f"non-tensor value {vi.name!r}", []
    producer = {o: n.op_type for n in g.node for o in n.output}
    for vi in g.output:  # a mask or an index is held as float32 (felixjax.onnx_logic): compared by value
        if vi.type.tensor_type.elem_type != TensorProto.FLOAT and not (
                vi.type.tensor_type.elem_type in HELD_AS_FLOAT and producer.get(vi.name) in LOGIC_OPS):
            return f"non-float32 output {vi.name!r} ({TensorProto.DataType.Name(vi.type.tensor_type.elem_type)})", []
    frozen = []
    for vi in _runtime_inputs(case.model):
        elem = vi.type.tensor_type.elem_type
        slots = [(n.op_type, k) for n in g.node for k, i in enumerate(n.input) if i == vi.name]
        if elem == TensorProto.FLOAT and not (slots and all(s in PARAMETER_SLOTS for s in slots)):
            continue
        if slots and all(s in PARAMETER_SLOTS for s in slots):
            frozen.append(vi.name)
        else:
            return f"non-float32 data input {vi.name!r} ({TensorProto.DataType.Name(elem)})", []
    try:
        inferred = onnx.shape_inference.infer_shapes(case.model)
    except Exception:
        inferred = case.model
    ranks = {vi.name: len(vi.type.tensor_type.shape.dim)
             for vi in list(inferred.graph.input) + list(inferred.graph.value_info) if vi.type.HasField("tensor_type")}
    for n in g.node:
        if n.op_type in SPATIAL_OPS and ranks.get(n.input[0], 4) not in (3, 4):
            return f"not 1-D or 2-D spatial ({ranks[n.input[0]] - 2}-D {n.op_type})", []
    return None, frozen  # (1-D convolution and pooling run as 2-D with a unit height)


def prepare(case: Case, frozen: list[str]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The case's model with ``frozen`` inputs turned into initializers, and the feeds for the rest."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    runtime = _runtime_inputs(case.model)
    values = dict(zip([vi.name for vi in runtime], case.inputs))
    feeds = {}
    for vi in runtime:
        if vi.name in frozen:
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(values[vi.name]), vi.name))
            model.graph.input.remove(next(v for v in model.graph.input if v.name == vi.name))
        else:
            feeds[vi.name] = values[vi.name]
    return model, feeds


def run_case(case: Case, frozen: list[str]) -> tuple[str, str]:
    """``("pass" | "unsupported" | "fail", detail)`` for one case: import, run in numpy, compare.
    A passing case's detail names the Task anchors it ran through, if any."""
    model, feeds = prepare(case, frozen)
    try:
        m = load_onnx(model)
    except UnsupportedModelError as e:
        return "unsupported", str(e)
    except Exception as e:  # a crash on a supported-looking model is a bug
        return "fail", f"import crashed: {type(e).__name__}: {e}"
    try:
        got = m.run_numpy(feeds)
    except Exception as e:
        return "fail", f"run crashed: {type(e).__name__}: {e}"
    got = got if isinstance(got, list) else [got]
    if (wrong := output_mismatch(got, case)) is not None:
        return "fail", wrong
    return "pass", ", ".join(n.task.name for n in m.graph.anchors)


def output_mismatch(got: list, case) -> str | None:
    """Why ``got`` differs from the case's expected outputs (count, dtype, shape, values), or None."""
    if len(got) != len(case.outputs):
        return f"{len(got)} outputs, expected {len(case.outputs)}"
    for k, (y, ref) in enumerate(zip(got, case.outputs)):
        ref = np.asarray(ref)
        exact = ref.dtype != np.float32 and y.dtype == np.float32 and ref.dtype in (np.bool_, np.int64, np.int32) \
            and (ref.size == 0 or abs(ref.astype(np.int64)).max() < 2**24)
        if exact:  # a mask or an index, held as float32: its values compared exactly (not at the case's rtol)
            if y.shape != ref.shape or not np.array_equal(y, ref.astype(np.float32)):
                return f"output {k}: {y.tolist()[:8]} ..., expected {ref.tolist()[:8]} ... (exactly)"
            continue
        if y.shape != ref.shape or y.dtype != ref.dtype:
            return f"output {k}: {y.dtype}{y.shape}, expected {ref.dtype}{ref.shape}"
        try:
            np.testing.assert_allclose(y, ref, rtol=case.rtol, atol=case.atol)
        except AssertionError as e:
            return f"output {k} differs: " + " ".join(str(e).split())[:300]
    return None


def build_manifest(cases: list[Case]) -> dict:
    """Classify every case and run the included ones; the manifest records the verdicts."""
    included, excluded = [], {}
    for case in cases:
        reason, frozen = classify(case)
        if reason is not None:
            excluded[case.key] = reason
            continue
        status, detail = run_case(case, frozen)
        included.append({"key": case.key, "ops": sorted({n.op_type for n in case.model.graph.node}),
                         "opset": max(o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx")),
                         "frozen_inputs": frozen, "status": status, "detail": detail})
    kinds = sorted({c.kind for c in cases})
    by_kind = {k: {"total": sum(c.kind == k for c in cases),
                   "included": sum(x["key"].startswith(k + "/") for x in included)} for k in kinds}
    return {"onnx_version": onnx.__version__, "by_kind": by_kind,
            "criteria": "every node a supported op, float32 data tensors, 1-D or 2-D convolution and pooling, opset >= "
                        f"{MIN_OPSET}; int/bool inputs feeding only parameter slots are frozen to initializers",
            "counts": _counts(included, len(cases)), "cases": included, "excluded": excluded}


def _counts(included: list[dict], total: int) -> dict:
    statuses = [c["status"] for c in included]
    return {"total": total, "included": len(included), "pass": statuses.count("pass"),
            "unsupported": statuses.count("unsupported"), "fail": statuses.count("fail"),
            "pass_with_frozen_inputs": sum(c["status"] == "pass" and bool(c["frozen_inputs"]) for c in included),
            "pass_through_task_anchors": sum(c["status"] == "pass" and bool(c["detail"]) for c in included)}


def write_report(manifest: dict, path: Path = REPORT, *, seconds: float | None = None) -> None:
    c = manifest["counts"]
    by_reason: dict[str, int] = {}
    for reason in manifest["excluded"].values():
        head = reason.split(":")[0].split(" (")[0].split(" '")[0]
        by_reason[head] = by_reason.get(head, 0) + 1
    lines = [
        "# ONNX backend node tests",
        "",
        f"Generated by `python tests/onnx_cases.py` with onnx {manifest['onnx_version']}"
        + (f" in {seconds:.0f} s" if seconds else "") + "; checked by `tests/test_onnx_import.py`.",
        "Each included case runs through `load_onnx` + `Model.run_numpy` (the C build will replace the numpy",
        "executor) and is compared with the expected outputs at the case's own tolerance (rtol 1e-3, atol 1e-7).",
        "Node cases feed weights as graph inputs, so their Conv / Gemm / MatMul stay cheap ops (Conv still runs",
        "through `Task.reference`); the pytorch cases carry constant weights and run through fused Task anchors.",
        "",
        f"Of {c['total']} cases, {c['included']} are in the manifest ({manifest['criteria']}):",
        ", ".join(f"{k} {v['included']} of {v['total']}" for k, v in manifest["by_kind"].items()) + ".",
        "",
        "| verdict | cases |",
        "| --- | ---: |",
        f"| pass | {c['pass']} ({c['pass_through_task_anchors']} through a fused Task anchor, "
        f"{c['pass_with_frozen_inputs']} with integer inputs frozen) |",
        f"| unsupported (clear error) | {c['unsupported']} |",
        f"| fail | {c['fail']} |",
        "",
    ]
    unsupported = [x for x in manifest["cases"] if x["status"] != "pass"]
    if unsupported:
        lines += ["## Not passing", "", "| case | verdict | error |", "| --- | --- | --- |"]
        lines += [f"| {x['key']} | {x['status']} | {x['detail'].replace('|', '/')} |" for x in unsupported]
        lines.append("")
    lines += ["## Excluded from the manifest", "", "| reason | cases |", "| --- | ---: |"]
    lines += [f"| {r} | {n} |" for r, n in sorted(by_reason.items(), key=lambda kv: -kv[1])]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    t0 = time.time()
    manifest = build_manifest(collect_cases())
    MANIFEST.parent.mkdir(parents=True, exist_ok=True)
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    write_report(manifest, seconds=time.time() - t0)
    print(json.dumps(manifest["counts"]))
    for x in manifest["cases"]:
        if x["status"] != "pass":
            print(f"{x['status']:<12} {x['key']}: {x['detail']}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
