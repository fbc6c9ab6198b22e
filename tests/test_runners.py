"""The Runner protocol (codegen.run): the local process runner builds and measures, the replay runner
answers without a compiler, and the Measurer lets a protocol runner decide where builds happen."""
from __future__ import annotations

import numpy as np
import pytest

from codegen import ops
from codegen.build import BuildResult
from codegen.lower import lower
from codegen.measure import TIMING_HARNESS_C, LocalRunner, MeasureResult, RunRequest
from codegen.render_c import render
from codegen.run import LocalProcessRunner, ReplayRunner, Runner, run_many
from codegen.space import Space
from codegen.target import Target

VADD = """void fj_kernel(void* const* b) {
  const float* x = b[0]; const float* y = b[1]; float* z = b[2];
  for (int i = 0; i < 64; ++i) z[i] = x[i] + y[i];
}""" + TIMING_HARNESS_C


def test_runners_implement_the_protocol():
    assert isinstance(ReplayRunner({}), Runner)
    assert issubclass(LocalProcessRunner, LocalRunner)
    runner = LocalProcessRunner(lock=False)
    try:
        assert isinstance(runner, Runner)
    finally:
        runner.close()
    # a bare LocalRunner measures but does not build: not a Runner (the Measurer builds for it)
    bare = LocalRunner(lock=False)
    try:
        assert not isinstance(bare, Runner)
    finally:
        bare.close()


@pytest.mark.cc
def test_local_process_runner_builds_and_runs(tmp_path):
    x = np.arange(64, dtype=np.float32)
    with LocalProcessRunner(cache_dir=tmp_path, build_workers=2, lock=False) as runner:
        good, bad = runner.build([VADD, "void fj_kernel(void* const* b) { this is not C; }"])
        assert good.status == "ok" and bad.status == "compile_error"
        req = RunRequest(None, [x, x], (64,), 0, 2 * x)
        ok, failed = run_many(runner, [req, req], [good, bad])
    assert ok.status == "ok" and ok.latency_s > 0
    assert failed.status == "compile_error"


@pytest.mark.cc
def test_local_process_runner_runs_a_rendered_kernel(tmp_path):
    """The void* ABI end to end: a rendered kernel with a byte workspace and a data copy."""
    task = ops.conv2d(1, 8, 9, 9, out_channels=16, kernel=3, padding=1, bias=True, act="relu")
    sp = Space(task, "conv_spatial_pack", Target.cpu())
    plan = lower(sp, sp.default())
    assert plan.workspace_bytes == 4 * plan.workspace > 0
    arrays = task.random_inputs(seed=1)
    with LocalProcessRunner(cache_dir=tmp_path, lock=False) as runner:
        [b] = runner.build([render(plan)])
        req = RunRequest(None, plan.kernel_inputs(list(arrays)), task.output_shape, plan.workspace_bytes,
                         task.reference(*arrays), reduction_size=plan.con.reduction_size,
                         out_dtype=plan.arg_dtypes()[-1].name)
        res = runner.run(req, build=b)
    assert res.status == "ok", res.error


def test_replay_runner_answers_per_source():
    req = RunRequest(None, [], (1,), 0, np.zeros(1))
    runner = ReplayRunner({"a": 2e-3, "b": MeasureResult("wrong_result", error="planted"), "c": float("nan")})
    a, b, c, d = runner.build(["a", "b", "c", "d"])
    assert all(x.status == "ok" for x in (a, b, c, d)) and a.lib_path != b.lib_path
    assert runner.run(req, build=a).latency_s == 2e-3
    assert runner.run(req, build=b).status == "wrong_result"
    assert runner.run(req, build=c).status == "runtime_error"  # non-finite latency
    assert runner.run(req, build=d).status == "runtime_error"  # not recorded
    assert runner.run(req, build=BuildResult("compile_error", None, "boom", 0.0, False)).status == "compile_error"
    assert runner.runs == ["a", "b", "c", "d"]


def test_measurer_builds_through_a_protocol_runner(monkeypatch):
    """With a Runner, the Measurer never calls the compiler itself: the runner builds."""
    import felixjax.measurer as measurer_mod

    def no_local_builds(*a, **k):
        raise AssertionError("the Measurer compiled locally although its runner builds")

    monkeypatch.setattr(measurer_mod, "build_many", no_local_builds)
    task = ops.matmul(16, 16, 16)
    target = Target.cpu()
    runner = ReplayRunner(lambda source: 1e-6 * (1 + len(source) % 7))
    m = measurer_mod.Measurer(task, target, runner, threads=1)
    sp = Space(task, "gemm_packed", target)
    configs = [sp.default()] + sp.sample_many(np.random.default_rng(0), 3)
    got = []
    m.measure(configs, lambda cfg, res: got.append((cfg, res.status)) or True)
    assert [c for c, _ in got] == configs and all(s == "ok" for _, s in got)
    assert len(runner.runs) == 4 and all("fj_kernel(void* const* bufs)" in s for s in runner.runs)
