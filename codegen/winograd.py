"""The Winograd sketches (issue 14, algorithm choice): ``conv_winograd``, F(2x2, 3x3), and
``conv_winograd4``, F(4x4, 3x3), for float32 3x3 stride-1 convolutions.

A 3x3 stride-1 conv computes each m x m output tile from an alpha x alpha input patch (alpha = m + 2).
Winograd's minimal filtering algorithm F(m x m, 3x3) does it with alpha^2 multiplies instead of 9 m^2:
16 instead of 36 for F(2x2) (2.25x fewer), 36 instead of 144 for F(4x4) (4x fewer). With the variant's
fixed matrices ``B`` (alpha x alpha), ``G`` (alpha x 3) and ``A`` (alpha x m) (:class:`Variant`),

    Y = A^T [ (G g G^T) * (B^T d B) ] A       (``*``: elementwise, summed over input channels)

so a conv becomes alpha^2 independent GEMMs (one per position ``e`` of the transformed domain):
``M[e][t][k] = sum_c V[e][c][t] U[e][c][k]`` with ``U = G g G^T`` (weights, transformed at load,
untimed) and ``V = B^T d B`` (the input patch of tile ``t``, transformed in the kernel, timed), followed
by the output transform ``A^T M A`` (timed, with the bias, residual and activation fused).

The kernel (rendered by :mod:`codegen.renderers.winograd`) works on blocks of tiles: for each block
(``YB x XB`` tiles, one work unit of the OpenMP loop) it transforms the block's input patches of every
input channel into a thread-local ``V`` (``alpha^2 x C x TB`` floats, tiles contiguous), then, per block of
``KV`` output channels, runs the alpha^2 GEMMs with a register block of ``YR x XR`` tiles x ``KV / vec``
channel vectors (tiles broadcast, transformed weights loaded as vectors, the same micro-kernel shape as
``conv_spatial_pack``'s), writes ``M`` (``alpha^2 x TB x KV``, in L1) and transforms it to output.

The schedule space is the generic one over a *virtual* contraction: an alpha x alpha "conv" over the
tile grid (``y`` = tile rows, ``x`` = tile columns, ``ry`` / ``rx`` = the transformed domain), so the features, the
extractor and the relaxation see the GEMM stage's loop nest (:func:`virtual_task`). Its tiles mean:
``S3`` of ``k`` channels per register block (the vector axis), ``S3`` of ``y`` / ``x`` the register
block's tile rows / columns, ``S2 x S3`` of ``y`` / ``x`` the work unit's tiles, ``R1`` of ``c`` the
input channels per register-block pass (``R0 > 1``: partial sums accumulate in ``M``); ``parallel > 0``
runs the work units in parallel. The ``ry`` / ``rx`` tiles and ``unroll`` do not change the kernel.

Accuracy: F(2x2, 3x3)'s transforms add and halve in float32; its error stays well within the float32
check (rtol 1e-4): max |error| / max |output| against a float64 direct conv, random data: 4.0e-7 (conv
64x56x56), 6.1e-7 (256x14x14), 2.4e-7 (32x17x17), vs 8.5e-7, 1.5e-6, 5.3e-7 for ``conv_spatial_pack``
(fewer products summed per output). F(4x4, 3x3)'s coefficients (up to 8 in ``A``, 1/24 in ``G``) cost
about ten times that: 4.6e-6 on a 64-channel 20x20 conv (F(2x2): 3.9e-7; tests/test_winograd.py), 5.6e-6
on 64x56x56, 7.2e-6 on 128x28x28, 1.6e-5 on 512x7x7 (``benchmarks/winograd_f4.py`` prints it per conv):
still 6-20x inside the check, but a user comparing bit for bit against a direct conv sees it.

It is one of the sketches of every task it applies to (so the tuner can pick it), and the default
sketch where :func:`prefer_by_default` says so (F(4x4) where its tiles waste little:
:func:`default_variant`). F(2x2) measured on the AVX2 EPYC (1 thread, untuned defaults,
interleaved with onnxruntime at its default settings, ``benchmarks/conv_block_probe.py``, machine
with one other job running): 1.21x onnxruntime on conv 64x56x56, 1.26x on 128x28x28, 1.30x on
128x17x17, 1.59x on 256x14x14, 1.74x on 96x24x24, where the best direct default ran 0.64-1.02x;
0.59x on 512x7x7 (a 4x4 tile grid; not the default there). A first version ran 2.2x *slower* than
the direct sketch: its OpenMP loop asked for the workspace's thread count (``num_threads(2)``)
whatever the caller set, so "1 thread" ran 2 threads on a core shared with another job; the loop now
runs ``min(omp_get_max_threads(), workspace threads)``.

Example:
    >>> from codegen.ops import conv2d
    >>> applies(conv2d(1, 32, 16, 16, out_channels=32, kernel=3, padding=1)), WG_SKETCH
    (True, 'conv_winograd')
    >>> applies(conv2d(1, 32, 16, 16, out_channels=32, kernel=3, stride=2, padding=1))
    False
    >>> virtual_task(conv2d(1, 32, 16, 16, out_channels=32, kernel=3, padding=1)).contraction().axis("x").extent
    8
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .ops import Task, conv2d

WG_SKETCH = "conv_winograd"
WG4_SKETCH = "conv_winograd4"

#: F(2x2, 3x3) transforms: V = BT d BT^T, U = G g G^T, Y = AT M AT^T
BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64)
#: F(4x4, 3x3) transforms (interpolation points 0, +-1, +-2 and infinity; Lavin & Gray 2016)
BT4 = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], dtype=np.float64)
G4 = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
               [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], dtype=np.float64)
AT4 = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
               dtype=np.float64)


@dataclass(frozen=True, eq=False)  # identity: F2 / F4 are the only instances
class Variant:
    """One Winograd algorithm F(m x m, 3x3): ``m x m`` output tiles from ``alpha x alpha`` input patches
    (``alpha = m + 2``), ``alpha**2`` GEMMs; its sketch name and transform matrices."""

    sketch: str
    m: int
    BT: np.ndarray = field(repr=False)
    G: np.ndarray = field(repr=False)
    AT: np.ndarray = field(repr=False)

    @property
    def alpha(self) -> int:
        return self.m + 2


F2 = Variant(WG_SKETCH, 2, BT, G, AT)
F4 = Variant(WG4_SKETCH, 4, BT4, G4, AT4)
VARIANTS = {v.sketch: v for v in (F2, F4)}


def variant_of(sketch) -> Variant:
    """The variant of a Winograd sketch (a :class:`codegen.space.Sketch`, or its name)."""
    name = getattr(sketch, "base", sketch)
    return VARIANTS[name]

MIN_CHANNELS = 8  # below this the transforms cost more than the multiplies saved


def applies(task: Task) -> bool:
    """Whether ``task`` is a float32 3x3 stride-1, dilation-1, ungrouped conv (any padding, bias,
    residual, activation) with at least :data:`MIN_CHANNELS` input and output channels, a multiple of 4
    output channels, and an output of at least 2x2."""
    if task.op != "conv2d" or task.dtype != "float32" or getattr(task, "sparsity", 0) or task.quantized:
        return False
    p = task.p
    if (p["r"], p["s"]) != (3, 3) or tuple(p["stride"]) != (1, 1) or tuple(p["dilation"]) != (1, 1):
        return False
    if p["groups"] != 1 or p["c"] < MIN_CHANNELS or p["k"] < MIN_CHANNELS or p["k"] % 4:
        return False
    oh, ow = task.output_shape[2:]
    return oh >= 2 and ow >= 2


def applies4(task: Task) -> bool:
    """Whether F(4x4, 3x3) (:data:`WG4_SKETCH`) applies: where F(2x2, 3x3) does and the output is at
    least 4x4 (one whole tile)."""
    return applies(task) and min(task.output_shape[2:]) >= 4


MIN_DEFAULT_TILES = 36  # tile grids from this size on (outputs from ~11 x 11) use Winograd by default
#: smaller grids too where at least this share of the tiles' 2x2 outputs is inside the image (even sizes
#: and 9x9: 8x8 -> 256: 1.38x / 1.26x the direct default at 1 / 2 threads; session 12, after small grids
#: split their output channels over threads). 7x7 (0.77) keeps the direct default: alone 0.97-1.30x, but
#: in ResNet-18 at 224 its three 512x7x7 convs made the network 4-9% slower (their Winograd weights, 16.8
#: MB each, come from DRAM there); 5x5 (0.69) and 3x3 (0.56) too
MIN_TILE_USE = 0.8


def prefer_by_default(task: Task, target=None) -> bool:
    """Whether an untuned build uses this sketch: a tile grid of at least :data:`MIN_DEFAULT_TILES`
    tiles, or a smaller one that wastes little (:data:`MIN_TILE_USE`), on a target with at least 4
    float32 lanes. On the AVX2 EPYC (1 thread, untuned defaults,
    ``benchmarks/conv_block_probe.py``) it ran 1.2-1.7x onnxruntime on 3x3 convs with 12x12 to 28x28
    tile grids (the best direct default: 0.6-1.0x), but 0.59x on a 512x7x7 conv (4x4 tiles), where
    the column-padded direct sketch ran 0.66x."""
    if target is not None and int(getattr(target, "simd_lanes", 8)) < 4:
        return False
    g = geometry(task)
    return g["TH"] * g["TW"] >= MIN_DEFAULT_TILES or g["OH"] * g["OW"] >= MIN_TILE_USE * 4 * g["TH"] * g["TW"]


#: F(4x4, 3x3) is the default over F(2x2, 3x3) where its tile grid wastes at most this share of work (padded
#: tile outputs / real outputs) and has at least :data:`MIN_F4_TILES` tiles. Untuned defaults side by side,
#: AVX2 EPYC, 1 thread (``benchmarks/winograd_f4.py``): F(4x4) 1.08-1.9x F(2x2) on 12 grids from 8x8 to
#: 112x112 whose 4x4 tiles cover the output exactly, and on 17x17 (waste 1.38: 1.27x), but 0.67-0.82x on
#: 256x14x14 (waste 1.31, 9.4 MB of transformed weights)
MAX_F4_WASTE = 1.2
#: the default work unit's transformed input ``V`` fits the L1d (:func:`v_budget`); False: a quarter of L2,
#: the rule before session 21 (kept for ``benchmarks/winograd_block_probe.py``)
V_IN_L1 = True


def v_budget(target, variant: Variant) -> int:
    """Bytes the default work unit's ``V`` (``alpha^2 x C x tiles`` floats) may fill: the L1d for F(4x4), a
    quarter of L2 for F(2x2) (on 6 convs whose default is F(2x2), the L1d budget changed 4 work units and
    ran 0.93-0.99x: not adopted there).

    Why (issue 14, Zen 4, F(4x4) defaults, 1 / 2 threads, ``benchmarks/winograd_block_probe.py``): with ``V``
    in a quarter of L2 the 64-channel 32x32 conv ran 16 tiles per unit at 78 GFLOP/s (below the direct
    conv's 113); with ``V`` in L1, 4 tiles at 122. Over 6 designed-on 3x3 convs 1.12x / 1.09x geomean, over
    8 held-out ones 1.14x / 1.15x (none more than 3% / 5% slower: 64x56x56, 28 -> 4 tiles)."""
    if not V_IN_L1 or variant is not F4:
        return int(getattr(target, "l2_bytes", 0) or 1 << 19) // 4
    return int(getattr(target, "l1d_bytes", 0) or 1 << 15)
MIN_F4_TILES = 4


def default_variant(task: Task, target=None) -> Variant | None:
    """The Winograd variant an untuned build uses for ``task``, or None (a direct sketch): F(2x2, 3x3) where
    :func:`prefer_by_default` says so, F(4x4, 3x3) instead where its tiles waste little (:data:`MAX_F4_WASTE`,
    :data:`MIN_F4_TILES`)."""
    if not (applies(task) and prefer_by_default(task, target)):
        return None
    g4 = geometry(task, 4)
    waste = 16 * g4["TH"] * g4["TW"] / (g4["OH"] * g4["OW"])
    if applies4(task) and waste <= MAX_F4_WASTE and g4["TH"] * g4["TW"] >= MIN_F4_TILES:
        return F4
    return F2


def geometry(task: Task, m: int = 2) -> dict:
    """Sizes: N, C, K, H, W, OH, OW, PT, PL (top / left padding), TH, TW (tile rows / columns of ``m x m``
    output tiles)."""
    p = task.p
    con = task.contraction()
    oh, ow = task.output_shape[2:]
    return {"N": p["n"], "C": p["c"], "K": p["k"], "H": p["h"], "W": p["w"], "OH": int(oh), "OW": int(ow),
            "PT": con.pad[2][0], "PL": con.pad[3][0], "TH": -(-int(oh) // m), "TW": -(-int(ow) // m)}


def virtual_task(task: Task, v: Variant = F2) -> Task:
    """The ``alpha x alpha`` "conv" over the tile grid whose contraction is the Winograd sketch's schedule
    space (axes ``n g k y x c ry rx`` with ``y`` / ``x`` the tile rows / columns and ``ry`` / ``rx`` =
    ``alpha``: 4 for F(2x2, 3x3), 6 for F(4x4, 3x3))."""
    g = geometry(task, v.m)
    return conv2d(g["N"], g["C"], g["TH"] + v.alpha - 1, g["TW"] + v.alpha - 1, out_channels=g["K"],
                  kernel=v.alpha, bias=task.bias, act=task.act, residual=task.residual)


def transform_weight(weight: np.ndarray, kv: int, v: Variant = F2) -> np.ndarray:
    """``U = G g G^T`` of OIHW 3x3 weights, float32, laid out ``[e][K / kv][C][kv]`` (``e`` the
    ``alpha**2`` positions of the transformed domain, row-major; channel blocks of ``kv``: one register
    block's vectors)."""
    w = np.asarray(weight, dtype=np.float64)
    k, c = w.shape[:2]
    if w.shape[2:] != (3, 3) or k % kv:
        raise ValueError(f"winograd weights: expected [K, C, 3, 3] with K a multiple of {kv}, got {w.shape}")
    u = np.einsum("ai,kcij,bj->abkc", v.G, w, v.G)  # [alpha][alpha][K][C]
    u = u.reshape(v.alpha ** 2, k // kv, kv, c).transpose(0, 1, 3, 2)  # [e][kb][C][kv]
    return np.ascontiguousarray(u, dtype=np.float32).reshape(-1)


def schedule(space, cfg) -> dict:
    """The kernel's schedule read from a config of the sketch's space (see the module docstring)."""
    t = {a.name: tl for a, tl in zip(space.axes, cfg.tiles)}
    return {"KV": t["k"][-1], "YR": t["y"][-1], "XR": t["x"][-1], "YB": t["y"][-1] * t["y"][-2],
            "XB": t["x"][-1] * t["x"][-2], "CB": t["c"][-1], "vec": cfg.vec, "parallel": cfg.parallel > 0}


def workspace_floats(space, cfg, threads: int) -> int:
    """Floats of workspace: per thread ``V`` (alpha^2 x C x TB) and ``M`` (alpha^2 x TB x KV), 16-float
    aligned."""
    s = schedule(space, cfg)
    tb = s["YB"] * s["XB"]
    e = variant_of(space.sketch).alpha ** 2
    per = e * space.task.p["c"] * tb + e * tb * s["KV"]
    per += -per % 16
    return max(1, threads) * per


def finish_plan(plan):
    """The lowering's last step for this sketch: the workspace of :func:`workspace_floats` for the
    target's cores (the kernel's OpenMP loop runs at most that many threads)."""
    from dataclasses import replace

    threads = max(1, int(getattr(plan.space.target, "cores", 1) or 1))
    return replace(plan, workspace=workspace_floats(plan.space, plan.config, threads), data_copy=False)


def default_schedule(space) -> tuple:
    """``(tiles, parallel, vec, unroll)``: the register block with the most accumulators (at most 12):
    2 channel vectors where ``K`` and the tile grid allow, else 1 vector over more tiles (a 7 x 7 tile
    grid: 7 tiles x 1 vector, not 1 x 2), tiles from the columns then the rows; work units of up to 48
    tiles whose ``V`` stays within the L1d (:func:`v_budget`; at least one register block), every input
    channel in one pass."""
    ext = {a.name: a.extent for a in space.axes}

    def largest(n: int, cap: int, multiple: int = 1) -> int:
        return max([d for d in range(1, min(n, cap) + 1) if n % d == 0 and d % multiple == 0] or [1])

    vec = max(v for v in space.vec_choices if ext["k"] % v == 0)
    best = None  # (accumulators, kv, xr, yr): 2 channel vectors preferred, else 1 with more tiles
    for kv in dict.fromkeys((largest(ext["k"], 2 * vec, vec), vec)):
        budget = max(1, space.default_accumulators // (kv // vec))
        for xr in (d for d in range(1, budget + 1) if ext["x"] % d == 0):
            yr = largest(ext["y"], budget // xr)
            acc = xr * yr * (kv // vec)
            if best is None or (acc, kv, xr) > (best[0], best[1], best[2]):
                best = (acc, kv, xr, yr)
    _, kv, xr, yr = best
    variant = variant_of(space.sketch)
    cap_tiles = max(yr * xr, v_budget(space.target, variant) // (4 * variant.alpha ** 2 * ext["c"]))
    xb = xr * largest(ext["x"] // xr, max(1, min(48, cap_tiles) // (xr * yr)))
    yb = yr * largest(ext["y"] // yr, max(1, min(48, cap_tiles) // (xb * yr)))
    tiles = []
    for a in space.axes:
        if a.reduce:
            tiles.append((1, a.extent))
        elif a.name == "k":
            tiles.append((ext["k"] // kv, 1, 1, kv))
        elif a.name == "y":
            tiles.append((ext["y"] // yb, 1, yb // yr, yr))
        elif a.name == "x":
            tiles.append((ext["x"] // xb, 1, xb // xr, xr))
        else:
            tiles.append((a.extent, 1, 1, 1))
    return tuple(tiles), 1, vec, 1


def reference(task: Task, arrays: list[np.ndarray], v: Variant = F2) -> np.ndarray:
    """F(m x m, 3x3) in numpy, float64 (the algorithm the kernel runs, for tests): the conv of ``arrays``
    (data, weights, then bias / residual as the task has them)."""
    g = geometry(task, v.m)
    m_, a_ = v.m, v.alpha
    x, w = np.asarray(arrays[0], np.float64), np.asarray(arrays[1], np.float64)
    th, tw = g["TH"], g["TW"]
    xp = np.zeros((g["N"], g["C"], m_ * th + 2, m_ * tw + 2))
    hi, wi = min(g["H"], m_ * th + 2 - g["PT"]), min(g["W"], m_ * tw + 2 - g["PL"])
    xp[:, :, g["PT"]: g["PT"] + hi, g["PL"]: g["PL"] + wi] = x[:, :, :hi, :wi]
    d = np.lib.stride_tricks.sliding_window_view(xp, (a_, a_), axis=(2, 3))[:, :, ::m_, ::m_]  # n c th tw a a
    vv = np.einsum("ai,nctuij,bj->nabtuc", v.BT, d, v.BT)
    u = np.einsum("ai,kcij,bj->abkc", v.G, w, v.G)
    m = np.einsum("nabtuc,abkc->nabtuk", vv, u)
    y = np.einsum("ia,nabtuk,jb->nktiuj", v.AT, m, v.AT).reshape(g["N"], g["K"], m_ * th, m_ * tw)
    y = y[:, :, : g["OH"], : g["OW"]]
    rest = list(arrays[2:])
    if task.bias:
        y = y + np.asarray(rest.pop(0), np.float64)[None, :, None, None]
    if task.residual:
        y = y + np.asarray(rest.pop(0), np.float64)
    if task.act in ("relu", "relu6"):
        y = np.maximum(y, 0.0)
        if task.act == "relu6":
            y = np.minimum(y, 6.0)
    return y.astype(np.float32)
