"""Tests of the build + measure bottom: Target, builder cache, tolerance, and the runner's
handling of planted bad kernels (each followed by a good one: the runner must keep working)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from codegen.build import DEFAULT_FLAGS, BuildError, assemble, build, build_many
from codegen.measure import (
    STATUSES,
    TIMING_HARNESS_C,
    LocalRunner,
    MeasureResult,
    RunRequest,
    TimingProtocol,
    check_output,
)
from codegen.target import L3_CAP_PER_CORE, Target

N = 1000  # not a multiple of 16: tails matter


def _kernel(body: str) -> str:
    return "#include <stddef.h>\n#include <stdint.h>\n" + body + TIMING_HARNESS_C


VADD = _kernel("""
void fj_kernel(float* const* bufs) {
  const float* a = bufs[0]; const float* b = bufs[1]; float* out = bufs[2];
  for (int i = 0; i < 1000; ++i) out[i] = a[i] + b[i];
}""")

MATMUL = _kernel("""
/* out[32x48] = a[32x64] @ b[64x48], parallel over rows. */
void fj_kernel(float* const* bufs) {
  const float* a = bufs[0]; const float* b = bufs[1]; float* out = bufs[2];
  #pragma omp parallel for
  for (int i = 0; i < 32; ++i)
    for (int j = 0; j < 48; ++j) {
      float acc = 0.0f;
      for (int k = 0; k < 64; ++k) acc += a[i * 64 + k] * b[k * 48 + j];
      out[i * 48 + j] = acc;
    }
}""")

PLANTED = {
    "segfault": _kernel("""
void fj_kernel(float* const* bufs) { volatile float* p = NULL; *p = bufs[0][0]; }"""),
    "hang": _kernel("""
void fj_kernel(float* const* bufs) { volatile int spin = 1; while (spin) {} bufs[2][0] = 0; }"""),
    "past_end": _kernel("""
void fj_kernel(float* const* bufs) {
  for (int i = 0; i <= 1000; ++i) bufs[2][i] = bufs[0][i] + bufs[1][i < 1000 ? i : 0];
}"""),
    "before_start": _kernel("""
void fj_kernel(float* const* bufs) {
  for (int i = 0; i < 1000; ++i) bufs[2][i] = bufs[0][i] + bufs[1][i];
  bufs[2][-3] = 1.0f;
}"""),
    "writes_input": _kernel("""
void fj_kernel(float* const* bufs) {
  float* a = bufs[0];
  for (int i = 0; i < 1000; ++i) { bufs[2][i] = a[i] + bufs[1][i]; a[i] = 0.0f; }
}"""),
    "accumulates": _kernel("""
static int calls = 0;
void fj_kernel(float* const* bufs) {
  /* Correct on the first call only: the classic "out += ..." without zeroing. */
  if (calls++ == 0) for (int i = 0; i < 1000; ++i) bufs[2][i] = 0.0f;
  for (int i = 0; i < 1000; ++i) bufs[2][i] += bufs[0][i] + bufs[1][i];
}"""),
    "half": _kernel("""
void fj_kernel(float* const* bufs) {
  for (int i = 0; i < 500; ++i) bufs[2][i] = bufs[0][i] + bufs[1][i];
}"""),
    "off_by_1pct": _kernel("""
void fj_kernel(float* const* bufs) {
  for (int i = 0; i < 1000; ++i) bufs[2][i] = 1.01f * (bufs[0][i] + bufs[1][i]);
}"""),
    "no_abi": "void fj_kernel(float* const* bufs) { (void)bufs; }\n",
}

ALIGNMENT = _kernel("""
/* out[i] = 1 when buffer i (input 0, input 1, output, empty workspace) is 64-byte aligned. */
void fj_kernel(float* const* bufs) {
  for (int i = 0; i < 4; ++i) bufs[2][i] = ((uintptr_t)bufs[i] % 64) == 0;
}""")


PREPARED = _kernel("""
/* Packs 2*b into the workspace once (fj_prepare); the kernel reads the packed copy. */
void fj_prepare(float* const* bufs) {
  for (int i = 0; i < 1000; ++i) bufs[3][i] = 2.0f * bufs[1][i];
}
void fj_kernel(float* const* bufs) {
  for (int i = 0; i < 1000; ++i) bufs[2][i] = bufs[0][i] + 0.5f * bufs[3][i];
}""")
UNPREPARED = _kernel(PREPARED[PREPARED.index("void fj_kernel") : PREPARED.index("\n/* felixjax")])


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("build-cache")


@pytest.fixture(scope="module")
def libs(cache_dir):
    names = ["vadd", "matmul", "alignment", "prepared", "unprepared", *PLANTED]
    sources = [VADD, MATMUL, ALIGNMENT, PREPARED, UNPREPARED, *PLANTED.values()]
    results = build_many(sources, workers=2, cache_dir=cache_dir)
    assert all(r.status == "ok" for r in results), [r.error for r in results if r.error]
    return {n: r.lib_path for n, r in zip(names, results)}


@pytest.fixture(scope="module")
def runner():
    with LocalRunner(protocol=TimingProtocol.quick(), timeout_s=10.0) as r:
        yield r


def _vadd_request(lib_path, **kw) -> RunRequest:
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
    return RunRequest(lib_path, [a, b], (N,), 0, a.astype(np.float64) + b, **kw)


def _assert_good(runner, libs):
    res = runner.run(_vadd_request(libs["vadd"]))
    assert res.status == "ok", res.error
    assert len(res.latencies) == 3
    assert all(math.isfinite(t) and t > 0 for t in res.latencies)


# -- Target ------------------------------------------------------------------------------------


def test_target_cpu_is_sane():
    t = Target.cpu()
    assert t.kind == "cpu" and t.name
    assert t.cores >= 1
    assert t.simd_lanes in (4, 8, 16)
    assert t.vector_registers in (16, 32)
    assert 4096 <= t.l1d_bytes < t.l2_bytes
    assert 0 < t.l3_bytes <= L3_CAP_PER_CORE
    assert t.peak_gflops_per_core is None


def test_target_json_round_trip_and_key():
    t = Target.cpu()
    d = json.loads(json.dumps(t.to_json()))
    assert Target.from_json(d) == t
    assert Target.from_json(d).key == t.key
    assert re.fullmatch(r"[0-9a-f]{16}", t.key)
    assert Target.cpu().key == t.key  # stable across calls
    # A measured peak does not change the identity; a different core count does.
    assert dataclasses.replace(t, peak_gflops_per_core=150.0).key == t.key
    assert Target.cpu(cores=t.cores + 1).key != t.key


def test_target_overrides():
    t = Target.cpu(cores=1, l2_bytes=1 << 20, peak_gflops_per_core=170.0)
    assert (t.cores, t.l2_bytes, t.peak_gflops_per_core) == (1, 1 << 20, 170.0)
    with pytest.raises(TypeError):
        Target.cpu(not_a_field=1)
    with pytest.raises(ValueError):
        Target.cpu(cores=0)


# -- tolerance ---------------------------------------------------------------------------------


def test_check_output_tolerates_rounding_of_cancelling_sums():
    rng = np.random.default_rng(1)
    K = 4096
    a = rng.standard_normal((16, K)).astype(np.float32)
    b = rng.standard_normal((K, 16)).astype(np.float32)
    b[:, 0] = 0.0
    a[0] = np.concatenate([a[0, : K // 2], -a[0, : K // 2]])
    b[:, 1] = np.concatenate([b[: K // 2, 1], b[: K // 2, 1]])  # row 0 . col 1 cancels to ~0
    ref = a.astype(np.float64) @ b.astype(np.float64)
    y = np.zeros((16, 16), np.float32)
    for k in range(K):  # float32 sequential sum: the worst common summation order
        y += np.outer(a[:, k], b[k, :])
    assert abs(ref[0, 1]) < 1e-9 and y[0, 1] != 0.0
    ok, msg = check_output(y, ref, K)
    assert ok, msg


def test_check_output_rejects_one_percent_error():
    ref = np.linspace(-3.0, 3.0, 101)
    ok, msg = check_output((ref * 1.01).astype(np.float32), ref, K=1)
    assert not ok
    assert "out of tolerance" in msg and "at (" in msg
    assert check_output(ref.astype(np.float32), ref, K=1)[0]


def test_check_output_rejects_nonfinite_and_shape():
    ref = np.ones((4, 4))
    y = np.ones((4, 4), np.float32)
    y[2, 3] = np.nan
    ok, msg = check_output(y, ref, K=8)
    assert not ok and "NaN" in msg and "(2, 3)" in msg
    assert not check_output(np.ones(16, np.float32), ref, K=8)[0]


def test_check_output_all_zero_reference():
    ref = np.zeros(8)
    assert check_output(np.zeros(8, np.float32), ref, K=100)[0]
    assert not check_output(np.full(8, 1e-3, np.float32), ref, K=100)[0]


# -- records -----------------------------------------------------------------------------------


def test_measure_result_json_and_latency():
    ok = MeasureResult("ok", (3e-3, 1e-3, 2e-3), build_s=0.2, run_s=0.1)
    assert ok.latency_s == 2e-3
    assert MeasureResult.from_json(json.loads(json.dumps(ok.to_json()))) == ok
    bad = MeasureResult("wrong_result", error="max |err| ...")
    assert bad.latency_s == math.inf and not bad.ok
    assert MeasureResult.from_json(bad.to_json()) == bad
    with pytest.raises(ValueError):
        MeasureResult("fast")
    assert set(STATUSES) == {"ok", "compile_error", "runtime_error", "timeout", "wrong_result", "noisy"}


def test_timing_protocol_json_and_validation():
    p = TimingProtocol()
    assert TimingProtocol.from_json(p.to_json()) == p
    assert 0.1 < p.estimate_s(1e-5) < 0.3  # fast kernels cost ~min_repeat x (repeats + 2)
    assert p.estimate_s(1.0) == pytest.approx(7.0)  # slow ones: first + warmup + 5 repeats
    with pytest.raises(ValueError):
        TimingProtocol(repeats=0)


# -- builder -----------------------------------------------------------------------------------


@pytest.mark.cc
def test_build_cache_hit_and_flag_key(tmp_path):
    src = VADD.replace("1000", "999")  # a source no other test builds
    first = build(src, cache_dir=tmp_path)
    assert first.status == "ok" and not first.cached and first.lib_path.endswith(".so")
    again = build(src, cache_dir=tmp_path)
    assert again.cached and again.lib_path == first.lib_path
    assert again.seconds < first.seconds and again.seconds < 0.05
    other = build(src, cache_dir=tmp_path, flags=("-O2", *DEFAULT_FLAGS[1:]))
    assert other.status == "ok" and other.key != first.key and other.lib_path != first.lib_path
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind


@pytest.mark.cc
def test_a_cached_library_cut_short_is_built_again(tmp_path):
    # session 73: a truncated .so in the cache was trusted; every kernel loaded from it crashed the
    # measuring process (SIGBUS), recorded as runtime_error, in every later run on that cache
    import ctypes

    from codegen.build import elf_intact

    src = "int fj_add1(int x) { return x + 1; }\n"
    first = build(src, cache_dir=tmp_path)
    size = os.path.getsize(first.lib_path)
    for cut in (size - 1, size // 2, 16):
        with open(first.lib_path, "r+b") as f:
            f.truncate(cut)
        assert not elf_intact(first.lib_path)
        again = build(src, cache_dir=tmp_path)
        assert again.status == "ok" and not again.cached and again.lib_path == first.lib_path
        assert elf_intact(again.lib_path)
    last = build(src, cache_dir=tmp_path)
    assert last.cached and ctypes.CDLL(last.lib_path).fj_add1(41) == 42  # loaded only now: never cut while mapped


@pytest.mark.cc
def test_build_compile_error_and_timeout(tmp_path):
    bad = build("void fj_kernel(float* const* bufs) { undeclared_thing = 1; }", cache_dir=tmp_path)
    assert bad.status == "compile_error" and bad.lib_path is None
    assert "undeclared_thing" in bad.error and "kernel.c" in bad.error
    slow = build("int x;", cache_dir=tmp_path, timeout_s=1e-4)
    assert slow.status == "timeout" and slow.lib_path is None
    assert not list(tmp_path.glob(".*"))


@pytest.mark.cc
def test_build_many_keeps_order(tmp_path):
    sources = ["int a;", "int broken(", "int a;", "int c;"]
    results = build_many(sources, workers=2, cache_dir=tmp_path)
    assert [r.status for r in results] == ["ok", "compile_error", "ok", "ok"]
    assert results[0].lib_path == results[2].lib_path != results[3].lib_path


@pytest.mark.cc
def test_assemble_shows_register_blocked_fma_probe():
    from codegen.peak import peak_kernel_source

    t = Target.cpu()
    if t.simd_lanes != 16:
        pytest.skip("register-blocking check written for AVX-512")
    asm = assemble(peak_kernel_source(t))
    loop_fmas = re.findall(r"vfmadd\w*ps\s+%zmm\d+, %zmm\d+, %zmm(\d+)", asm)
    assert len(set(loop_fmas)) >= 24  # 24 distinct accumulator registers
    assert "(%rsp)" not in asm.split(".L2:")[1].split("jne")[0]  # no spills in the FMA loop
    with pytest.raises(BuildError):
        assemble("int broken(")


# -- runner: good kernels ----------------------------------------------------------------------


@pytest.mark.cc
def test_good_kernels_ok(runner, libs):
    _assert_good(runner, libs)
    rng = np.random.default_rng(2)
    a = rng.standard_normal((32, 64)).astype(np.float32)
    b = rng.standard_normal((64, 48)).astype(np.float32)
    for threads in (1, 2):
        req = RunRequest(
            libs["matmul"], [a, b], (32, 48), 0, a.astype(np.float64) @ b,
            reduction_size=64, threads=threads,
        )
        res = runner.run(req)
        assert res.status == "ok", res.error
        assert res.latency_s > 0 and math.isfinite(res.latency_s) and res.run_s > 0


@pytest.mark.cc
def test_buffers_are_aligned_including_empty_workspace(runner, libs):
    x = np.zeros(3, np.float32)  # inputs 0 and 1, output 2, workspace 3 (size 0)
    res = runner.run(RunRequest(libs["alignment"], [x, x], (4,), 0, np.ones(4)))
    assert res.status == "ok", res.error


@pytest.mark.cc
def test_optional_prepare_fills_workspace_once(runner, libs):
    req = dataclasses.replace(_vadd_request(libs["prepared"]), workspace_bytes=4 * N)
    res = runner.run(req)
    assert res.status == "ok", res.error
    # Without fj_prepare's packing the workspace still holds NaN: that must fail.
    res = runner.run(dataclasses.replace(_vadd_request(libs["unprepared"]), workspace_bytes=4 * N))
    assert res.status == "wrong_result" and "NaN" in res.error, res.error


@pytest.mark.cc
def test_build_result_passed_to_runner(runner, cache_dir):
    failed = build("int broken(", cache_dir=cache_dir)
    res = runner.run(_vadd_request(None), build=failed)
    assert res.status == "compile_error" and "error" in res.error and res.build_s > 0
    good = build(VADD, cache_dir=cache_dir)
    res = runner.run(_vadd_request(None), build=good)
    assert res.status == "ok", res.error


# -- runner: planted bad kernels -----------------------------------------------------------------


@pytest.mark.cc
@pytest.mark.parametrize(
    "name, status, message",
    [
        ("segfault", "runtime_error", "SIGSEGV"),
        ("past_end", "runtime_error", "out-of-bounds write: output[1000] (past its end"),
        ("before_start", "runtime_error", "output[-3] (before its start)"),
        ("writes_input", "runtime_error", "read-only input 0"),
        ("accumulates", "wrong_result", "accumulate"),
        ("half", "wrong_result", "500 of 1000 outputs are NaN"),
        ("off_by_1pct", "wrong_result", "out of tolerance"),
        ("no_abi", "runtime_error", "fj_time"),
    ],
)
def test_planted_kernel_is_caught_and_runner_recovers(runner, libs, name, status, message):
    res = runner.run(_vadd_request(libs[name]))
    assert res.status == status, res.error
    assert message in res.error, res.error
    assert res.latency_s == math.inf and res.latencies == ()
    _assert_good(runner, libs)


@pytest.mark.cc
def test_wrong_result_restarts_the_child(runner, libs):
    pid, restarts = runner.pid, runner.restarts
    assert runner.run(_vadd_request(libs["half"])).status == "wrong_result"
    assert runner.restarts == restarts + 1 and runner.pid != pid
    _assert_good(runner, libs)


@pytest.mark.cc
def test_hang_times_out_and_runner_recovers(runner, libs):
    start = time.monotonic()
    res = runner.run(_vadd_request(libs["hang"], timeout_s=1.0))
    assert res.status == "timeout", res.error
    assert time.monotonic() - start < 60.0  # a hang guard: the status above is the verdict
    _assert_good(runner, libs)


@pytest.mark.cc
def test_missing_library_is_runtime_error(runner, libs, tmp_path):
    res = runner.run(_vadd_request(str(tmp_path / "nope.so")))
    assert res.status == "runtime_error" and "cannot load" in res.error
    _assert_good(runner, libs)


@pytest.mark.cc
def test_invalid_request_raises(runner, libs):
    req = _vadd_request(libs["vadd"])
    with pytest.raises(ValueError):
        runner.run(dataclasses.replace(req, out_shape=(N + 1,)))
    with pytest.raises(ValueError):
        runner.run(dataclasses.replace(req, lib_path=None))
    with pytest.raises(ValueError):
        runner.run(dataclasses.replace(req, inputs=[x.astype(np.float64) for x in req.inputs]))


@pytest.mark.cc
def test_child_killed_from_outside_is_replaced(libs):
    with LocalRunner(protocol=TimingProtocol.quick()) as r:
        os.kill(r.pid, signal.SIGKILL)
        time.sleep(0.2)
        _assert_good(r, libs)


@pytest.mark.cc
def test_default_protocol_duration_and_flush(libs):
    with LocalRunner() as r:
        res = r.run(_vadd_request(libs["vadd"]))
        assert res.status == "ok" and len(res.latencies) == 5
        assert res.run_s < 60.0  # a hang guard (~0.15 s on a quiet machine): the duration is a timing
        flushed = r.run(
            _vadd_request(
                libs["vadd"], protocol=TimingProtocol(min_repeat_ms=0, repeats=3, flush_cache=True)
            )
        )
        assert flushed.status == "ok" and len(flushed.latencies) == 3, flushed.error


@pytest.mark.cc
def test_fp32_peak_probe(runner, cache_dir, monkeypatch):
    from codegen.peak import measure_fp32_peak

    monkeypatch.setenv("FELIXJAX_CACHE", str(cache_dir))  # keep the user's cache untouched
    gflops = measure_fp32_peak(1, runner=runner, protocol=TimingProtocol.quick())
    assert math.isfinite(gflops) and gflops > 1.0
    # session 75 (a user's review): on a busy machine a `noisy` probe stopped benchmarks/kernels.py; its fastest
    # timing still bounds the peak: a warning and that bound
    from codegen.measure import MeasureResult

    class Busy:
        def run(self, request, build=None):
            return MeasureResult("noisy", (2e-3, 1e-3), error="disturbed measurement: planted")

    with pytest.warns(RuntimeWarning, match="peak probe disturbed .disturbed measurement: planted.: the fp32 peak is a"):
        bound = measure_fp32_peak(1, runner=Busy(), protocol=TimingProtocol.quick())
    assert bound > 0


@pytest.mark.cc
def test_unguarded_script_is_not_rerun_by_the_child(tmp_path, libs):
    script = tmp_path / "script.py"
    script.write_text(
        "print('main body')\n"
        "import numpy as np\n"
        "from codegen.measure import LocalRunner, RunRequest, TimingProtocol\n"
        "x = np.ones(1000, np.float32)\n"
        f"req = RunRequest({libs['vadd']!r}, [x, x], (1000,), 0, 2 * x)\n"
        "with LocalRunner(protocol=TimingProtocol.quick()) as r:\n"
        "    print(r.run(req).status)\n"
    )
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": root},
    )
    assert out.stdout.split() == ["main", "body", "ok"], out.stdout + out.stderr


@pytest.mark.cc
def test_the_subprocess_runners_child_imports_nothing_from_its_working_folder(libs, tmp_path, monkeypatch):
    # session 76 (a security review): `python -m` put the working folder first on the child's import path, so a
    # codegen/ package in the folder a Dask worker was started from ran in the measuring process
    from codegen.run.subproc import SubprocessRunner

    marker = tmp_path / "PWNED"
    (tmp_path / "codegen").mkdir()
    (tmp_path / "codegen" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.chdir(tmp_path)
    with SubprocessRunner(protocol=TimingProtocol.quick(), timeout_s=20.0) as r:
        res = r.run(_vadd_request(libs["vadd"]))
    assert res.status == "ok", res.error
    assert not marker.exists()


def test_a_ctrl_c_during_parallel_builds_neither_waits_for_nor_leaves_the_compilers(tmp_path, monkeypatch):
    # session 78 (an interrupt review): build_many's pool waited for its running compilers (up to timeout_s
    # each) before a Ctrl-C reached the caller, and they ran on
    import importlib
    import threading

    build_mod = importlib.import_module("codegen.build")  # the module (codegen.build is also its function)
    pids = tmp_path / "pids"
    slow = tmp_path / "slowcc"  # a compiler that takes a minute and says who it is
    slow.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "slowcc 1"; exit 0; }}\necho $$ >> {pids}\n'
                    f"exec sleep 60\n")
    slow.chmod(0o755)
    monkeypatch.setattr(build_mod, "CC", str(slow))
    def ctrl_c_once_both_run():  # a real Ctrl-C (it wakes a blocked wait), once both compilers have started
        deadline = time.time() + 30
        while time.time() < deadline and not (pids.exists() and len(pids.read_text().split()) == 2):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c_once_both_run, daemon=True).start()
    t = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        build_many([f"int a{i};" for i in range(2)], workers=2, cache_dir=tmp_path / "cache", timeout_s=60)
    assert time.perf_counter() - t < 20  # not the compilers' minute
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 2
    deadline = time.time() + 10
    while time.time() < deadline and any(_running(p) for p in started):
        time.sleep(0.1)
    assert not any(_running(p) for p in started)


def _running(pid: int) -> bool:
    """A live (not zombie) process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.cc
def test_a_kernel_called_from_threads_gives_every_caller_its_own_result():
    # session 78 (a concurrency review): 8 threads on one kernel got 0-2 wrong outputs of 300 each (its argument
    # array and workspace are shared and the C call releases the GIL), a bound kernel up to 16
    from concurrent.futures import ThreadPoolExecutor

    from codegen.lower import lower
    from codegen.ops import matmul
    from codegen.render_c import render
    from codegen.runtime import Kernel
    from codegen.space import Space, default_sketch

    task = matmul(64, 64, 64)
    target = Target.cpu(cores=1)
    plan = lower(Space(task, default_sketch(task, target), target), Space(task, default_sketch(task, target),
                                                                           target).default())
    k = Kernel(plan, build(render(plan)).lib_path, threads=1)
    rng = np.random.default_rng(0)
    cases = [[rng.standard_normal(s).astype(np.float32) for s in task.input_shapes()] for _ in range(8)]
    bound = k.bind(cases[0][1])

    def calls(i):
        x, w = cases[i]
        want, want_b = task.reference(x, w), task.reference(x, cases[0][1])
        return sum(not np.allclose(k(x, w) if n % 2 else bound(x), want if n % 2 else want_b, rtol=1e-4, atol=1e-4)
                   for n in range(150))

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(calls, range(8))) == [0] * 8


@pytest.mark.cc
def test_each_kernel_runs_at_its_own_thread_count_from_any_thread():
    # a session-81 review: threads= was set once, for the constructing thread (OpenMP keeps the count per calling
    # thread): from a worker thread a threads=1 kernel ran 2 threads, and a second kernel at 2 switched the first
    import ctypes
    import ctypes.util
    import threading

    from codegen.lower import lower
    from codegen.ops import matmul
    from codegen.render_c import render
    from codegen.runtime import Kernel
    from codegen.space import Space

    gomp = ctypes.CDLL(ctypes.util.find_library("gomp"))
    task = matmul(32, 32, 32)
    space = Space(task, "gemm_packed", Target.cpu(cores=2))
    plan = lower(space, space.default())
    one, two = (Kernel(plan, build(render(plan)).lib_path, threads=n) for n in (1, 2))
    x, w = task.random_inputs(seed=0)
    seen = []

    def work():
        for k in (one, two, one.bind(w)):
            k(x) if k.__class__.__name__ == "BoundKernel" else k(x, w)
            seen.append(gomp.omp_get_max_threads())  # what the calling thread's next parallel region uses

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    two(x, w)
    one(x, w)
    assert seen == [1, 2, 1] and gomp.omp_get_max_threads() == 1


@pytest.mark.cc
def test_a_bound_kernels_argument_count_and_complex_data_are_clear_errors():
    # a session-81 review: "takes 3 arrays, got 2" counted the bound weights; complex data lost its imaginary part
    from codegen.lower import lower
    from codegen.ops import dense
    from codegen.render_c import render
    from codegen.runtime import Kernel
    from codegen.space import Space

    task = dense(2, 8, 4, bias=True)
    space = Space(task, "gemm_packed", Target.cpu())
    plan = lower(space, space.default())
    k = Kernel(plan, build(render(plan)).lib_path)
    x, w, b = task.random_inputs(seed=0)
    with pytest.raises(ValueError, match="bound to its weights takes 2 arrays, got 1"):
        k.bind(w)(x)
    with pytest.raises(ValueError, match="input 0 is complex"):
        k(x.astype(np.complex64), w, b)
    np.testing.assert_allclose(k.bind(w)(x, b), task.reference(x, w, b), rtol=1e-5, atol=1e-5)


@pytest.mark.cc
def test_kernels_refuse_to_run_in_a_child_forked_after_kernels_ran():
    # session 78 (a concurrency review): the child's call hung in libgomp (its OpenMP pool does not survive a fork;
    # a kernel loaded in the child hangs too, a code review found)
    import multiprocessing

    from codegen.lower import lower
    from codegen.ops import dense
    from codegen.render_c import render
    from codegen.runtime import Kernel
    from codegen.space import Space

    sp = Space(dense(1, 64, 16), "gemm_packed", Target.cpu())
    plan = lower(sp, sp.default())
    k = Kernel(plan, build(render(plan)).lib_path)
    x, w = sp.task.random_inputs()
    k(x, w)  # this process has run a kernel
    _FORKED_CALL[:] = [k, x, w]  # the child sees it in its copy of this process (a kernel does not pickle)
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:
            err = pool.apply_async(_call_in_child).get(timeout=60)
    finally:
        _FORKED_CALL.clear()
    assert err.count("forked from one that had run kernels") == 2 and "'spawn'" in err


@pytest.mark.cc
def test_networks_refuse_to_run_in_a_child_forked_after_kernels_ran():
    # session 79: network libraries (NetLibrary) had the kernels' lock but not their fork check (session 78's list)
    import multiprocessing

    from codegen.netbuild import NetSpec, Step, Value, emit, load

    spec = NetSpec((Value((4,), "input"), Value((4,), "temp")), (0,), (1,), (Step("Sigmoid", (0,), (1,)),))
    net = load(emit(spec))
    x = np.zeros(4, np.float32)
    assert float(net.call_one(x)[0]) == 0.5  # this process has run a network
    _FORKED_CALL[:] = [net, x]
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:
            err = pool.apply_async(_net_in_child).get(timeout=60)
    finally:
        _FORKED_CALL.clear()
    assert err.startswith("one: None |") and err.count("forked from one that had run kernels") == 4, err


def _net_in_child() -> str:
    net, x = _FORKED_CALL
    out = ["one: " + repr(net.call_one(x))]  # None: the caller takes the checked path, which raises
    for call in (lambda: net.call_fast([x]), lambda: net([x]), lambda: net.timeit([x], net.new_outputs(), 2),
                 lambda: net.profile([x])):
        try:
            call()
            out.append("ran")
        except RuntimeError as e:
            out.append(str(e))
    return " | ".join(out)


_FORKED_CALL: list = []


def _call_in_child() -> str:
    kernel, x, w = _FORKED_CALL
    out = []
    for k in (kernel, type(kernel)(kernel.plan, kernel.lib_path)):  # the parent's, and one loaded here
        try:
            k(x, w)
            out.append("ran")
        except RuntimeError as e:
            out.append(str(e))
    return " | ".join(out)


def test_runners_started_in_threads_leave_the_main_module_as_it_was():
    # session 78 (a concurrency review): two tunes starting their runners at once in threads left an empty stand-in
    # as sys.modules["__main__"] for the rest of the process (pickling the user's functions failed from then on)
    import threading

    from codegen.measure import _start_without_main

    class Starting:  # a process whose start() takes a moment, as spawn's does
        def start(self):
            time.sleep(0.02)

    main = sys.modules["__main__"]
    threads = [threading.Thread(target=_start_without_main, args=(Starting(),)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sys.modules["__main__"] is main
