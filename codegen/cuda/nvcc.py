"""``nvcc -cubin`` builds of emitted kernels and the ``ptxas -v`` report read back.

Compiles through an argument list (never a shell), with a timeout, in a content-addressed cache
(source + arch + nvcc version), so a config is compiled once per machine. Without ``nvcc`` on PATH,
:func:`compile_cubin` returns a result with ``status="skipped"`` and the caller estimates registers
instead (:meth:`codegen.cuda.space.CudaSpace.registers`, marked ``estimated``).

Example:
    >>> parse_ptxas("ptxas info    : Used 50 registers, used 1 barriers, 4096 bytes smem, 376 bytes cmem[0]\\n"
    ...             "    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads")
    {'registers': 50, 'smem_bytes': 4096, 'spill_stores': 8, 'spill_loads': 4, 'stack_bytes': 0}
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["NvccResult", "compile_cubin", "nvcc_path", "nvcc_version", "parse_ptxas"]


@dataclass(frozen=True)
class NvccResult:
    """One nvcc build: ``status`` "ok", "compile_error", "timeout" or "skipped" (no nvcc); the
    ``ptxas`` report (registers, smem_bytes, spill_stores, spill_loads, stack_bytes) when ok."""

    status: str
    cubin_path: str | None = None
    ptxas: dict = field(default_factory=dict)
    error: str = ""
    seconds: float = 0.0
    cached: bool = False


def nvcc_path() -> str | None:
    """``nvcc`` on PATH (or ``$FELIXJAX_NVCC``), else None."""
    env = os.environ.get("FELIXJAX_NVCC")
    if env:
        return env if Path(env).exists() else None
    return shutil.which("nvcc")


@functools.lru_cache(maxsize=4)
def nvcc_version(nvcc: str) -> str:
    try:
        proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def parse_ptxas(text: str) -> dict:
    """Registers, shared memory, spills and stack frame from ``ptxas -v`` output (first kernel)."""
    def num(pattern: str) -> int:
        m = re.search(pattern, text)
        return int(m.group(1)) if m else 0

    return {"registers": num(r"Used (\d+) registers"), "smem_bytes": num(r"(\d+) bytes smem"),
            "spill_stores": num(r"(\d+) bytes spill stores"), "spill_loads": num(r"(\d+) bytes spill loads"),
            "stack_bytes": num(r"(\d+) bytes stack frame")}


def _cache_dir() -> Path:
    from codegen.build import cache_root

    d = cache_root() / "cubin"
    d.mkdir(parents=True, exist_ok=True)
    return d


def compile_cubin(source: str, arch: str, *, timeout: float = 120.0, nvcc: str | None = None) -> NvccResult:
    """Compile ``source`` to a cubin for ``arch`` ("sm_80", ...) and read the ptxas report back."""
    nvcc = nvcc or nvcc_path()
    if nvcc is None:
        return NvccResult("skipped", error="nvcc not found")
    if not re.fullmatch(r"sm_\d+[a-z]?", arch):
        raise ValueError(f"arch {arch!r} is not an sm_XY architecture")
    key = hashlib.sha256("\0".join([source, arch, nvcc_version(nvcc)]).encode()).hexdigest()[:24]
    cache = _cache_dir()
    cubin, report = cache / f"{key}.cubin", cache / f"{key}.ptxas"
    t0 = time.perf_counter()
    if cubin.exists() and report.exists():
        return NvccResult("ok", str(cubin), parse_ptxas(report.read_text()), "", time.perf_counter() - t0, True)
    with tempfile.TemporaryDirectory(prefix="fj_nvcc_") as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source)
        out = Path(tmp) / "kernel.cubin"
        args = [nvcc, "-cubin", f"-arch={arch}", "-O3", "-w", "-Xptxas", "-v", str(src), "-o", str(out)]
        try:
            proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=tmp)
        except subprocess.TimeoutExpired:
            return NvccResult("timeout", error=f"nvcc took more than {timeout:.0f} s",
                              seconds=time.perf_counter() - t0)
        text = proc.stdout + proc.stderr
        if proc.returncode != 0 or not out.exists():
            return NvccResult("compile_error", error=text.replace(str(src), "kernel.cu")[-4000:],
                              seconds=time.perf_counter() - t0)
        part = cubin.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(out, part)
        os.replace(part, cubin)
        report.write_text(text)
    return NvccResult("ok", str(cubin), parse_ptxas(text), "", time.perf_counter() - t0, False)
