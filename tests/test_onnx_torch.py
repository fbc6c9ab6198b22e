"""Models exported by torch.onnx, by the TorchScript exporter (``NAME.onnx``, opsets 13 / 17) and by the
torch.export-based one (``NAME_dynamo.onnx``, opset 20), dynamic batch, random weights (written by
tests/fixtures/make_torch_models.py, which names the torch version in each file's doc_string): imported
with the batch pinned, run in numpy and compiled to C, compared with onnxruntime. torch is not needed."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import felixjax as fj
from felixjax.errors import UnsupportedModelError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "torch"
_SHAPES = {"mobilenetv3_small": (3, 64, 64), "yolo_style": (3, 64, 64), "unet_decoder": (3, 32, 32),
           "vit_tiny": (3, 32, 32)}
MODELS = {**_SHAPES, **{f"{k}_dynamo": v for k, v in _SHAPES.items()}}


def _ort(path: Path, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_fixtures_are_small_and_name_their_exporter():
    for name in MODELS:
        path = FIXTURES / f"{name}.onnx"
        assert path.stat().st_size <= 2 * 2**20
        doc = onnx.load(str(path)).doc_string
        assert "torch" in doc and ("torch.export" if name.endswith("_dynamo") else "TorchScript") in doc


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("batch", [1, 2])
def test_torch_export_matches_onnxruntime(name, batch):
    path = FIXTURES / f"{name}.onnx"
    shape = (batch,) + MODELS[name]
    with pytest.raises(UnsupportedModelError, match=r"input 'x' has a dynamic shape.*--input-shape x="):
        fj.load_onnx(path)
    x = np.random.default_rng(batch).standard_normal(shape).astype(np.float32)
    refs = _ort(path, {"x": x})
    model = fj.load_onnx(path, input_shapes={"x": shape})
    assert model.tasks and not any(n.op in ("Shape", "Gather", "Unsqueeze") and n.inputs[0] == "x"
                                   for n in model.graph.nodes)
    y_np = model.run_numpy(x)
    y_np = y_np if isinstance(y_np, list) else [y_np]
    runs = [("numpy", y_np)]
    if batch == 1:  # one C build per model keeps this file fast; the numpy executor covers batch 2
        runs.append(("C", fj.build_model(model, threads=1).run({"x": x})))
    for where, got in runs:
        assert len(got) == len(refs)
        for y, ref in zip(got, refs):
            assert y.shape == ref.shape
            err = float(np.abs(y - ref).max()) / float(np.abs(ref).max())
            assert err <= 1e-3, f"{name} ({where}): relative error {err:.2e}"


@pytest.mark.cc
def test_standalone_export_runs_the_new_ops(tmp_path):
    """The exported folder (make, demo) runs Resize / Split / Sigmoid / Pow / Transpose as the library does."""
    import subprocess

    path = FIXTURES / "yolo_style.onnx"
    model = fj.load_onnx(path, input_shapes={"x": (1, 3, 64, 64)})
    out = fj.build_model(model, threads=1).export(tmp_path / "yolo")
    subprocess.run(["make", "-s", "-C", str(out)], check=True, capture_output=True)
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    x.tofile(out / "inputs.bin")
    subprocess.run([str(out / "demo"), str(out / "weights.bin"), str(out / "inputs.bin"), str(out / "outputs.bin")],
                   check=True, capture_output=True)
    ref = np.concatenate([r.reshape(-1) for r in _ort(path, {"x": x})])
    y = np.fromfile(out / "outputs.bin", np.float32)
    assert y.shape == ref.shape and float(np.abs(y - ref).max()) <= 1e-4 * float(np.abs(ref).max())
