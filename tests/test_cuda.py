"""CUDA targets (issue 18): spec tables, Target.cuda_sim, the GPU sketch, the CUDA renderer and the
CPU emulation of the emitted source (no GPU needed)."""
from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from codegen.cuda.emulate import Emulated, check, sample_blocks
from codegen.cuda.render import CUDA, render
from codegen.cuda.space import SKETCH, CudaSpace
from codegen.cuda.specs import SPECS, get_spec
from codegen.ops import conv2d, dense, matmul
from codegen.space import Config
from codegen.target import Target

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is needed to emulate kernels")


# ---- 1. specs and targets ----------------------------------------------------------------------

def test_spec_tables_have_published_peaks():
    assert {"a100", "h100", "a10g", "orin"} <= set(SPECS)
    assert get_spec("a100").peak_flops == pytest.approx(19.5e12, rel=0.01)
    assert get_spec("h100").peak_flops == pytest.approx(67e12, rel=0.01)
    assert get_spec("orin").peak_flops == pytest.approx(5.3e12, rel=0.02)
    assert get_spec("a10g").dram_bandwidth == 600e9
    for s in SPECS.values():
        assert s.arch.startswith("sm_") and s.smem_per_block <= s.smem_per_sm and s.source


def test_cuda_sim_target():
    t = Target.cuda_sim("A100")
    assert t.kind == "cuda-sim" and t.name == "a100" and t.is_gpu
    assert t.spec.sm_count == 108 and t.spec.dram_bandwidth == 1555e9 and t.spec.peak_flops > 19e12
    assert Target.from_json(t.to_json()) == t
    assert t.key != Target.cuda_sim("h100").key != Target.cpu().key
    with pytest.raises(ValueError, match="known: a100, a10g, a6000, h100, orin"):
        Target.cuda_sim("rtx9090")
    with pytest.raises(AttributeError):
        Target.cpu().spec
    assert not Target.cpu().is_gpu


def test_cpu_target_key_unchanged():
    # the CPU fields are untouched: the key of a fixed description is the one recorded before CUDA existed
    t = Target(kind="cpu", name="x", cores=2, simd_lanes=8, vector_registers=16, fma=True)
    assert t.key == "462343f02247646f"  # computed with the pre-CUDA codegen/target.py


def test_cuda_without_gpu_raises_clearly():
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    with pytest.raises(RuntimeError, match="no CUDA GPU found"):
        Target.cuda()


# ---- 2. the GPU sketch ---------------------------------------------------------------------------

TASKS = [matmul(64, 48, 40), dense(3, 40, 50, bias=True, act="relu6"),
         conv2d(1, 8, 10, 10, out_channels=16, kernel=3, padding=1, bias=True, act="relu"),
         conv2d(2, 16, 9, 9, out_channels=16, kernel=3, stride=2, padding=(1, 0, 2, 1), groups=4, residual=True)]


@pytest.mark.parametrize("gpu", ["a100", "orin"])
def test_space_default_and_samples_are_valid(gpu):
    rng = np.random.default_rng(0)
    for t in TASKS + [matmul(2048, 2048, 2048)]:
        sp = CudaSpace(t, Target.cuda_sim(gpu))
        d = sp.default()
        assert d.sketch == SKETCH and sp.is_valid(d)
        for _ in range(20):
            c = sp.sample(rng)
            sp.validate(c)
            g = sp.geometry(c)
            assert g.n_threads <= 1024 and g.smem_bytes <= sp.spec.smem_per_block
            assert sp.registers(c) <= 255
            assert Config.from_json(c.to_json()) == c


def test_space_constraints_are_clear_errors():
    sp = CudaSpace(matmul(2048, 2048, 2048), Target.cuda_sim("a100"))
    d = sp.default()
    too_many = Config(SKETCH, ((1, 1, 1, 1), (1, 1, 64, 32), (1, 1, 64, 32), (256, 8)), 1, 1, 1)
    with pytest.raises(ValueError, match="threads per block 4096"):
        sp.validate(too_many)
    big_smem = Config(SKETCH, ((1, 1, 1, 1), (8, 16, 16, 1), (8, 16, 16, 1), (1, 2048)), 1, 1, 1)
    with pytest.raises(ValueError, match="shared memory"):
        sp.validate(big_smem)
    regs = Config(SKETCH, ((1, 1, 1, 1), (16, 1, 8, 16), (16, 1, 8, 16), (256, 8)), 1, 1, 1)
    with pytest.raises(ValueError, match="registers"):
        sp.validate(regs)
    with pytest.raises(ValueError, match="staging"):
        sp.validate(dataclasses.replace(d, parallel=2))
    with pytest.raises(ValueError, match="does not apply"):
        CudaSpace(matmul(8, 8, 8), Target.cuda_sim("a100"), "gemm_packed")


# ---- 3. the renderer -----------------------------------------------------------------------------

def test_rendered_source_is_cuda():
    sp = CudaSpace(matmul(128, 128, 128), Target.cuda_sim("a100"))
    cfg = Config(SKETCH, ((1, 1, 1, 1), (2, 1, 16, 4), (2, 1, 16, 4), (16, 8)), 1, 1, 4)
    k = render(sp, cfg)
    for token in ("__global__", "threadIdx.x", "blockIdx.x", "__shared__", "__syncthreads();",
                  "__launch_bounds__(256)", "fmaf(", "#pragma unroll"):
        assert token in k.source
    assert (k.grid, k.block, k.smem_bytes) == (4, 256, 4096)  # 64x64 block tiles, k slices of 8
    unstaged = dataclasses.replace(cfg, parallel=0)
    assert "__shared__" not in render(sp, unstaged).source


# ---- 4. emulation of the emitted source ---------------------------------------------------------

@needs_gxx
@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_emulation_matches_numpy(task):
    sp = CudaSpace(task, Target.cuda_sim("a100"))
    rng = np.random.default_rng(1)
    for cfg in [sp.default(), sp.sample(rng)]:
        r = check(sp, cfg)
        assert r.status == "ok", (cfg, r.error)


@needs_gxx
def test_emulated_kernel_callable_and_sampled_blocks():
    t = matmul(96, 64, 32, bias=True, act="relu")
    sp = CudaSpace(t, Target.cuda_sim("orin"))
    cfg = Config(SKETCH, ((1, 1, 1, 1), (6, 2, 4, 2), (4, 1, 16, 1), (4, 8)), 1, 1, 2)
    k = Emulated(sp, cfg)
    xs = t.random_inputs(seed=3)
    np.testing.assert_allclose(k(*xs), t.reference(*xs), rtol=1e-4, atol=1e-4)
    blocks = sample_blocks(sp, cfg, max_blocks=8)
    assert len(blocks) == 8 and {0, 23} <= set(blocks.tolist())  # corner blocks are always among them
    assert check(sp, cfg, max_blocks=8).status == "ok"


@needs_gxx
@pytest.mark.parametrize("bug", [{"thread_index": "threadIdx.y"}, {"fma": "({a} * {b} + {c} * 0.5f)"},
                                 {"barrier": ""}], ids=["index", "fma", "no-barrier"])
def test_planted_dialect_bug_is_caught(bug):
    sp = CudaSpace(matmul(64, 64, 64), Target.cuda_sim("a100"))
    cfg = Config(SKETCH, ((1, 1, 1, 1), (2, 1, 8, 4), (2, 2, 8, 2), (8, 8)), 1, 1, 4)  # staged: barriers matter
    assert check(sp, cfg).ok
    r = check(sp, cfg, dialect=dataclasses.replace(CUDA, **bug))
    assert r.status == "wrong_result", r


def test_repair_gives_valid_configs():
    from codegen.space import random_factorization

    rng = np.random.default_rng(0)
    for t in (matmul(2048, 2048, 2048), conv2d(1, 64, 56, 56, out_channels=64, kernel=3, padding=1)):
        sp = CudaSpace(t, Target.cuda_sim("orin"))
        for _ in range(100):
            tiles = tuple(random_factorization(rng, a.extent, lv) for a, lv in zip(sp.axes, sp.levels))
            cfg = Config(SKETCH, tiles, int(rng.integers(0, 4)), int(rng.choice([1, 4])), int(rng.choice([1, 3, 64])))
            fixed = sp.repair(cfg)
            assert sp.is_valid(fixed)
            if sp.is_valid(cfg):
                assert fixed == cfg


@needs_gxx
def test_emulation_of_a_10_mflop_kernel_is_fast():
    import time

    from codegen.cuda.emulate import build_emulator, run_blocks

    t = matmul(128, 128, 320)  # 10.5 MFLOP, every block run
    sp = CudaSpace(t, Target.cuda_sim("a100"))
    k = render(sp, sp.default())
    exe, err = build_emulator(sp, k)
    assert exe, err
    xs = t.random_inputs(seed=0)
    t0 = time.perf_counter()
    out, status, err = run_blocks(sp, k, exe, xs, np.arange(k.grid))
    took = time.perf_counter() - t0
    assert status == "ok" and np.allclose(out, t.reference(*xs), rtol=1e-4, atol=1e-4)
    assert took < 60.0  # a hang guard (~0.3 s here: 64 blocks x 64 threads x 640 barriers; the issue asks <= 1 s)
