"""Convolutions in the channel-blocked layout NCHW[b]c (issue 14: a layout chosen per network).

onnxruntime runs a CNN's convolutions in NCHW8c from the first conv to the last: every activation is
``[n][c / 8][h][w][8]``, so a kernel vectorizes over 8 channels with no transposes, whatever the image
size (a 7x7 plane is 49 vectors of 8 channels, not 6 vectors of 8 pixels and a remainder). felixjax's
NCHW kernels either vectorize along the width (partial vectors on 7- and 14-wide planes) or block the
channels inside the kernel and pay the copy in and out (``conv_spatial_pack``).

Op ``conv2d_nchwc`` is the same convolution on blocked operands, written as a contraction whose lanes
are their own axes, so every index map stays affine and the rest of ``codegen`` (spaces, lowering,
features, the relaxation) needs no special case:

* groups 1: spatial ``n, k (out blocks), y, x, v (lanes)``, reduction ``c (in blocks), u (in lanes),
  ry, rx``; data ``[n*C/b + c][y*sy+ry][x*sx+rx][u]``, weight ``[k][c][ry*s+rx][u][v]`` (``k`` and ``c`` in one dimension), out
  ``[n*K/b + k][y][x][v]``;
* depthwise (groups = channels): spatial ``n, k, y, x, v``, reduction ``ry, rx``; data
  ``[n*C/b + k][y*sy+ry][x*sx+rx][v]``, weight ``[k][ry][rx][v]``.

(The batch and the channel blocks share a dimension, and axes of extent 1 are left out, so the op fits
the relaxation's 8 axes and 4 dimensions per buffer: a 3x3 conv with groups 1 and a batch above one has 9
axes and is not blocked by :mod:`felixjax.layout`.)

The task's inputs are the blocked arrays (:func:`to_blocked`, :func:`weight_to_blocked`); its bias is
the plain per-channel vector. Such tasks are tuned in the layout they run in, under their own database
key (the op name and ``block`` are part of it). One sketch, ``conv_nchwc``: the lanes axis ``v`` is the
SIMD axis and the packed weights' block axis.

Example:
    >>> t = conv2d_nchwc(1, 16, 7, 7, out_channels=32, kernel=1)
    >>> t.name
    'conv2d_nchwc8_1x16x7x7_k32_1x1_s1_p0'
    >>> [a.name for a in t.contraction().axes]  # a batch of one and 1x1 taps: no n, ry, rx axes
    ['k', 'y', 'x', 'v', 'c', 'u']
    >>> t.input_shapes()
    [(2, 7, 7, 8), (8, 1, 8, 8)]
"""
from __future__ import annotations

import numpy as np

from .ops import EXTERNAL_OPS, Access, Axis, Contraction, Task, _params, conv2d

OP = "conv2d_nchwc"
SKETCH = "conv_nchwc"
#: a 1x1 stride-1 blocked conv over one row of H * W pixels (its flattened twin: the same buffers), so
#: the register block's pixels need not divide a 7- or 14-wide row; padded variants pad the pixels
FLAT_SKETCH = "conv_nchwc_flat"
#: a depthwise blocked conv read in place (edges peeled, no padded copy; :mod:`codegen.renderers.dw_nchwc`)
DW_SKETCH = "dw_nchwc"
#: the channel block of AVX2 float32 (one 256-bit vector)
BLOCK = 8


def plain_twin(task: Task) -> Task:
    """The NCHW ``conv2d`` task this blocked task computes (same parameters, bias, act, residual)."""
    params = tuple((k, v) for k, v in task.params if k not in ("block", "plain_data"))
    return Task("conv2d", params, task.bias, task.act, task.residual, task.dtype)


def block_of(task: Task) -> int:
    return int(task.p["block"])


def is_depthwise(task: Task) -> bool:
    p = task.p
    return p["groups"] > 1


def flat_applies(task: Task) -> bool:
    """Whether ``conv_nchwc_flat`` schedules ``task``: a blocked (not ``plain_data``) groups-1 1x1 conv,
    stride 1, no padding, more than one output row."""
    p = task.p
    return (task.op == OP and not plain_data(task) and p["groups"] == 1 and (p["r"], p["s"]) == (1, 1)
            and tuple(p["stride"]) == (1, 1) and not any(p["pad"]) and p["h"] > 1)


def flat_twin(task: Task) -> Task:
    """The twin of a blocked 1x1 conv over one row of ``H * W`` pixels (same buffers, same epilogue)."""
    if not flat_applies(task):
        raise ValueError(f"{task.name}: {FLAT_SKETCH} takes blocked groups-1 1x1 convs, stride 1, no padding")
    p = task.p
    return conv2d_nchwc(p["n"], p["c"], 1, p["h"] * p["w"], out_channels=p["k"], kernel=1, bias=task.bias,
                        act=task.act, residual=task.residual, block=p["block"])


def flat_pad(task: Task, lanes_block: int = 2) -> int | None:
    """The pixel count a padded ``conv_nchwc_flat`` variant computes: the next multiple of
    ``lanes_block`` (2: a 4-block x 2-pixel register block) when ``H * W`` is not one, else None."""
    pixels = task.p["h"] * task.p["w"]
    return None if pixels % lanes_block == 0 else -(-pixels // lanes_block) * lanes_block


def pad_x(task: Task) -> int | None:
    """The output width a padded ``conv_nchwc`` variant computes (``conv_nchwc.pad_x<W+1>``): for a
    blocked groups-1 conv wider than one tap on blocked data whose output width has no divisor from 2 to
    8 (a prime such as 13 or 17: its register block could hold no pixels of a row, only output blocks,
    one weight load per FMA), the next width, when that has a divisor from 3 to 8 (14, 18); else None.
    AVX2 EPYC, 1 thread, defaults side by side: 96x17x17 3x3 23.5 -> 45.5 GFLOP/s, 192x13x13 -> 384
    20.3 -> 32.5."""
    p = task.p
    if task.op != OP or is_depthwise(task) or plain_data(task) or p["s"] < 2:
        return None
    x = plain_twin(task).contraction().axis("x").extent
    if x < 3 or any(x % d == 0 for d in range(2, 9)):
        return None
    return x + 1 if any((x + 1) % d == 0 for d in range(3, 9)) else None


def dw_applies(task: Task) -> bool:
    """Whether ``dw_nchwc`` schedules ``task``: a blocked depthwise conv on blocked data."""
    return task.op == OP and is_depthwise(task) and not plain_data(task)


def dw_geometry(task: Task) -> dict:
    """A blocked depthwise conv's sizes: N, KB (channel blocks), H, W, OH, OW, KH, KW, SY, SX, DY, DX, PT, PL."""
    p = task.p
    ext = {a.name: a.extent for a in plain_twin(task).contraction().axes}
    (sy, sx), (dy, dx), (pt, pl, _, _) = p["stride"], p["dilation"], p["pad"]
    return {"N": p["n"], "KB": p["k"] // block_of(task), "H": p["h"], "W": p["w"], "OH": ext["y"], "OW": ext["x"],
            "KH": p["r"], "KW": p["s"], "SY": sy, "SX": sx, "DY": dy, "DX": dx, "PT": pt, "PL": pl}


def dw_default_schedule(space) -> tuple:
    """``(tiles, parallel, vec, unroll)`` of ``dw_nchwc``'s default: a register block of 1 row x up to 4
    pixels (2 rows x 3 at stride 1, sharing the rows' loads), work units of about 8 rows, OpenMP over
    (channel block, row chunk)."""
    ext = {a.name: a.extent for a in space.axes}
    g = dw_geometry(space.task)

    def largest(n: int, cap: int) -> int:
        return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)

    ry = largest(ext.get("y", 1), 2 if g["SY"] == 1 else 1)
    rx = largest(ext["x"], 4 if ry == 1 else 3)
    y2 = largest(ext.get("y", 1) // ry, max(1, 8 // ry))
    s3 = {"y": ry, "x": rx, "v": ext["v"]}
    tiles = tuple((1, a.extent) if a.reduce else
                  ((a.extent // (ry * y2), 1, y2, ry) if a.name == "y" else (a.extent // s3.get(a.name, 1), 1, 1,
                                                                            s3.get(a.name, 1)))
                  for a in space.axes)
    cores = int(getattr(space.target, "cores", 1) or 1)
    return tiles, int(cores > 1), ext["v"], 1


def plain_data(task: Task) -> bool:
    """The data input is NCHW (a first conv reading the network's image: 3 channels), the output blocked."""
    return bool(task.p.get("plain_data", 0))


def check(task: Task) -> None:
    """A clear error for a blocked conv this layout cannot express."""
    p, b = task.p, task.p.get("block", 0)
    if b < 1:
        raise ValueError(f"{OP}: block must be >= 1, got {b}")
    if task.dtype != "float32" or task.sparsity:
        raise ValueError(f"{OP}: float32 dense convolutions only (got dtype {task.dtype!r}, sparsity {task.sparsity})")
    if p["groups"] not in (1, p["c"]) or (p["groups"] > 1 and p["k"] != p["c"]):
        raise ValueError(f"{OP}: groups must be 1 or the channel count (depthwise), got groups={p['groups']} "
                         f"with c={p['c']}, k={p['k']}")
    if plain_data(task):
        if p["groups"] != 1:
            raise ValueError(f"{OP}: plain_data (NCHW data) takes groups=1, got groups={p['groups']}")
        if p["k"] % b:
            raise ValueError(f"{OP}: the block {b} must divide the out channels (k={p['k']})")
    elif p["c"] % b or p["k"] % b:
        raise ValueError(f"{OP}: the block {b} must divide the in and out channels (c={p['c']}, k={p['k']})")


def conv2d_nchwc(n: int, c: int, h: int, w: int, *, out_channels: int, kernel: int | tuple[int, int] = 3,
                 stride: int | tuple[int, int] = 1, padding: int | tuple[int, ...] = 0,
                 dilation: int | tuple[int, int] = 1, groups: int = 1, bias: bool = False, act: str | None = None,
                 residual: bool = False, block: int = BLOCK, plain_data: bool = False) -> Task:
    """A 2-D convolution on NCHW[block]c data and output (see the module docstring); the same arguments
    as :func:`codegen.ops.conv2d`, plus ``block`` and ``plain_data`` (NCHW data, any channel count: the
    network's first conv; its weights ``[k][c][ry * s + rx][v]``)."""
    plain = conv2d(n, c, h, w, out_channels=out_channels, kernel=kernel, stride=stride, padding=padding,
                   dilation=dilation, groups=groups, bias=bias, act=act, residual=residual)
    extra = {"plain_data": 1} if plain_data else {}  # keys of blocked-data tasks name no such field
    return Task(OP, _params(**plain.p, block=int(block), **extra), bias, act, residual)


def contraction(task: Task) -> Contraction:
    check(task)
    b = block_of(task)
    pc = plain_twin(task).contraction()
    ext = {a.name: a.extent for a in pc.axes}
    p = task.p
    (sh, sw), (dh, dw) = p["stride"], p["dilation"]
    n, _, hp, wp = pc.data.shape
    oh, ow, r, s = ext["y"], ext["x"], p["r"], p["s"]
    kb = p["k"] // b
    # axes of extent 1 (a batch of one, the taps of a 1x1 conv) are left out: the relaxation and the
    # features take at most 8 axes and 4 dimensions per buffer (felixjax.relax.MAX_AXES)
    keep = {"n": n > 1, "ry": r > 1, "rx": s > 1, "y": oh > 1}

    def terms(*pairs: tuple[str, int]) -> tuple[tuple[str, int], ...]:
        return tuple((a, c) for a, c in pairs if keep.get(a, True))

    spatial = tuple(Axis(nm, e, False) for nm, e in (("n", n), ("k", kb), ("y", oh), ("x", ow), ("v", b))
                    if keep.get(nm, True))
    taps = tuple(Axis(nm, e, True) for nm, e in (("ry", r), ("rx", s)) if keep[nm])
    y_in, x_in = terms(("y", sh), ("ry", dh)), terms(("x", sw), ("rx", dw))
    if plain_data(task):
        axes = spatial + (Axis("c", p["c"], True),) + taps
        data = Access("data", (n, p["c"], hp, wp), (terms(("n", 1)), (("c", 1),), y_in, x_in))
        weight = Access("weight", (kb, p["c"], r * s, b), ((("k", 1),), (("c", 1),), terms(("ry", s), ("rx", 1)),
                                                            (("v", 1),)))
        api = (n, p["c"], p["h"], p["w"])
        pad = ((0, 0), (0, 0)) + pc.pad[2:]
    elif is_depthwise(task):
        axes = spatial + taps
        data = Access("data", (n * kb, hp, wp, b), (terms(("n", kb), ("k", 1)), y_in, x_in, (("v", 1),)))
        weight = Access("weight", (kb, r, s, b), ((("k", 1),), terms(("ry", 1)), terms(("rx", 1)), (("v", 1),)))
        api = (n * kb, p["h"], p["w"], b)
    else:
        cb = p["c"] // b
        axes = spatial + (Axis("c", cb, True), Axis("u", b, True)) + taps
        data = Access("data", (n * cb, hp, wp, b), (terms(("n", cb), ("c", 1)), y_in, x_in, (("u", 1),)))
        # [k][c] in one dimension and the lanes v alone in the last: the packed layout (blocked by v's
        # S3 tile, 8) is then this one, so a k block's weights for one input channel are 8 floats apart
        # and consecutive blocks a whole panel apart, not 8 u-rows 27 KB apart
        weight = Access("weight", (kb * cb, r * s, b, b),
                        ((("k", cb), ("c", 1)), terms(("ry", s), ("rx", 1)), (("u", 1),), (("v", 1),)))
        api = (n * cb, p["h"], p["w"], b)
    out = Access("out", (n * kb, oh, ow, b), (terms(("n", kb), ("k", 1)), terms(("y", 1)), (("x", 1),), (("v", 1),)))
    bias = Access("bias", (p["k"],), ((("k", b), ("v", 1)),)) if task.bias else None
    if not plain_data(task):
        pad = ((0, 0),) + pc.pad[2:] + ((0, 0),)
    return Contraction(axes, data, weight, out, bias, api, pad)


# ---- layout conversions (numpy; the network build does the same in C) ----------------------------

def to_blocked(x: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """``[n][c][h][w]`` -> ``[n * c / block][h][w][block]`` (NCHW[block]c with the batch and channel
    blocks in one dimension)."""
    n, c, h, w = x.shape
    return np.ascontiguousarray(np.asarray(x).reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2)
                                .reshape(n * (c // block), h, w, block))


def from_blocked(x: np.ndarray, n: int = 1) -> np.ndarray:
    """``[n * c / b][h][w][b]`` -> ``[n][c][h][w]``."""
    nc, h, w, b = x.shape
    return np.ascontiguousarray(np.asarray(x).reshape(n, nc // n, h, w, b).transpose(0, 1, 4, 2, 3)
                                .reshape(n, nc // n * b, h, w))


def weight_to_blocked(wt: np.ndarray, task: Task) -> np.ndarray:
    """OIHW conv weights in this task's weight layout (``[k * C/b + c][ry * s + rx][u][v]``, depthwise
    ``[k][ry][rx][v]``, ``plain_data`` ``[k][c][ry * s + rx][v]``)."""
    b = block_of(task)
    kk, cg, r, s = wt.shape
    if plain_data(task):
        return np.ascontiguousarray(np.asarray(wt).reshape(kk // b, b, cg, r * s).transpose(0, 2, 3, 1))
    if is_depthwise(task):
        return np.ascontiguousarray(np.asarray(wt).reshape(kk // b, b, r, s).transpose(0, 2, 3, 1))
    return np.ascontiguousarray(np.asarray(wt).reshape(kk // b, b, cg // b, b, r, s).transpose(0, 2, 4, 5, 3, 1)
                                .reshape(kk // b * (cg // b), r * s, b, b))


def weight_from_blocked(wb: np.ndarray, task: Task) -> np.ndarray:
    b, p = block_of(task), task.p
    if plain_data(task):
        kb, c = wb.shape[:2]
        return np.ascontiguousarray(np.asarray(wb).transpose(0, 3, 1, 2).reshape(kb * b, c, p["r"], p["s"]))
    if is_depthwise(task):
        kb, r, s, _ = wb.shape
        return np.ascontiguousarray(np.asarray(wb).transpose(0, 3, 1, 2).reshape(kb * b, 1, r, s))
    kb, cb = p["k"] // b, p["c"] // b
    return np.ascontiguousarray(np.asarray(wb).reshape(kb, cb, p["r"], p["s"], b, b).transpose(0, 5, 1, 4, 2, 3)
                                .reshape(kb * b, cb * b, p["r"], p["s"]))


def reference(task: Task, arrays: list[np.ndarray]) -> np.ndarray:
    """The plain twin's numpy reference, on unblocked inputs, blocked back."""
    names = task.input_names()
    named = dict(zip(names, arrays))
    n = task.p["n"]
    data = named["data"] if plain_data(task) else from_blocked(named["data"], n)
    plain = [data, weight_from_blocked(named["weight"], task)]
    if task.bias:
        plain.append(named["bias"])
    if task.residual:
        plain.append(from_blocked(named["residual"], n))
    return to_blocked(plain_twin(task).reference(*plain), block_of(task))


# ---- the default schedule ----------------------------------------------------------------------

def register_block(ext: dict[str, int], *, regs: int = 16, budget: int = 12,
                   depthwise: bool = False) -> tuple[tuple[int, int, int], float]:
    """``((kb, ry, rx), FMAs per load)`` of the best register block over extents ``ext``: ``kb`` output
    blocks x ``ry x rx`` output pixels, at most ``budget`` accumulators, chosen for the most FMAs per load:
    ``kb`` vector loads of weights and ``ry * rx`` broadcasts feed ``kb * ry * rx`` FMAs while
    accumulators, weights and broadcasts fit the register file (the renderer then pins the weights:
    ``Dialect.pin``); beyond it gcc reads the weights from memory in every FMA (a 3-block x 2x2 block made
    16 loads per 12 FMAs). A depthwise block reads one data vector per FMA.

    Example:
        >>> register_block({"k": 120, "y": 7, "x": 7})[0], register_block({"k": 120, "x": 50})[0]
        ((1, 1, 7), (4, 1, 2))
    """
    best, score = (1, 1, 1), -1.0
    for kb in (d for d in range(1, 7) if ext["k"] % d == 0):
        for ry in (d for d in range(1, budget + 1) if ext.get("y", 1) % d == 0):
            for rx in (d for d in range(1, budget + 1) if ext.get("x", 1) % d == 0):
                acc, px = kb * ry * rx, ry * rx
                if acc > budget:
                    continue
                if depthwise:
                    loads = kb + acc
                elif acc + kb + px <= regs:
                    loads = kb + px
                else:
                    loads = px + acc
                sc = acc / loads + 1e-3 * acc
                if sc > score:
                    best, score = (kb, ry, rx), sc
    return best, score


# accumulators of the default register block: at most the register file's budget (12 on AVX2's 16
# registers); 24 on AVX-512's 32 (Zen 4, benchmarks/accumulator_probe.py, defaults 24 vs 12: 4
# designed-on blocked convs 0.96-1.12x / 1.08-1.09x at 1 / 2 threads, 6 held out 1.00-1.09x / 0.98-1.08x)
ACCUMULATOR_CAP = 24


def default_schedule(space) -> tuple:
    """``(tiles, parallel, vec, unroll)``: the :func:`register_block` in S3, the whole reduction in R1
    (input channels outer, taps inner), OpenMP over output blocks and rows."""
    ext = {a.name: a.extent for a in space.axes}
    depthwise = "c" not in ext and "u" not in ext and not plain_data(space.task)
    (kb, ry, rx), _ = register_block(ext, regs=int(space.target.vector_registers),
                                     budget=min(ACCUMULATOR_CAP, space.max_accumulators),
                                     depthwise=depthwise)
    s3 = {"k": kb, "y": ry, "x": rx, "v": ext["v"]}  # the register block (other spatial axes: 1)
    tiles = [(1, a.extent) if a.reduce else (a.extent // s3.get(a.name, 1), 1, 1, s3.get(a.name, 1))
             for a in space.axes]
    vec = max(v for v in space.vec_choices if ext["v"] % v == 0)
    cores = int(getattr(space.target, "cores", 1) or 1)
    pointwise = "c" in ext and "ry" not in ext and "rx" not in ext
    chunk = max(d for d in range(1, ext.get("c", 1) + 1) if ext.get("c", 1) % d == 0 and d * kb <= 32)
    if pointwise and chunk < ext["c"]:
        return (*_pointwise_schedule(space, ext, s3, cores, chunk), vec, 8)
    taps = tap_chunk(ext, kb) if not depthwise and not plain_data(space.task) else None
    if taps is not None:
        return (*_pointwise_schedule(space, ext, s3, cores, taps, tap_rows=True), vec, 64)
    if pointwise and strided_rows(space.task, ext):
        return (*_row_major_schedule(space, ext, s3, cores), vec, 8)
    par, chunks = 0, 1
    for i, t in enumerate(tiles[: space.n_spatial]):
        if chunks >= 4 * cores:
            break
        par, chunks = i + 1, chunks * t[0]
    return tuple(tiles), par, vec, 8 if pointwise else 1


TAP_CHUNK_BYTES = 24 * 1024  # a chunk's weights for one register block: most of a 32 KB L1


def tap_chunk(ext: dict[str, int], kb: int) -> int | None:
    """Input-channel blocks per chunk of a blocked direct conv's default when the weights one register
    block reads (``kb`` out blocks x all input channels x taps) exceed :data:`TAP_CHUNK_BYTES`: the
    largest divisor of the channel blocks whose weights for one kernel row (``kb`` x chunk x 8 lanes x
    kernel width x 8) fit it; ``None`` for a 1x1 conv or where the whole reduction fits."""
    if "ry" not in ext or "c" not in ext:
        return None
    per_c = 4 * kb * ext.get("u", 1) * ext["v"] * ext.get("rx", 1)  # bytes per channel block, one kernel row
    if per_c * ext["c"] * ext["ry"] <= TAP_CHUNK_BYTES:
        return None
    return max(d for d in range(1, ext["c"] + 1) if ext["c"] % d == 0 and (d * per_c <= TAP_CHUNK_BYTES or d == 1))


def strided_rows(task: Task, ext: dict[str, int]) -> bool:
    """Whether a blocked 1x1 conv's default runs row-major (:func:`_row_major_schedule`): at stride 2
    or more (a ResNet's downsampling projection; stride 1 takes the flattened twin) with several output
    rows. With the out blocks outermost, each group of them re-read the whole input, of which a stride-2
    conv uses every other pixel of every other row (64x56x56: 800 KB, from L3, once per group)."""
    return max(task.p["stride"]) > 1 and ext.get("y", 1) > 1


def _row_major_schedule(space, ext: dict[str, int], s3: dict[str, int], cores: int) -> tuple[tuple, int]:
    """``(tiles, parallel)``: output rows (register-block rows) outermost, split among the threads
    with the out blocks in at most as many groups as give 4 chunks per core; in each, every out block
    (S1) sweeps the row (S2), so a row's input is read once from memory and then from cache. 1 thread,
    defaults side by side (cycles per call): 64x56x56 -> 128 1.16x, 128x28x28 -> 256 1.06-1.14x,
    256x14x14 -> 512 1.02-1.08x (``benchmarks/blocked_bcast.py --what strided``)."""
    rows, kbs = ext["y"] // s3["y"], ext["k"] // s3["k"]
    k0 = next((d for d in range(1, kbs + 1) if kbs % d == 0 and d * rows >= 4 * cores), kbs)
    tiles = []
    for a in space.axes:
        b = s3.get(a.name, 1)
        if a.reduce:
            tiles.append((1, a.extent))
        elif a.name == "k":
            tiles.append((k0, kbs // k0, 1, b))
        elif a.name == "x":
            tiles.append((1, 1, a.extent // b, b))
        else:  # n, y, v
            tiles.append((a.extent // b, 1, 1, b))
    return tuple(tiles), [a.name for a in space.axes].index("y") + 1


def _pointwise_schedule(space, ext: dict[str, int], s3: dict[str, int], cores: int, chunk: int,
                        tap_rows: bool = False) -> tuple[tuple, int]:
    """``(tiles, parallel)`` of a blocked 1x1 conv's default: the input channels in chunks whose weights
    for the register block's out blocks take at most 8 KB (L1), the chunk loop (R0) *outside* the pixel
    loops (S2), so a chunk's weights stay in L1 while every pixel of the image reads them, and the
    accumulators are reloaded once per chunk; OpenMP over out-block groups, and over pixel groups where
    those are fewer than 4 per core. 576x14x14 -> 96 (+ residual), 1 thread, interleaved: 0.536 ms
    (whole reduction per register block, weights 36 KB re-read from L2 for every pixel block) -> 0.444
    (chunks of 8 blocks), 0.391 with the 8 lanes of ``u`` unrolled."""
    k0 = ext["k"] // s3["k"]
    pix = "y" if "y" in ext else "x"
    blocks = ext[pix] // s3[pix]
    p0 = next((d for d in range(1, blocks + 1) if blocks % d == 0 and k0 * d >= 4 * cores), blocks)
    tiles = []
    for a in space.axes:
        b = s3.get(a.name, 1)
        if a.name == "c":
            tiles.append((ext["c"] // chunk, chunk))
        elif a.name == "ry" and tap_rows:
            tiles.append((a.extent, 1))
        elif a.reduce:
            tiles.append((1, a.extent))
        elif a.name == pix:
            tiles.append((p0, 1, blocks // p0, b))
        elif a.name in ("x", "y"):
            tiles.append((1, 1, a.extent // b, b))
        else:
            tiles.append((a.extent // b, 1, 1, b))
    par = [a.name for a in space.axes].index(pix) + 1 if p0 > 1 else 1
    return tuple(tiles), par


def default_sketch(task: Task, sketches, target):
    """The sketch an untuned build of a blocked conv uses: ``conv_nchwc``, or for a 1x1 conv its
    flattened twin (padded to an even pixel count where needed) when that allows a register block with
    clearly more FMAs per load: on a 7x7 plane 1 block x 7 pixels (8 loads per 7 FMAs) against 4 blocks x
    2 of 50 pixels (6 per 8); side by side, 1 thread, 160x7x7 -> 960: 0.43 -> 0.26 ms (min of 9)."""
    regs = int(getattr(target, "vector_registers", 16) or 16) if target is not None else 16
    dw = next((sk for sk in sketches if sk.base == DW_SKETCH), None)
    if dw is not None:
        return dw
    best, best_score = sketches[0], None
    for sk in sketches:
        twin = task if sk.base == SKETCH else flat_twin(task)
        ext = {a.name: a.extent for a in contraction(twin).axes} | dict(sk.pad)
        depthwise = is_depthwise(task)
        _, score = register_block(ext, regs=regs, depthwise=depthwise)
        if sk.pad:
            score *= 0.95  # the padded copy in and the cropping epilogue
        if best_score is None or score > 1.1 * best_score:
            best, best_score = sk, score
    return best


def flops(task: Task) -> int:
    return plain_twin(task).flops


EXTERNAL_OPS[OP] = (contraction, reference)  # codegen.ops dispatches to these (it does not import this module)
