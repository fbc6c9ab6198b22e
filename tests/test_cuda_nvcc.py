"""nvcc builds of the emitted CUDA kernels (issue 18): cubins for every spec's arch, ptxas read back."""
from __future__ import annotations

import numpy as np
import pytest

from codegen.cuda.nvcc import compile_cubin, nvcc_path
from codegen.cuda.render import render
from codegen.cuda.space import CudaSpace
from codegen.ops import conv2d, matmul
from codegen.target import Target

pytestmark = [pytest.mark.nvcc, pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")]


@pytest.mark.parametrize("gpu", ["a100", "h100", "orin"])
def test_cubin_and_ptxas_report(gpu):
    tg = Target.cuda_sim(gpu)
    sp = CudaSpace(matmul(256, 256, 256, bias=True, act="relu"), tg)
    k = render(sp, sp.default())
    r = compile_cubin(k.source, tg.spec.arch)
    assert r.status == "ok", r.error
    assert r.ptxas["smem_bytes"] == k.smem_bytes
    assert 16 <= r.ptxas["registers"] <= 255 and r.ptxas["spill_stores"] == 0
    # the estimate used without nvcc is in the right range
    assert abs(sp.registers(sp.default()) - r.ptxas["registers"]) <= 32


def test_conv_and_sampled_configs_compile():
    tg = Target.cuda_sim("a100")
    sp = CudaSpace(conv2d(1, 16, 14, 14, out_channels=32, kernel=3, padding=1), tg)
    rng = np.random.default_rng(0)
    for cfg in [sp.default(), sp.sample(rng)]:
        r = compile_cubin(render(sp, cfg).source, "sm_80")
        assert r.status == "ok", r.error


def test_compile_error_is_a_result():
    r = compile_cubin("__global__ void k() { this is not cuda }", "sm_80")
    assert r.status == "compile_error" and "error" in r.error
    with pytest.raises(ValueError):
        compile_cubin("", "sm_80; rm -rf /")


def test_emitted_kernels_compile_without_warnings(tmp_path):
    """Session 73's known gap: non-batched matmuls declared index variables of their unit batch axis that no
    expression read, and nvcc warned (#177-D) about each; builds pass -w, so only a build without it shows them."""
    import subprocess

    from codegen.ops import dense, depthwise_conv2d

    tg, rng = Target.cuda_sim("a100"), np.random.default_rng(1)
    for i, t in enumerate([matmul(64, 64, 64), dense(1, 128, 64, bias=True, act="relu"), matmul(32, 32, 32, batch=2),
                           conv2d(1, 8, 9, 9, out_channels=8, kernel=3, padding=1, residual=True),
                           depthwise_conv2d(1, 8, 9, 9, kernel=3, padding=1, bias=True)]):
        sp = CudaSpace(t, tg)
        for j, cfg in enumerate([sp.default(), sp.sample(rng)]):
            src = tmp_path / f"k{i}_{j}.cu"
            src.write_text(render(sp, cfg).source)
            p = subprocess.run([nvcc_path(), "-cubin", f"-arch={tg.spec.arch}", "-O3", str(src), "-o",
                                str(tmp_path / "k.cubin")], capture_output=True, text=True, timeout=300, check=False)
            assert p.returncode == 0 and not p.stderr.strip(), (t.name, p.stderr[:400])
