"""The default schedule of ``gemm_packed`` (:func:`default_schedule`, a GotoBLAS-like blocking) and how it
splits its rows among the cores (:func:`balanced_split`); :func:`block_reuse` rates a register block.

Example:
    >>> from codegen.ops import matmul
    >>> from codegen.space import Space
    >>> from codegen.target import Target
    >>> sp = Space(matmul(257, 96, 384), "gemm_packed.pad_m264", Target.cpu(cores=2, simd_lanes=16, vector_registers=32))
    >>> tiles, parallel, vec, unroll = default_schedule(sp)
    >>> tiles[1], vec  # m: 33 chunks of one 8-row block (2 cores), n: 3 blocks of 2 vectors
    ((33, 1, 1, 8), 16)
"""
from __future__ import annotations

from .factors import divisors, largest_divisor_leq

#: the most load imbalance (the busiest core's chunks over the mean) a default's row split accepts
MAX_IMBALANCE = 1.05


def default_schedule(space) -> tuple:
    """``(tiles, parallel, vec, unroll)`` of ``gemm_packed`` (axes ``b m n k``, vector axis ``n``).

    Register block ``mr x nr`` of at most 16 accumulators (8 rows x 2 vectors where the extents allow:
    2 vector loads and 8 broadcasts per 16 FMAs); ``kc`` (``R1``) so that the data micro-panel
    ``mr x kc`` fills at most 2/3 of L1 (on matmul 1024, ``kc = K``: no accumulator reloads); ``nc``
    (``S2 x S3`` of ``n``) so that the packed weight block ``kc x nc`` fills at most a quarter of L2.
    Nest: ``n0`` over weight blocks (``S0``), ``k0`` (``R0``), then every micro-panel row ``m2`` against
    every column block ``n2`` of the weight block (``S2``), which streams the weight block from L2 while
    the data micro-panel stays in L1. The outer ``b0 m0 n0`` loops are fused into the parallel loop, with
    ``m0`` from :func:`balanced_split`.
    """
    ext = {a.name: a.extent for a in space.axes}
    M, N, K = ext["m"], ext["n"], ext["k"]
    vec = max([v for v in space.vec_choices if N % v == 0] or [1])
    nr = largest_divisor_leq(N, 2 * vec, vec) if vec > 1 else largest_divisor_leq(N, 4)
    if nr < vec:
        vec = max(v for v in space.vec_choices if nr % v == 0)
    ncols = max(1, nr // vec)
    budget = max(1, min(16, space.max_accumulators))
    mr = largest_divisor_leq(M, max(1, budget // ncols))
    if mr * ncols < budget // 2:  # few rows (a GEMV): widen the block so FMA chains overlap
        ncols = largest_divisor_leq(N // vec, max(1, budget // mr))
        nr = ncols * vec
    l1, l2 = int(space.target.l1d_bytes), int(space.target.l2_bytes)
    kc = largest_divisor_leq(K, max(16, 2 * l1 // 3 // (4 * mr)))
    nc = nr * largest_divisor_leq(N // nr, max(1, l2 // 4 // (4 * kc * nr)))
    cores = int(getattr(space.target, "cores", 1) or 1)
    n0 = N // nc
    m0 = balanced_split(M // mr, ext["b"] * n0, cores)
    tiles = {"b": (ext["b"], 1, 1, 1), "m": (m0, 1, M // (m0 * mr), mr), "n": (n0, 1, nc // nr, nr),
             "k": (K // kc, kc)}
    return tuple(tiles[a.name] for a in space.axes), 3, vec, 16


def imbalance(chunks: int, cores: int) -> float:
    """The busiest core's share of ``chunks`` equal chunks over the mean share."""
    return -(-chunks // cores) / (chunks / cores)


def balanced_split(blocks: int, chunks: int, cores: int) -> int:
    """How many parts ``gemm_packed``'s default splits its ``blocks`` register-block rows into (a divisor),
    so that with the ``chunks`` parallel chunks it already has there are at least 2 per core and the
    busiest core gets at most :data:`MAX_IMBALANCE` times the mean: the fewest such parts, else the
    split of least imbalance. (It took the largest divisor up to 2 chunks per core: a 257x96x384
    matmul, padded to 33 blocks of 8 rows, ran 3 chunks on 2 cores, 165 GFLOP/s against 212 in 33
    chunks, and a 129-row one ran serial; Zen 4, 2 threads; ``benchmarks/gemm_split_probe.py``.)

    Example:
        >>> balanced_split(33, 1, 2), balanced_split(128, 1, 2), balanced_split(1, 1, 2)
        (33, 4, 1)
    """
    want = max(1, -(-2 * cores // chunks))
    parts = [d for d in divisors(blocks) if d >= want] or [blocks]
    for d in parts:
        if imbalance(chunks * d, cores) <= MAX_IMBALANCE:
            return d
    return min(parts, key=lambda d: (imbalance(chunks * d, cores), d))


def block_reuse(space, cfg) -> float:
    """FMAs per operand load of a ``gemm_packed`` config's register block (``mr`` rows x ``nr`` vectors:
    ``mr * nr`` FMAs per ``mr`` broadcasts and ``nr`` vector loads)."""
    t = dict(zip([a.name for a in space.axes], cfg.tiles))
    mr, nr = t["m"][3], max(1, t["n"][3] // max(1, cfg.vec))
    return mr * nr / (mr + nr)
