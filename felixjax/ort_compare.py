"""Against onnxruntime: a session with pinned threads, an output check and interleaved timing of a
compiled model next to onnxruntime."""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from .baselines import time_blocks as time_interleaved
from .network_build import CompiledModel


def _ort_session(onnx_model: Any, threads: int, *, spinning: bool = True):
    """An onnxruntime session at its default options, as users run it, but ``threads`` (spinning
    on unless ``spinning=False``)."""
    import onnx
    import onnxruntime as ort

    if isinstance(onnx_model, onnx.ModelProto):
        data = onnx_model.SerializeToString()
    elif isinstance(onnx_model, (bytes, bytearray)):
        data = bytes(onnx_model)
    else:
        data = Path(onnx_model).read_bytes()
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def compare_onnxruntime(compiled: CompiledModel, onnx_model: Any, *, threads: int | None = None, rounds: int = 5,
                        min_time_s: float = 0.1, seed: int = 0, rtol: float = 1e-3) -> dict:
    """Check the compiled model against onnxruntime on random inputs, then time both interleaved
    (A B A B ..., same threads, onnxruntime at its defaults with a pause before each block; ours timed in C, onnxruntime through IO
    binding to preallocated buffers).

    Returns:
        ``felixjax_ms`` / ``onnxruntime_ms`` (medians), ``*_min_ms``, ``speedup`` (onnxruntime median /
        ours), ``max_rel_err`` (max |ours - ort| / max |ort|), ``threads``, ``rounds``.

    Raises:
        AssertionError: the outputs differ beyond ``rtol`` (relative to each output's largest magnitude).
    """
    threads = int(threads or compiled.target.cores)
    compiled.set_threads(threads)
    sess = _ort_session(onnx_model, threads)
    rng = np.random.default_rng(seed)
    ins = [rng.standard_normal(s).astype(np.float32) for s in compiled.net.input_shapes]
    ours = compiled.run(ins)
    names = [i.name for i in sess.get_inputs()]
    ref = sess.run(None, dict(zip(names, ins)))
    err = 0.0
    for k, (y, r) in enumerate(zip(ours, ref)):
        scale = max(float(np.abs(r).max()), 1e-30)
        e = float(np.abs(y - r).max()) / scale
        err = max(err, e)
        if not e <= rtol:
            raise AssertionError(f"output {k} differs from onnxruntime: max |diff| / max |ref| = {e:.3g}")
    binding = sess.io_binding()
    for name, x in zip(names, ins):
        binding.bind_input(name, "cpu", 0, np.float32, list(x.shape), x.ctypes.data)
    ort_outs = [np.empty(r.shape, np.float32) for r in ref]
    for o, y in zip(sess.get_outputs(), ort_outs):
        binding.bind_output(o.name, "cpu", 0, np.float32, list(y.shape), y.ctypes.data)
    lib_ins = compiled._inputs(ins)
    lib_outs = compiled.library.new_outputs()

    def ort_block(number: int) -> float:
        t0 = time.perf_counter()
        for _ in range(number):
            sess.run_with_iobinding(binding)
        return time.perf_counter() - t0

    def fj_block(number: int) -> float:
        return compiled.library.timeit(lib_ins, lib_outs, number)

    times = time_interleaved({"felixjax": fj_block, "onnxruntime": ort_block}, rounds=rounds, min_time_s=min_time_s)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"felixjax_ms": med["felixjax"] * 1e3, "onnxruntime_ms": med["onnxruntime"] * 1e3,
            "felixjax_min_ms": min(times["felixjax"]) * 1e3, "onnxruntime_min_ms": min(times["onnxruntime"]) * 1e3,
            "speedup": med["onnxruntime"] / med["felixjax"], "max_rel_err": err, "threads": threads,
            "rounds": rounds}
