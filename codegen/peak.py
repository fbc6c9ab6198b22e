"""Measured fp32 peak: the denominator of every "% of peak" the benchmarks report.

The probe is a C kernel of many independent vector FMA chains (GCC vector extensions, one
accumulator per vector register, minus a few), built by `codegen.build` and timed by
`LocalRunner` like any other kernel. An FMA has ~4 cycles latency on 2 ports, so at least 8
independent chains are needed to saturate a core; the probe uses up to 24.

Example:
    >>> from codegen.peak import measure_fp32_peak
    >>> measure_fp32_peak(threads=1) > 1.0  # GFLOP/s
    True
"""

from __future__ import annotations

import warnings

import numpy as np

from codegen.build import build
from codegen.measure import TIMING_HARNESS_C, LocalRunner, RunRequest, TimingProtocol
from codegen.target import Target

__all__ = ["measure_fp32_peak", "peak_kernel_source"]

_ITERS = 16384  # FMA rounds per call: ~0.1 ms per call on a 2.7 GHz AVX-512 core


def _accumulators(target: Target) -> int:
    # Leave registers for the two broadcast operands and loop bookkeeping.
    return max(8, min(24, target.vector_registers - 4))


def peak_kernel_source(target: Target | None = None) -> str:
    """C source of the FMA probe for `target` (default: the detected CPU).

    Buffers: input 0 = [multiplier, addend] (1.0 and 0.0, read at run time so the compiler
    cannot fold them), output = (threads, accumulators, lanes) final accumulator values, which
    equal their initial values `thread * accumulators + j + 1`.

    Example:
        >>> "fj_kernel" in peak_kernel_source()
        True
    """
    target = target or Target.cpu()
    lanes, nacc = target.simd_lanes, _accumulators(target)
    decl = "\n".join(f"    vf a{j} = zero + (float)(base + {j + 1});" for j in range(nacc))
    body = "\n".join(f"      a{j} = a{j} * m + c;" for j in range(nacc))
    store = "\n".join(f"    *(vf*)(out + (base + {j}) * {lanes}) = a{j};" for j in range(nacc))
    return f"""
#include <omp.h>
typedef float vf __attribute__((vector_size({4 * lanes})));
void fj_kernel(float* const* bufs) {{
  const float* in = bufs[0];
  float* out = bufs[1];
  #pragma omp parallel
  {{
    const vf zero = {{0}};
    const vf m = zero + in[0], c = zero + in[1];
    const int base = omp_get_thread_num() * {nacc};
{decl}
    for (long it = 0; it < {_ITERS}; ++it) {{
{body}
    }}
{store}
  }}
}}
""" + TIMING_HARNESS_C


def measure_fp32_peak(
    threads: int = 1,
    *,
    runner: LocalRunner | None = None,
    target: Target | None = None,
    protocol: TimingProtocol | None = None,
) -> float:
    """Measures the fp32 FMA throughput of `threads` threads, in GFLOP/s (total, not per core).

    The best repeat (minimum latency) is used: peak is what the hardware can do.

    Args:
        threads: OpenMP threads (one per core for the machine peak).
        runner: measuring runner to use; default a temporary `LocalRunner`.
        target: the CPU (vector width and registers); default detected.
        protocol: timing protocol; default `TimingProtocol()`.

    Returns:
        GFLOP/s summed over the threads. Per-core peak: divide by `threads`.

    Raises:
        RuntimeError: the probe failed to build or run.

    Example:
        >>> t = Target.cpu()
        >>> t = Target.cpu(peak_gflops_per_core=measure_fp32_peak(1, target=t))
    """
    target = target or Target.cpu()
    lanes, nacc = target.simd_lanes, _accumulators(target)
    result = build(peak_kernel_source(target))
    values = np.arange(1, threads * nacc + 1, dtype=np.float32)
    expected = np.repeat(values, lanes).reshape(threads, nacc, lanes)
    request = RunRequest(
        lib_path=None,
        inputs=[np.array([1.0, 0.0], dtype=np.float32)],
        out_shape=expected.shape,
        workspace_bytes=0,
        expected=expected,
        threads=threads,
        protocol=protocol or TimingProtocol(),
    )
    if runner is None:
        with LocalRunner() as own:
            measured = own.run(request, build=result)
    else:
        measured = runner.run(request, build=result)
    if measured.status == "noisy" and measured.latencies:  # a busy machine: its fastest timing still bounds the peak
        warnings.warn(f"peak probe disturbed ({measured.error.splitlines()[0] if measured.error else 'noisy'}): "
                      f"the fp32 peak is a lower bound (percentages of it read high)", RuntimeWarning, stacklevel=2)
    elif not measured.ok:
        raise RuntimeError(f"peak probe failed ({measured.status}): {measured.error}")
    flops = 2.0 * _ITERS * nacc * lanes * threads
    return flops / min(measured.latencies) / 1e9
