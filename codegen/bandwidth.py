"""Measured memory bandwidth: the slope of the roofline the benchmarks judge memory-bound ops against.

A C kernel copies a float32 buffer much larger than the last-level cache (OpenMP over the threads,
vector loads and stores); the bandwidth counts the bytes read plus the bytes written per second, the
best of a few repeats (a maximum: a time slice lost to a neighbour does not count).

Example:
    >>> measure_bandwidth(1, mib=16, repeats=2) > 0.1  # GB/s
    True
"""
from __future__ import annotations

import ctypes

import numpy as np

from .build import build
from .measure import load_kernel_library
from .runtime import use_threads

__all__ = ["measure_bandwidth", "roofline"]

_SOURCE = r"""
#include <stddef.h>
#include <omp.h>
void fj_kernel(void* const* b) {
  const float* restrict src = (const float*)b[0];
  float* restrict dst = (float*)b[1];
  const long n = *(const long*)b[2];
  #pragma omp parallel for schedule(static)
  for (long i = 0; i < n; ++i) dst[i] = src[i];
}
"""


def measure_bandwidth(threads: int = 1, *, mib: int = 128, repeats: int = 5) -> float:
    """Copy bandwidth in GB/s (bytes read + bytes written) at ``threads`` OpenMP threads, through a
    buffer of ``mib`` MiB (default well past any L3 share here); the best of ``repeats``."""
    from .measure import TIMING_HARNESS_C

    res = build(_SOURCE + TIMING_HARNESS_C)
    if res.status != "ok":
        raise RuntimeError(f"building the bandwidth probe failed: {res.error}")
    lib = load_kernel_library(res.lib_path)
    use_threads(lib.fj_set_threads, int(threads))
    n = mib * 2**20 // 4
    src = np.ones(n, np.float32)
    dst = np.zeros(n, np.float32)
    count = np.array([n], np.int64)
    args = (ctypes.c_void_p * 3)(src.ctypes.data, dst.ctypes.data, count.ctypes.data)
    lib.fj_time(args, 1)  # touch every page once
    if not np.array_equal(dst[:: n // 97 or 1], src[:: n // 97 or 1]):
        raise RuntimeError("the bandwidth probe copied wrong data")
    best = min(lib.fj_time(args, 2) / 2 for _ in range(max(1, repeats)))
    return 2 * 4 * n / best / 1e9


def roofline(flops: float, bytes_moved: float, peak_gflops: float, bandwidth_gbs: float) -> float:
    """The attainable GFLOP/s of an op: min(peak, bandwidth x arithmetic intensity).

    Example:
        >>> roofline(2e6, 1e6, 100.0, 10.0)  # 2 flop/byte x 10 GB/s
        20.0
    """
    return min(peak_gflops, bandwidth_gbs * flops / max(bytes_moved, 1.0))
