"""Hardware description of the machine kernels are generated for and measured on.

A `Target` is a frozen record: it hashes, round-trips through JSON and its `key` identifies the
hardware in the database. `Target.cpu()` detects the local CPU from /proc/cpuinfo and sysfs; any
field can be overridden by keyword (`Target.cpu(cores=1)`), e.g. to tune for fewer cores than the
machine has or to describe a machine that is not this one.

Example:
    >>> from codegen.target import Target
    >>> t = Target.cpu(cores=1)
    >>> t.kind, t.cores
    ('cpu', 1)
    >>> Target.from_json(t.to_json()) == t
    True
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["Target", "L3_CAP_PER_CORE", "compiler_version", "cpu_identity"]

KIB = 1024
MIB = 1024 * KIB

# Under a hypervisor sysfs reports the host's whole L3 (here 105 MiB shared by "0-1"), which is
# shared with unknown neighbours. Server parts have 1.5-4 MiB of L3 per core (Xeon SP ~1.9 MiB,
# EPYC 4 MiB), so a larger per-core share is not believable: cap it.
L3_CAP_PER_CORE = 4 * MIB

# Used only when sysfs has no cache description (some containers): typical recent x86 values.
_FALLBACK_CACHES = {"l1d_bytes": 32 * KIB, "l2_bytes": 1 * MIB, "l3_bytes": 2 * MIB}

_CPUINFO = Path("/proc/cpuinfo")
_CACHE_SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")

# Measured values: they vary between runs, so they do not take part in `Target.key`.
_MEASURED_FIELDS = ("peak_gflops_per_core",)


@dataclasses.dataclass(frozen=True)
class Target:
    """A hardware description (today: a CPU; `kind` leaves room for CUDA targets).

    Attributes:
        kind: "cpu" (other kinds, e.g. a CUDA simulator, are added by other modules).
        name: CPU model name from /proc/cpuinfo.
        cores: cores a kernel may use (the process's CPU affinity at detection).
        simd_lanes: fp32 lanes of one vector register (16 AVX-512, 8 AVX2, else 4).
        vector_registers: architectural vector registers (32 with AVX-512, else 16).
        fma: fused multiply-add available.
        avx512_fp16: native fp16 vector arithmetic (AVX512-FP16).
        avx512_vnni: int8 dot products (AVX512-VNNI).
        l1d_bytes: L1 data cache of one core.
        l2_bytes: L2 cache of one core.
        l3_bytes: this core's share of L3 (sysfs size / sharers, capped at `L3_CAP_PER_CORE`).
        compiler: first line of `gcc --version` ("" if there is no gcc).
        peak_gflops_per_core: measured fp32 peak of one core (see `codegen.peak`), or None.
            Not part of `key`: it is a measurement, not an identity.
    """

    kind: str = "cpu"
    name: str = "unknown"
    cores: int = 1
    simd_lanes: int = 4
    vector_registers: int = 16
    fma: bool = False
    avx512_fp16: bool = False
    avx512_vnni: bool = False
    l1d_bytes: int = _FALLBACK_CACHES["l1d_bytes"]
    l2_bytes: int = _FALLBACK_CACHES["l2_bytes"]
    l3_bytes: int = _FALLBACK_CACHES["l3_bytes"]
    compiler: str = ""
    peak_gflops_per_core: float | None = None

    def __post_init__(self) -> None:
        if self.cores < 1 or self.simd_lanes < 1 or self.vector_registers < 1:
            raise ValueError(f"cores, simd_lanes and vector_registers must be >= 1: {self}")
        if self.kind == "cpu" and self.vector_registers <= 4:  # codegen.space.REGISTER_RESERVE: no register block
            raise ValueError(f"vector_registers={self.vector_registers}: a CPU target needs more than 4 (4 are kept "
                             f"for operand loads; x86-64 has 16, AVX-512 and NEON 32)")
        if min(self.l1d_bytes, self.l2_bytes, self.l3_bytes) <= 0:
            raise ValueError(f"cache sizes must be positive: {self}")

    @classmethod
    def cuda_sim(cls, name: str) -> Target:
        """A simulated GPU from the spec table of `codegen.cuda.specs` ("a100", "h100", "a10g", "orin").

        Raises ValueError listing the known names for an unknown one.

        Example:
            >>> t = Target.cuda_sim("a100")
            >>> t.kind, t.spec.sm_count
            ('cuda-sim', 108)
        """
        from .cuda.specs import get_spec

        spec = get_spec(name)
        # the CPU-style fields describe the GPU's levels for the shared feature code: "cores" are SMs,
        # "L1" the static shared memory of a block, "L2" an SM's share of the L2, "L3" the whole L2
        return cls(kind="cuda-sim", name=spec.name, cores=spec.sm_count, simd_lanes=1,
                   vector_registers=spec.regs_per_thread, l1d_bytes=min(spec.smem_per_block, 48 * KIB),
                   l2_bytes=spec.l2_bytes // spec.sm_count, l3_bytes=spec.l2_bytes,
                   peak_gflops_per_core=spec.peak_flops / spec.sm_count / 1e9)

    @classmethod
    def cuda(cls) -> Target:
        """The real GPU of this machine (nvidia-smi); RuntimeError when there is none."""
        from .cuda.specs import spec_for_device_name

        try:
            proc = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=30)
            names = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()] if proc.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired):
            names = []
        if not names:
            raise RuntimeError("no CUDA GPU found (nvidia-smi is missing or lists no device); "
                               "use Target.cuda_sim(name) to tune for a simulated one")
        spec = spec_for_device_name(names[0])
        return cls(kind="cuda", name=names[0], cores=spec.sm_count if spec else 1, simd_lanes=1)

    @property
    def spec(self):
        """The GPU spec (`codegen.cuda.specs.GpuSpec`) of a `cuda-sim` or `cuda` target."""
        from .cuda.specs import get_spec, spec_for_device_name

        if self.kind == "cuda-sim":
            return get_spec(self.name)
        if self.kind == "cuda":
            spec = spec_for_device_name(self.name)
            if spec is None:
                raise ValueError(f"no spec table entry for GPU {self.name!r}")
            return spec
        raise AttributeError(f"a {self.kind!r} target has no GPU spec")

    @property
    def is_gpu(self) -> bool:
        """A CUDA target, simulated or real."""
        return self.kind in ("cuda-sim", "cuda")

    @classmethod
    def cpu(cls, **overrides: Any) -> Target:
        """Detects the local CPU; keyword arguments replace detected fields.

        Args:
            **overrides: any field of `Target`, e.g. `cores=1`, `l2_bytes=1 << 20`,
                `peak_gflops_per_core=measure_fp32_peak()`.

        Returns:
            The detected target with the overrides applied.

        Raises:
            TypeError: an override names no field of `Target`.

        Example:
            >>> Target.cpu(cores=1, l2_bytes=1 << 20).l2_bytes
            1048576
        """
        return cls(**{**_detect_cpu(), **overrides})

    @classmethod
    def parse(cls, spec: str | Target | None) -> Target:
        """A target from its command-line spelling: ``"cpu"`` (this machine) or ``"cuda-sim:GPU"`` (a
        simulated GPU of :data:`codegen.cuda.specs.SPECS`); a Target passes through, ``None`` is the CPU.

        Example:
            >>> Target.parse("cuda-sim:a100").name, Target.parse(None).kind
            ('a100', 'cpu')
        """
        if spec is None:
            return cls.cpu()
        if isinstance(spec, Target):
            return spec
        if not isinstance(spec, str):
            raise TypeError(f"a target is a Target or 'cpu' / 'cuda-sim:GPU', not {type(spec).__name__}")
        if spec.startswith("cuda-sim:"):
            return cls.cuda_sim(spec.partition(":")[2])
        if spec.lower() != "cpu":
            from .cuda.specs import SPECS

            raise ValueError(f"unknown target {spec!r}; use 'cpu' or 'cuda-sim:GPU' ({', '.join(SPECS)}); GPU "
                             f"kernels are timed by the simulator only (no real-GPU timing path yet)")
        return cls.cpu()

    def to_json(self) -> dict[str, Any]:
        """Returns a JSON-serializable dict (the inverse of `from_json`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Target:
        """Builds a target from `to_json()` output; unknown keys raise TypeError."""
        return cls(**d)

    def at_threads(self, threads: int | None) -> "Target":
        """This machine as a kernel run at ``threads`` threads sees it (``cores=threads``; ``self`` for
        ``None`` or its own core count): tuning records are stored and looked up under this target's
        :attr:`key`, so timings at different thread counts never stand in for each other.

        Example:
            >>> t = Target.cpu(cores=2)
            >>> t.at_threads(None) is t, t.at_threads(1).cores, t.at_threads(1).key != t.key
            (True, 1, True)
        """
        if threads is None or int(threads) == self.cores:
            return self
        if int(threads) < 1:
            raise ValueError(f"threads must be >= 1 (got {threads})")
        return dataclasses.replace(self, cores=int(threads))

    @property
    def key(self) -> str:
        """Short stable hash of the canonical JSON of the identity fields (not measured ones).

        Example:
            >>> Target.cpu(cores=1).key == Target.cpu(cores=1).key
            True
        """
        ident = {k: v for k, v in self.to_json().items() if k not in _MEASURED_FIELDS}
        canon = json.dumps(ident, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _cpuinfo_fields() -> tuple[str, frozenset[str]]:
    """Returns (model name, set of CPU flags) of the first processor in /proc/cpuinfo."""
    name, flags = "", frozenset()
    try:
        text = _CPUINFO.read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not name:
            name = value.strip()
        elif key in ("flags", "Features") and not flags:  # "Features" on aarch64
            flags = frozenset(value.split())
    return name or platform.processor() or platform.machine() or "unknown", flags


def cpu_identity() -> str:
    """Model name plus a hash of the CPU flags: what `-march=native` code depends on.

    Under KVM the model name is often generic ("Intel(R) Xeon(R) Processor"), so the flags are
    what tells two hosts apart (a binary using a missing instruction dies of SIGILL).
    """
    name, flags = _cpuinfo_fields()
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:12]
    return f"{name} [{digest}]"


def _parse_size(text: str) -> int:
    """Parses sysfs cache sizes such as "48K", "2048K", "1M"."""
    text = text.strip().upper()
    scale = {"K": KIB, "M": MIB, "G": 1024 * MIB}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def _count_cpus(cpu_list: str) -> int:
    """Counts the cpus of a sysfs list such as "0-1,4,6-7"."""
    count = 0
    for part in cpu_list.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1
    return max(count, 1)


def _cache_sizes(root: Path = _CACHE_SYSFS) -> dict[str, int]:
    """Per-core L1d, L2 and L3 share (bytes) from sysfs, with fallbacks where absent."""
    sizes = dict(_FALLBACK_CACHES)
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _parse_size((index / "size").read_text())
            sharers = _count_cpus((index / "shared_cpu_list").read_text())
        except (OSError, ValueError):
            continue
        if level == 1 and kind == "Data":
            sizes["l1d_bytes"] = size
        elif level == 2 and kind in ("Unified", "Data"):
            sizes["l2_bytes"] = size
        elif level == 3:
            sizes["l3_bytes"] = min(size // sharers, L3_CAP_PER_CORE)
    return sizes


@functools.lru_cache(maxsize=4)
def compiler_version(cc: str = "gcc") -> str:
    """First line of `cc --version`, or "" when the compiler is missing."""
    try:
        proc = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.splitlines()[0].strip() if proc.returncode == 0 and proc.stdout else ""


@functools.lru_cache(maxsize=1)
def _detect_cpu() -> dict[str, Any]:
    name, flags = _cpuinfo_fields()
    avx512 = "avx512f" in flags
    lanes = 16 if avx512 else 8 if "avx2" in flags else 4
    return {
        "kind": "cpu",
        "name": name,
        "cores": len(os.sched_getaffinity(0)),
        "simd_lanes": lanes,
        # aarch64 NEON also has 32 vector registers.
        "vector_registers": 32 if avx512 or "asimd" in flags else 16,
        "fma": "fma" in flags or "asimd" in flags,
        "avx512_fp16": "avx512_fp16" in flags,
        "avx512_vnni": "avx512_vnni" in flags,
        **_cache_sizes(),
        "compiler": compiler_version(),
        "peak_gflops_per_core": None,
    }
