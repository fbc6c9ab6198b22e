"""GPU spec tables for the simulated CUDA targets (``Target.cuda_sim(name)``).

Every figure is a published one; the sources, per part:

* **a100** -- NVIDIA A100-SXM4-40GB. *NVIDIA A100 Tensor Core GPU Architecture* whitepaper (2020),
  table 3 and the A100 datasheet: 108 SMs, 64 FP32 cores per SM (64 FMA/SM/clock), boost clock
  1410 MHz (fp32 peak 19.5 TFLOP/s), HBM2 1555 GB/s, L2 40 MB; compute capability 8.0 limits from
  the *CUDA C++ Programming Guide*, table "Technical Specifications per Compute Capability": 164 KB
  shared memory per SM (163 KB per block, opt-in), 64 K 32-bit registers per SM, 255 per thread,
  64 warps and 32 blocks per SM.
* **h100** -- NVIDIA H100 SXM5 80GB. *NVIDIA H100 Tensor Core GPU Architecture* whitepaper (2022) and
  the H100 datasheet: 132 SMs, 128 FP32 cores per SM, fp32 peak 67 TFLOP/s (so a 1980 MHz boost
  clock: 67e12 / (132 * 128 * 2)), HBM3 3.35 TB/s, L2 50 MB; compute capability 9.0: 228 KB shared
  memory per SM (227 KB per block), 64 K registers per SM, 64 warps and 32 blocks per SM.
* **a10g** -- NVIDIA A10G (AWS EC2 G5; GA102). AWS G5 documentation and the TechPowerUp GPU
  database entry "NVIDIA A10G": 80 SMs, 128 FP32 cores per SM, boost 1710 MHz (35.0 TFLOP/s fp32),
  GDDR6 600 GB/s, L2 6 MB; compute capability 8.6: 100 KB shared memory per SM (99 KB per block),
  48 warps and 16 blocks per SM.
* **orin** -- Jetson AGX Orin 64GB (GA10B). *Jetson AGX Orin Series Technical Brief* v1.2 (2022):
  2048 CUDA cores in 16 SMs (128 per SM), GPU max frequency 1.3 GHz (5.3 TFLOP/s fp32), LPDDR5
  204.8 GB/s (shared with the CPU), L2 4 MB; compute capability 8.7: 164 KB shared memory per SM
  (163 KB per block), 48 warps and 16 blocks per SM.
* **a6000** -- NVIDIA RTX A6000 (GA102), used to check the simulator against Simon Boehm's SGEMM
  worklog (measured on this card): *NVIDIA RTX A6000 datasheet*: 84 SMs, 10752 CUDA cores
  (128 per SM), boost 1800 MHz (38.7 TFLOP/s fp32), GDDR6 768 GB/s, L2 6 MB; compute capability 8.6.

Numbers that vary between board variants (clocks under power caps, the 80 GB A100's 2039 GB/s) take
the variant named above. Figures that no datasheet gives (L2 bandwidth, latencies) are calibration
constants of the simulator (``codegen.cuda.sim.CALIBRATION``), not spec fields.

Example:
    >>> s = get_spec("a100")
    >>> round(s.peak_flops / 1e12, 1), s.dram_bandwidth / 1e9, s.sm_count
    (19.5, 1555.0, 108)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["GpuSpec", "SPECS", "get_spec", "spec_for_device_name"]

KB = 1024
MB = 1024 * KB


@dataclass(frozen=True)
class GpuSpec:
    """Published figures of one GPU.

    Attributes:
        name: table key ("a100", ...).
        full_name: the part.
        arch: nvcc architecture ("sm_80", ...).
        sm_count: streaming multiprocessors.
        clock_hz: boost clock of the SMs.
        fp32_fma_per_sm_clock: fp32 FMA lanes per SM (one FMA = 2 FLOP) per clock.
        dram_bandwidth: bytes per second.
        l2_bytes: L2 cache.
        smem_per_sm: shared memory per SM (bytes, the largest carve-out).
        smem_per_block: shared memory one block may use (bytes, with the opt-in attribute).
        regs_per_sm: 32-bit registers per SM.
        regs_per_thread: registers one thread may use.
        max_warps_per_sm, max_blocks_per_sm, max_threads_per_block: residency limits.
        warp_size: threads per warp.
        source: where the figures come from.
    """

    name: str
    full_name: str
    arch: str
    sm_count: int
    clock_hz: float
    fp32_fma_per_sm_clock: int
    dram_bandwidth: float
    l2_bytes: int
    smem_per_sm: int
    smem_per_block: int
    regs_per_sm: int = 65536
    regs_per_thread: int = 255
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    max_threads_per_block: int = 1024
    warp_size: int = 32
    source: str = ""

    @property
    def peak_flops(self) -> float:
        """fp32 FLOP/s: SMs x FMA lanes x 2 x clock."""
        return self.sm_count * self.fp32_fma_per_sm_clock * 2.0 * self.clock_hz

    @property
    def max_threads_per_sm(self) -> int:
        return self.max_warps_per_sm * self.warp_size

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


SPECS: dict[str, GpuSpec] = {
    "a100": GpuSpec("a100", "NVIDIA A100-SXM4-40GB", "sm_80", 108, 1.41e9, 64, 1555e9, 40 * MB,
                    164 * KB, 163 * KB, max_warps_per_sm=64, max_blocks_per_sm=32,
                    source="NVIDIA A100 architecture whitepaper (2020) + datasheet; CUDA guide CC 8.0"),
    "h100": GpuSpec("h100", "NVIDIA H100 SXM5 80GB", "sm_90", 132, 1.98e9, 128, 3.35e12, 50 * MB,
                    228 * KB, 227 * KB, max_warps_per_sm=64, max_blocks_per_sm=32,
                    source="NVIDIA H100 architecture whitepaper (2022) + datasheet; CUDA guide CC 9.0"),
    "a10g": GpuSpec("a10g", "NVIDIA A10G (AWS G5)", "sm_86", 80, 1.71e9, 128, 600e9, 6 * MB,
                    100 * KB, 99 * KB, max_warps_per_sm=48, max_blocks_per_sm=16,
                    source="AWS G5 docs; TechPowerUp GPU database (A10G); CUDA guide CC 8.6"),
    "orin": GpuSpec("orin", "NVIDIA Jetson AGX Orin 64GB (GA10B)", "sm_87", 16, 1.3e9, 128, 204.8e9, 4 * MB,
                    164 * KB, 163 * KB, max_warps_per_sm=48, max_blocks_per_sm=16,
                    source="Jetson AGX Orin Series Technical Brief v1.2 (2022); CUDA guide CC 8.7"),
    "a6000": GpuSpec("a6000", "NVIDIA RTX A6000", "sm_86", 84, 1.80e9, 128, 768e9, 6 * MB,
                     100 * KB, 99 * KB, max_warps_per_sm=48, max_blocks_per_sm=16,
                     source="NVIDIA RTX A6000 datasheet; CUDA guide CC 8.6"),
}


def get_spec(name: str) -> GpuSpec:
    """The spec of a known GPU; unknown names raise ValueError listing the known ones.

    Example:
        >>> get_spec("orin").arch
        'sm_87'
    """
    key = str(name).strip().lower()
    if key not in SPECS:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(sorted(SPECS))}")
    return SPECS[key]


def spec_for_device_name(device: str) -> GpuSpec | None:
    """The table entry matching a device name as nvidia-smi prints it ("NVIDIA A100-SXM4-80GB"), or None."""
    d = device.upper()
    for key, marker in (("h100", "H100"), ("a100", "A100"), ("a10g", "A10G"), ("a6000", "A6000"),
                        ("orin", "ORIN")):
        if marker in d:
            return SPECS[key]
    return None
