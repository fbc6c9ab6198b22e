"""felixjax.baselines: every peer computes what Task.reference computes; interleaved timing alternates."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from codegen.ops import conv2d, dense, depthwise_conv2d, matmul
from codegen.space import Space, sketches_for
from codegen.target import Target
from felixjax import baselines

TASKS = {
    "matmul": matmul(33, 20, 17),
    "batch_matmul_bias_res": matmul(7, 16, 13, batch=2, bias=True, residual=True),
    "dense_bias_relu": dense(3, 40, 24, bias=True, act="relu"),
    "conv_groups_stride_asympad_res_relu6": conv2d(1, 8, 11, 9, out_channels=12, kernel=(3, 2), stride=(2, 1),
                                                   padding=(1, 0, 2, 1), dilation=(1, 2), groups=2, bias=True,
                                                   residual=True, act="relu6"),
    "depthwise": depthwise_conv2d(1, 16, 10, 10, kernel=3, padding=1, bias=True, act="relu"),
}


@pytest.fixture(scope="module")
def inputs():
    out = {}
    for name, t in TASKS.items():
        arrays = t.random_inputs(seed=1)
        out[name] = (arrays, t.reference(*arrays))
    return out


@pytest.mark.parametrize("peer", baselines.CONTENDERS)
@pytest.mark.parametrize("name", list(TASKS))
def test_peer_matches_reference(peer, name, inputs):
    pytest.importorskip({"onnxruntime": "onnxruntime", "jax": "jax", "numpy": "numpy"}[peer])
    task = TASKS[name]
    if peer not in baselines.applicable(task):
        with pytest.raises(ValueError, match="not supported"):
            baselines.numpy_contender(task, inputs[name][0])
        return
    arrays, expected = inputs[name]
    c = baselines.make_contenders(task, arrays, threads=1, which=(peer,), expected=expected)[peer]
    c.check()  # before timing
    c.timeit(3)
    c.check(run=False)  # the output left by the timed calls
    np.testing.assert_allclose(c.output(), expected, rtol=1e-4, atol=1e-4)
    c.close()


@pytest.mark.cc
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize("name", ["matmul", "dense_bias_relu", "conv_groups_stride_asympad_res_relu6"])
def test_our_kernel_contender(name, inputs):
    task = TASKS[name]
    arrays, expected = inputs[name]
    target = Target.cpu()
    cfg = Space(task, sketches_for(task)[-1], target).default()
    c = baselines.kernel_contender(task, cfg, arrays, threads=1, target=target, expected=expected)
    c.check()
    assert c.timeit(4) > 0
    c.check(run=False)


@pytest.mark.cc
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize("task", [conv2d(1, 5, 9, 11, out_channels=7, kernel=3, stride=2, padding=1, bias=True,
                                         act="relu6", dtype="int8"),
                                  matmul(4, 16, 8, dtype="float16"),
                                  dense(2, 32, 16, dtype="int8", out_dtype="int8")])
def test_low_precision_kernel_contenders_get_their_own_dtypes(task):
    # session 73: every contender buffer was float32, so an int8 / float16 kernel read float32 bytes as its own
    # type and `felixjax tune --op ...dtype=int8` reported a correct kernel as a wrong result
    target = Target.cpu()
    arrays = task.random_inputs(seed=0)
    for sketch in sketches_for(task, target):
        c = baselines.kernel_contender(task, Space(task, sketch, target).default(), arrays, threads=1, target=target)
        c.check()
        assert c.output().dtype == c.plan.arg_dtypes()[-1]


def test_wrong_output_is_caught(inputs):
    pytest.importorskip("onnxruntime")
    arrays, expected = inputs["matmul"]
    c = baselines.ort_contender(TASKS["matmul"], arrays, expected=expected + 1.0)
    with pytest.raises(AssertionError, match="wrong result"):
        c.check()


def test_checked_medians_checks_before_and_after_timing(inputs):
    """The probes' A/B step: medians of every contender; one whose output goes wrong while it is timed
    (here: starts accumulating into its output after its first check) raises instead of being reported."""

    class Drifting(baselines.Contender):
        name = "drifting"

        def __init__(self, task, arrays, expected):
            self.task, self.threads, self.expected = task, 1, expected
            self.arrays, self.calls, self.out = arrays, 0, None

        def __call__(self):
            self.calls += 1
            y = self.arrays[0] @ self.arrays[1]
            self.out = y if self.calls <= 1 else y * 2.0  # right once, wrong from then on

        def output(self):
            return self.out

    arrays, expected = inputs["matmul"]
    good = Drifting(TASKS["matmul"], arrays, expected)
    ok = baselines.checked_medians({"numpy": baselines.numpy_contender(TASKS["matmul"], arrays, expected=expected)},
                                   rounds=2, min_time_s=1e-3, pause_s=0.0)
    assert set(ok) == {"numpy"} and ok["numpy"] > 0
    with pytest.raises(AssertionError, match="wrong result"):
        baselines.checked_medians({"drifting": good}, rounds=2, min_time_s=1e-3, pause_s=0.0)
    assert good.calls > 2  # it passed its first check and was timed before the second caught it


def test_onnx_model_is_valid_and_old_enough():
    onnx = pytest.importorskip("onnx")
    for name, task in TASKS.items():
        model = baselines.onnx_model(task, task.random_inputs())
        onnx.checker.check_model(model)
        assert model.ir_version <= 10, name
        assert all(o.version <= 17 for o in model.opset_import), name
        weights = {i.name for i in model.graph.initializer}
        assert "w" in weights and ("b" in weights) == task.bias, name  # constants, so ORT can prepack
        assert [i.name for i in model.graph.input] == ["x"] + (["residual"] if task.residual else [])


def test_time_interleaved_alternates():
    calls: list[str] = []
    contenders = {n: (lambda n=n: calls.append(n)) for n in "abc"}
    times = baselines.time_interleaved(contenders, rounds=3, min_time_s=0.0, warmup=0, pause_s=0.0, settle=0)
    assert list(times) == ["a", "b", "c"] and all(len(v) == 3 for v in times.values())
    # after calibration (one call each at min_time_s=0): a b c a b c a b c
    assert calls[-9:] == list("abc") * 3
    # with settling: two untimed calls right before every timed one
    calls.clear()
    baselines.time_interleaved(contenders, rounds=2, min_time_s=0.0, warmup=0, pause_s=0.0, settle=2)
    assert calls[-18:] == [c for c in "abc" for _ in range(3)] * 2
    s = baselines.summarize({"x": [3.0, 1.0, 2.0]})["x"]
    assert (s.median_s, s.min_s) == (2.0, 1.0)
    assert s.gflops(2e9) == (1.0, 2.0)


def test_calibration_reaches_min_time():
    # a counting clock, no real one: each call "takes" 1e-4 s; a block must reach min_time_s, within max_number
    asked = []

    def timeit(n: int) -> float:
        asked.append(n)
        return n * 1e-4

    number = baselines._calibrate(timeit, min_time_s=0.005, max_number=100_000)
    assert number * 1e-4 >= 0.005 and number <= 0.005 / 1e-4 * 1.2 + 1  # long enough, not far past it
    assert asked[0] == 1 and asked[-1] == number
    assert baselines._calibrate(timeit, min_time_s=10.0, max_number=300) == 300  # capped
    assert baselines._calibrate(lambda n: 1.0, min_time_s=0.005, max_number=100) == 1  # one call is enough


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux affinity API")
def test_pinned_restores_affinity():
    before = os.sched_getaffinity(0)
    cpu = min(before)
    with baselines.pinned({cpu}):
        assert os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == before


def test_blas_threads_context():
    a = np.ones((32, 32), np.float32)
    setters = baselines._openblas_setters()
    before = [get() for _, get in setters]
    with baselines.blas_threads(1) as how:
        np.testing.assert_allclose(a @ a, 32.0)
        if how == "openblas":
            assert [get() for _, get in setters] == [1] * len(setters)
    assert how in ("threadpoolctl", "openblas", "none")
    assert [get() for _, get in setters] == before


@pytest.mark.slow
@pytest.mark.cc
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_kernels_benchmark_smoke():
    """benchmarks/kernels.py runs end to end on a tiny op (no --write) and prints its table."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("onnxruntime")
    pytest.importorskip("jax")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "kernels.py"), "--quick", "--threads", "1",
                           "--random", "2", "--ops", "matmul:m=48;n=32;k=16;bias=1;act=relu"],
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| matmul_48x32x16_bias_relu |" in proc.stdout
    assert "error" not in proc.stdout.split("### 1 thread", 1)[1], proc.stdout
