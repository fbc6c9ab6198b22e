"""The GPU simulator: a deterministic analytic model of one kernel launch on a spec'd GPU.

A config becomes a :class:`KernelProfile` (what one block does: threads, registers, shared memory,
instructions per thread by kind, shared-memory wavefronts, global sectors, bytes from L2, DRAM
bytes of the whole launch) by :func:`profile`; :func:`simulate` turns a profile and a
:class:`~codegen.cuda.specs.GpuSpec` into seconds. Reference kernels that the sketch cannot express
(e.g. a vendor SGEMM with 128-bit shared loads and double buffering) are profiles written by hand.

**Occupancy.** Warps per block ``W = ceil(T / 32)`` (a partial warp costs a whole one). Resident
blocks per SM ``c = min(max_blocks, max_warps // W, regs_per_sm // (W * 32 * ceil8(R)),
smem_per_sm // (S + 1 KiB))`` with ``R`` registers per thread (ptxas, or the space's estimate) and
``S`` static shared memory per block (1 KiB per block is reserved by the driver on sm_80+).

**Per-block work on one SM** (in SM clocks):

* ``fma   = FMA/thread * W * 32 / fma_lanes``                                 (fp32 pipe)
* ``issue = instructions/thread * W / 4``                   (4 schedulers, one warp-instr each)
* ``lsu   = (LDS wavefronts + STS wavefronts) * W + LDG sectors * W / 4``     (shared memory
  delivers 128 B = one wavefront per clock; L1 one request and up to four 32-B sectors per clock,
  ``LDG sectors`` counted as at least 4 per request). A warp's shared load
  costs as many wavefronts as the most distinct addresses falling into one of the 32 banks (bank
  conflicts; a broadcast of one address is free), and at least ``bytes / 128``.
* ``busy  = max(fma, issue, lsu) + OVERLAP * (sum - max)``                     (imperfect overlap)
* ``chain = steps * (L_gmem + L_sync) + steps * depth / mlp * L_inner``: the latency of one warp's
  dependent path (a staged step waits for its global loads and two barriers; each group of ``mlp``
  inner iterations waits for its operand loads, ``mlp = min(unroll, depth, 64 // loads per
  iteration)``: registers bound how far the compiler hoists loads). Unstaged global loads that hit
  L1 cost the LSU ``ldg_request_clk`` clocks per warp request.

**Latency hiding and waves.** ``cr = min(c, ceil(blocks / SMs))`` blocks share an SM; a wave of them
takes ``max(cr * busy, chain_block + max(busy, chain_warp))``: other resident blocks hide a block's
barrier waits (``chain_block = steps * (L_gmem + L_sync)``) and a block's own warps overlap their
load-use paths (``chain_warp``) with its work; too few blocks expose them. An SM runs
``ceil(ceil(blocks / SMs) / cr)`` waves.

**Memory.** Coalescing: the 32-B sectors a warp's global access touches are counted from the
addresses of its 32 threads (``sectors / ideal`` inflates the load/store work, and the L2 traffic of staged
kernels; an unstaged kernel's L2 traffic is its footprint times ``L1_MISS``). L2 traffic: every
block reads its staged boxes (or, unstaged, its operand footprints times ``L1_MISS``) per step.
DRAM traffic from tile reuse: inputs that fit in ``L2_FIT`` of the L2 are read once; otherwise the
blocks of one wave (consecutive block ids) share tiles through the L2 and each wave reads the
distinct tiles its blocks touch, every wave again. Output bytes are written once.

**Total.** ``t = max(t_sm, t_l2, t_dram) + OVERLAP * (sum - max) + launch overhead``; never below the
roofline bound ``max(FLOP / peak, compulsory bytes / DRAM bandwidth)`` by construction.

Calibration constants are the :data:`CALIBRATION` table, fixed before any tuning result was judged;
they were set once against Simon Boehm's A6000 SGEMM worklog (see ``tests/test_cuda_sim.py``), so
those checks are a fit, not an independent validation; real-GPU timing was not available.

Example:
    >>> from codegen.ops import matmul
    >>> from codegen.target import Target
    >>> from codegen.cuda.space import CudaSpace
    >>> sp = CudaSpace(matmul(1024, 1024, 1024), Target.cuda_sim("a100"))
    >>> r = simulate_config(sp, sp.default())
    >>> r.seconds >= r.roofline_s
    True
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..ops import Access
from ..space import Config
from .space import CudaSpace, Geometry
from .specs import GpuSpec

__all__ = ["CALIBRATION", "KernelProfile", "SimResult", "profile", "simulate", "simulate_config", "roofline_s",
           "REFERENCES", "reference_kernels"]

CALIBRATION = {
    "launch_s": 4e-6,         # kernel launch + tail drain, seconds
    "l_gmem": 450.0,          # clocks: a staged step's global load latency (issue to shared store)
    "l_sync": 40.0,           # clocks per barrier pair
    "l_inner_smem": 28.0,     # clocks: shared load -> FMA dependency per unrolled group
    "l_inner_global": 100.0,  # clocks: global load -> FMA, unstaged (L1 hits, the first warp of a row misses to L2)
    "overlap": 0.10,          # share of the non-dominant costs that does not overlap
    "iter_instr": 3.0,        # loop/address instructions per inner iteration (divided by the unroll)
    "fetch_instr": 10.0,      # index arithmetic per cooperatively fetched element
    "global_addr_instr": 1.0,  # address instructions per unstaged global load
    "ldg_request_clk": 2.5,   # LSU clocks per unstaged warp-wide global load that hits L1 (vs 1 for LDS)
    "max_loads_in_flight": 64,  # operand loads one thread keeps in flight (registers bound the hoisting)
    "step_instr": 12.0,       # per reduction step (loop, barriers, pointers)
    "l2_bytes_per_clk_sm": 64.0,  # L2 -> SM bandwidth per SM per clock
    "l1_miss": 1.0,           # unstaged: L2 bytes per block = footprint * this
    "l2_fit": 0.75,           # inputs below this share of L2 are read from DRAM once
    "reg_granule": 8,         # register allocation granularity per thread
    "smem_reserved": 1024,    # bytes reserved per block (sm_80+)
}


@dataclass(frozen=True)
class KernelProfile:
    """What one launch does (per block unless said otherwise). Instruction counts are per thread."""

    name: str
    blocks: int
    threads: int
    registers: int
    smem_bytes: int
    flops: float               # whole launch (2 per FMA + epilogue)
    fma: float                 # FMA instructions per thread
    lds: float                 # shared load instructions per thread
    lds_wavefronts: float      # wavefronts per warp-wide shared load (conflicts, vector width)
    sts: float                 # shared store instructions per thread
    ldg: float                 # global load instructions per thread
    ldg_sectors: float         # 32-B sectors per warp-wide global load
    stg: float                 # global store instructions per thread
    stg_sectors: float
    other: float               # integer / control instructions per thread
    steps: int                 # staged reduction steps (barrier-separated), or outer steps
    depth: int                 # inner iterations per step
    unroll: int
    staged: bool
    l2_bytes: float            # bytes one block reads through L2
    dram_bytes: float          # whole launch
    compulsory_bytes: float    # inputs + output once (the roofline's bytes)
    double_buffered: bool = False
    info: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class SimResult:
    """Simulated seconds and the breakdown (all seconds unless named otherwise)."""

    seconds: float
    roofline_s: float
    t_sm: float
    t_l2: float
    t_dram: float
    blocks_per_sm: int
    occupancy: float
    waves: int
    bound: str
    details: dict = field(default_factory=dict, compare=False)

    @property
    def gflops(self) -> float:
        return self.details.get("flops", 0.0) / self.seconds / 1e9


def roofline_s(flops: float, compulsory_bytes: float, spec: GpuSpec) -> float:
    """The roofline bound: no launch is faster than its FLOPs at peak or its bytes at DRAM speed."""
    return max(flops / spec.peak_flops, compulsory_bytes / spec.dram_bandwidth)


def occupancy(p: KernelProfile, spec: GpuSpec) -> int:
    """Resident blocks per SM (0: the block does not fit)."""
    cal = CALIBRATION
    w = -(-p.threads // spec.warp_size)
    g = cal["reg_granule"]
    regs = -(-max(p.registers, 1) // g) * g
    limits = [spec.max_blocks_per_sm, spec.max_warps_per_sm // w, spec.regs_per_sm // (w * spec.warp_size * regs)]
    if p.smem_bytes:
        limits.append(spec.smem_per_sm // (p.smem_bytes + cal["smem_reserved"]))
    return max(0, min(limits))


def simulate(p: KernelProfile, spec: GpuSpec) -> SimResult:
    """Seconds of one launch of ``p`` on ``spec`` (module docstring: the formulas)."""
    cal = CALIBRATION
    w = -(-p.threads // spec.warp_size)
    c = occupancy(p, spec)
    roof = roofline_s(p.flops, p.compulsory_bytes, spec)
    if c == 0:
        return SimResult(math.inf, roof, math.inf, math.inf, math.inf, 0, 0.0, 0, "does not fit",
                         {"flops": p.flops})
    fma = p.fma * w * spec.warp_size / spec.fp32_fma_per_sm_clock
    instr = p.fma + p.lds + p.sts + p.ldg + p.stg + p.other
    issue = instr * w / 4.0
    ldg_clk = cal["ldg_request_clk"] if not p.staged else 1.0
    lsu = (p.lds * p.lds_wavefronts + p.sts) * w + (p.ldg * max(4.0 * ldg_clk, p.ldg_sectors)
                                                    + p.stg * max(4.0, p.stg_sectors)) * w / 4.0
    parts = (fma, issue, lsu)
    busy = max(parts) + cal["overlap"] * (sum(parts) - max(parts))
    inner = cal["l_inner_smem"] if p.staged else cal["l_inner_global"]
    per_iter = max(1.0, (p.lds if p.staged else p.ldg) / max(1, p.steps * p.depth))
    mlp = max(1, min(p.unroll, p.depth, int(cal["max_loads_in_flight"] // per_iter)))
    groups = p.steps * p.depth / mlp
    step_lat = cal["l_gmem"] + cal["l_sync"] if p.staged else 0.0
    if p.double_buffered:
        step_lat = cal["l_sync"]
    chain_block, chain_warp = p.steps * step_lat, groups * inner
    chain = chain_block + chain_warp
    per_sm = -(-p.blocks // spec.sm_count)
    cr = max(1, min(c, per_sm))
    waves = -(-per_sm // cr)
    alone = chain_block + max(busy, chain_warp)  # one block by itself: barrier waits + its own work or path
    t_sm = waves * max(cr * busy, alone) / spec.clock_hz
    t_l2 = p.blocks * p.l2_bytes / (cal["l2_bytes_per_clk_sm"] * spec.sm_count * spec.clock_hz)
    t_dram = p.dram_bytes / spec.dram_bandwidth
    ts = {"sm": t_sm, "l2": t_l2, "dram": t_dram}
    top = max(ts.values())
    seconds = top + cal["overlap"] * (sum(ts.values()) - top) + cal["launch_s"]
    seconds = max(seconds, roof)
    bound = max(ts, key=ts.get)
    if bound == "sm":
        bound = {fma: "fma", issue: "issue", lsu: "shared/L1"}[max(parts)] if cr * busy >= alone else "latency"
    return SimResult(seconds, roof, t_sm, t_l2, t_dram, c, min(1.0, c * w / spec.max_warps_per_sm), waves, bound,
                     {"flops": p.flops, "busy_clk": busy, "chain_clk": chain, "fma_clk": fma, "issue_clk": issue,
                      "lsu_clk": lsu, "resident_blocks": cr, "warps_per_block": w})


# ---- config -> profile -----------------------------------------------------------------------------

def _warp_coords(geo: Geometry, n: int = 32) -> dict[str, np.ndarray]:
    """Per spatial axis, the thread coordinate ``t_a`` of threads 0..n-1 (last axis fastest)."""
    tid = np.arange(min(n, geo.n_threads))
    out = {}
    for a in reversed(geo.spatial):
        out[a] = tid % geo.threads[a]
        tid = tid // geo.threads[a]
    return out


def row_major_strides(shape) -> list[int]:
    """Element strides of a C-contiguous array of ``shape``."""
    out, s = [], 1
    for n in reversed(shape):
        out.append(s)
        s *= n
    return out[::-1]


def _addresses(acc: Access, coord: dict[str, np.ndarray], shape) -> np.ndarray:
    total = 0
    for dim, st in zip(acc.dims, row_major_strides(shape)):
        total = total + st * sum(c * coord.get(a, 0) for a, c in dim)
    return np.asarray(total) + np.zeros(len(next(iter(coord.values()))), dtype=np.int64)


def bank_wavefronts(addr: np.ndarray) -> int:
    """Wavefronts of one warp-wide 4-byte shared load: the most distinct addresses in one bank."""
    uniq = np.unique(addr)
    return int(np.bincount(uniq % 32, minlength=32).max()) if len(uniq) else 1


def sectors(addr: np.ndarray) -> int:
    """32-byte sectors touched by one warp-wide 4-byte global access."""
    return int(len(np.unique(np.asarray(addr) // 8)))


def _wave_unique_bytes(geo: Geometry, acc: Access, box_bytes_all_k: float, wave: int) -> float:
    """Bytes of ``acc`` the first wave's blocks touch: distinct block coordinates over the axes the
    access depends on, times one block's footprint over the whole reduction."""
    ids = np.arange(min(wave, geo.n_blocks))
    coords = []
    for a in reversed(geo.spatial):
        if acc.depends_on(a):
            coords.append(ids % geo.blocks[a])
        ids = ids // geo.blocks[a]
    if not coords:
        return box_bytes_all_k
    distinct = len(np.unique(np.stack(coords, axis=1), axis=0))
    return distinct * box_bytes_all_k


def profile(space: CudaSpace, cfg: Config, registers: int | None = None) -> KernelProfile:
    """The :class:`KernelProfile` of ``cfg`` (registers: ptxas's count, else the space's estimate)."""
    cal = CALIBRATION
    g = space.geometry(cfg)
    con, task, spec = space.con, space.task, space.spec
    regs = int(registers or space.registers(cfg, g))
    T = g.n_threads
    P = g.outputs_per_thread
    K = con.reduction_size
    steps, depth = g.steps, g.step_depth
    iters = steps * depth
    fd, fw = g.fragment(con.data), g.fragment(con.weight)
    coord = _warp_coords(g)
    local = {a: coord[a] * g.inner[a] for a in g.spatial}  # v = i = 0, reduction index 0
    uroll = max(1, min(g.unroll, depth))
    other = (steps * cal["step_instr"] if g.staged else 0.0) + iters * cal["iter_instr"] / uroll
    itemsize = 4
    box = {b: g.box_elems(b) for b in ("data", "weight")}
    out_addr = _addresses(con.out, {a: local[a] for a in g.spatial}, con.out.shape)
    stg_sec = sectors(out_addr)
    n_warp = len(out_addr)
    ideal = max(1, -(-n_warp * itemsize // 32))
    if g.staged:
        wf = {}
        for b, acc in (("data", con.data), ("weight", con.weight)):
            wf[b] = bank_wavefronts(_addresses(acc, local, g.boxes[b]))
        lds = iters * (fd + fw)
        lds_wf = (fd * wf["data"] + fw * wf["weight"]) / max(1, fd + fw)
        fetch = {b: -(-box[b] // T) for b in box}
        sts = steps * sum(fetch.values())
        ldg = sts
        # coalescing of the cooperative fetch: consecutive threads take consecutive box elements
        sec = []
        for b, acc in (("data", con.data), ("weight", con.weight)):
            e = np.arange(min(32, box[b]))
            idx, rem = [], e
            for n in reversed(g.boxes[b]):
                idx.append(rem % n)
                rem = rem // n
            idx = idx[::-1]
            shape = acc.shape
            flat = sum(i * s for i, s in zip(idx, row_major_strides(shape)))
            sec.append((fetch[b], sectors(flat) / max(1, -(-len(e) * itemsize // 32))))
        ldg_sectors = 4.0 * sum(f * s for f, s in sec) / max(1, sum(f for f, _ in sec))
        other += steps * sum(fetch.values()) * cal["fetch_instr"]
        l2_block = steps * itemsize * sum(box.values()) * ldg_sectors / 4.0
    else:
        lds, lds_wf, sts = 0.0, 1.0, 0.0
        ldg = iters * (fd + fw)
        glob = {**{a: coord[a] * g.inner[a] for a in g.spatial}}
        sd = sectors(_addresses(con.data, glob, con.data.shape))
        sw = sectors(_addresses(con.weight, glob, con.weight.shape))
        ldg_sectors = (fd * sd + fw * sw) / max(1, fd + fw) * 4.0 / ideal
        other += ldg * cal["global_addr_instr"]
        l2_block = steps * itemsize * sum(box.values()) * cal["l1_miss"]
    stg = P * (1 + int(task.residual))
    in_bytes = itemsize * (math.prod(con.data_api_shape) + math.prod(con.weight.shape))
    out_bytes = itemsize * math.prod(con.out.shape) * (1 + int(task.residual))
    compulsory = in_bytes + out_bytes
    wave = max(1, min(g.n_blocks, occupancy_blocks(space, cfg, regs) * spec.sm_count))
    if in_bytes <= cal["l2_fit"] * spec.l2_bytes:
        dram = compulsory
    else:
        waves = -(-g.n_blocks // wave)
        per_wave = sum(_wave_unique_bytes(g, acc, steps * itemsize * box[b], wave)
                       for b, acc in (("data", con.data), ("weight", con.weight)))
        dram = max(compulsory, waves * per_wave + out_bytes)
    return KernelProfile(f"{task.name}:{cfg.dumps()}", g.n_blocks, T, regs, g.smem_bytes, float(task.flops),
                         float(P * K), float(lds), float(lds_wf), float(sts), float(ldg), float(ldg_sectors),
                         float(stg), float(stg_sec * 4.0 / ideal), float(other), steps, depth, g.unroll, g.staged,
                         float(l2_block), float(dram), float(compulsory), info={"estimated_registers": registers is None})


def occupancy_blocks(space: CudaSpace, cfg: Config, regs: int) -> int:
    g = space.geometry(cfg)
    stub = KernelProfile("", g.n_blocks, g.n_threads, regs, g.smem_bytes, 0, 0, 0, 1, 0, 0, 4, 0, 4, 0, 1, 1, 1,
                         g.staged, 0, 0, 0)
    return max(1, occupancy(stub, space.spec))


def simulate_config(space: CudaSpace, cfg: Config, registers: int | None = None) -> SimResult:
    """Simulated launch of ``cfg`` on the space's GPU; a config the GPU cannot launch (threads per block, shared
    memory, ...: :meth:`CudaSpace.validate`) is a ValueError, not a time."""
    space.validate(cfg)
    return simulate(profile(space, cfg, registers), space.spec)


# ---- reference kernels (validation) ----------------------------------------------------------------

# Published figures the simulator is checked against (GFLOP/s, fp32):
# * Simon Boehm, "How to Optimize a CUDA Matmul Kernel for cuBLAS-like Performance: a Worklog" (2022),
#   RTX A6000, 4092^3: kernel 2 (naive, coalesced) 1986.5, kernel 3 (shared-memory blocking, 32x32)
#   2980.3, kernel 4 (1-D blocktiling) 8474.7, kernel 5 (2-D blocktiling, 128x128, 8x8 per thread)
#   15971.7, cuBLAS 23249.6. Simulated here at 4096^3 (his kernels guard the ragged edge of 4092).
# * Vendor SGEMM at 2048^3 on A100 and H100: no per-size figure from NVIDIA was at hand; the target
#   is 85% of the fp32 peak (cuBLAS SGEMM is commonly reported at 85-95% of peak at large sizes:
#   ~16.6 TFLOP/s on A100, ~57 TFLOP/s on H100 SXM). An assumption, stated as one.
REFERENCES = {
    "naive": ("a6000", 4096, 1986.5, "Boehm 2022, kernel 2 (global memory coalescing)"),
    "smem": ("a6000", 4096, 2980.3, "Boehm 2022, kernel 3 (shared memory cache-blocking)"),
    "blocktile1d": ("a6000", 4096, 8474.7, "Boehm 2022, kernel 4 (1-D blocktiling)"),
    "blocktile2d": ("a6000", 4096, 15971.7, "Boehm 2022, kernel 5 (2-D blocktiling)"),
    "vendor_a6000": ("a6000", 4096, 23249.6, "Boehm 2022, cuBLAS on the A6000"),
    "vendor_a100": ("a100", 2048, 0.85 * 19.49e3, "assumed: 85% of the A100's fp32 peak"),
    "vendor_h100": ("h100", 2048, 0.85 * 66.9e3, "assumed: 85% of the H100 SXM's fp32 peak"),
}


def _vendor_profile(space: CudaSpace, tiles_mn: tuple[int, int]) -> KernelProfile:
    """A CUTLASS-like SGEMM: block tile ``tiles_mn``, 256 threads, 2x2 virtual threads of 4x4 (or 4x2)
    outputs, k slices of 8 staged and double-buffered, 128-bit shared loads (4 LDS.128 per k), a
    conflict-free layout (2 wavefronts per LDS.128), fetch offsets precomputed (2 instructions per
    fetched element instead of this renderer's div/mod chain), 128 registers."""
    ext = {a.name: a.extent for a in space.axes}
    bm, bn = tiles_mn
    tm, tn = bm // 32, bn // 32  # 16 x 16 threads... as (16 threads x 2 vthreads x inner)
    cfg = Config("cuda_tiled", ((1, 1, 1, 1), (ext["m"] // bm, 2, 16, bm // 32), (ext["n"] // bn, 2, 16, bn // 32),
                                (ext["k"] // 8, 8)), 1, 1, 8)
    p = profile(space, cfg, registers=128)
    iters = p.steps * p.depth
    lds = iters * (tm * 2 + tn * 2) / 4.0
    other = p.other - p.sts * (CALIBRATION["fetch_instr"] - 2.0)  # precomputed fetch offsets: 2 per element
    return _replace(p, name=f"vendor-class {bm}x{bn}", lds=lds, lds_wavefronts=2.0, double_buffered=True, other=other)


def _replace(p: KernelProfile, **kw) -> KernelProfile:
    import dataclasses

    return dataclasses.replace(p, **kw)


def reference_kernels() -> list[tuple[str, str, KernelProfile, float, str]]:
    """``(name, gpu, profile, published GFLOP/s, source)`` of every reference kernel (see REFERENCES).

    The first four are configs of the ``cuda_tiled`` sketch written as the worklog's kernels (one
    output per thread unstaged; 32x32 shared tiles; 64x64 tiles with 8 outputs per thread; 128x128
    tiles with 8x8 per thread, whose weight loads the worklog's compiled kernel vectorizes into
    LDS.128); the vendor kernels are the best of three CUTLASS-like tile shapes."""
    from ..ops import matmul
    from ..target import Target

    out = []
    sk = "cuda_tiled"
    for name, (gpu, n, pub, src) in REFERENCES.items():
        sp = CudaSpace(matmul(n, n, n), Target.cuda_sim(gpu))
        one = (1, 1, 1, 1)
        if name == "naive":
            p = profile(sp, Config(sk, (one, (n // 32, 1, 32, 1), (n // 32, 1, 32, 1), (n, 1)), 0, 1, 4))
        elif name == "smem":
            p = profile(sp, Config(sk, (one, (n // 32, 1, 32, 1), (n // 32, 1, 32, 1), (n // 32, 32)), 1, 1, 4))
        elif name == "blocktile1d":
            p = profile(sp, Config(sk, (one, (n // 64, 1, 8, 8), (n // 64, 1, 64, 1), (n // 8, 8)), 1, 1, 8))
        elif name == "blocktile2d":
            p = profile(sp, Config(sk, (one, (n // 128, 1, 16, 8), (n // 128, 1, 16, 8), (n // 8, 8)), 1, 1, 8))
            # per k: 8 scalar A loads (2 thread rows 64 floats apart: 2-way conflicts) + 2 LDS.128 B loads
            # (16 float4s 32 B apart: columns 0, 4, 8, 12 share banks: 4 wavefronts each)
            iters = p.steps * p.depth
            p = _replace(p, lds=iters * 10.0, lds_wavefronts=(8 * 2 + 2 * 4) / 10.0)
        else:
            cands = [_vendor_profile(sp, t) for t in ((128, 128), (128, 64), (64, 64))]
            p = min(cands, key=lambda q: simulate(q, sp.spec).seconds)
        out.append((name, gpu, p, pub, src))
    return out
