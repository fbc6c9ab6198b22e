"""The dedicated depthwise sketch (issue 14): ``dw_rows``, a depthwise conv vectorized along the output
width, with no full padded copy of the input.

A depthwise conv (``groups == channels``; any multiplier, stride, dilation, padding) does 2 FLOPs per
input read from cache: it is memory / load bound, and the generic sketches lose most of their time in
the timed padding copy of the whole input and, at stride 2, in strided scalar loads. This sketch's
kernel (rendered by :mod:`codegen.renderers.depthwise`) works one output channel plane at a time:

* a register block of ``RY`` output rows x ``RX`` vectors of ``vec`` contiguous output columns (the
  ``S3`` tiles of ``y`` and ``x``), the 3x3 (KH x KW) taps broadcast from registers, so every input
  vector loaded feeds ``RY``-fold reuse across tap rows;
* stride 2 loads two vectors and deinterleaves their even lanes (one shuffle; no read past the last
  needed element), other strides gather lane by lane;
* padding: rows outside the image read a zero row (no branch in the vector loop); columns are peeled:
  the output columns whose taps all fall inside the row run vectorized, the few edge columns run a
  guarded scalar loop (``dw_stage = 0``), or each register block's input rows are first staged into a
  small zero-padded row buffer on the thread's stack (in L1), so every column runs vectorized
  (``dw_stage = 1``, the default where it fits: the declared knob below); staged at stride 2, a row is
  deinterleaved once into its even and odd columns, so every tap is one contiguous vector load;
* row chunks of ``y2 * y3`` rows (``S2 x S3`` of ``y``) are the units of work; the OpenMP loop runs
  over (image, output channel, row chunk);
* float16 (float32 accumulation; issue 16): data, weights, residual and output are stored as
  ``_Float16`` (half the bytes of this load-bound op) and everything is computed in float32 (F16C):
  staged rows are widened while staged (at stride 2 widened and deinterleaved in one pass), peeled rows
  (``dw_stage = 0``) are widened on every tap load (vcvtph2ps), the taps once per channel plane, the
  epilogue (bias: float32) runs in float32 and the store rounds once to float16 (vcvtps2ph, nearest
  even). Both ``dw_stage`` values stay in its domain (the staged one is the default: at stride 1 it
  ran ~1.3x the float32 staged kernel, the peeled one ~0.8x, busy machine);
* int8 (uint8 / int8 data, int8 weights): the data widened to float32 minus the zero point (exact)
  while staged, or on every load when peeled (rows outside the image then read a row of zero points),
  the taps widened once per plane, float32 FMAs: each product is an integer of at most 255 * 128 and
  each partial sum stays below 2**24 up to :data:`INT8_MAX_TAPS` taps, so the float32 sum *is* the
  exact int32 sum; the epilogue is the generic one (``acc * (x_scale * w_scale[oc])``, float32 bias and
  residual, activation, float32 output or requantization: round half to even, zero point, saturate).

Its knobs are the core ones (tiles, vec, parallel chunking through the ``y`` tiles) plus ``dw_stage``,
so the random, genetic and gradient strategies and the relaxation need nothing new; its loop nest for
the features and the extractor is the standard lowering of the same tiles (:func:`codegen.lower.lower`
is unchanged), a stand-in of the program like the sparse sketch's.

Example:
    >>> from codegen.ops import depthwise_conv2d
    >>> applies(depthwise_conv2d(1, 32, 28, 28, kernel=3, padding=1)), DW_SKETCH
    (True, 'dw_rows')
"""
from __future__ import annotations

from .ir import DTypes
from .knobs import Knob, register_knob
from .ops import Task

DW_SKETCH = "dw_rows"
STAGE_STACK_BYTES = 96 * 1024  # largest staged row buffer kept on a thread's stack (else dw_stage=0 only)


#: int8: the largest number of taps whose float32 sum of (x - zp) * w is exact (every |product| <=
#: 255 * 128, every partial sum an integer <= 2**24)
INT8_MAX_TAPS = 2 ** 24 // (255 * 128)


def applies(task: Task) -> bool:
    """Whether ``task`` is a float32, float16 or int8 depthwise conv (one input channel per group)
    without sparsity. float16 (float32 accumulation, the precision's default roles) is stored in half
    the bytes and computed in float32: input rows widened while staged (or on load), taps widened once
    per channel plane, the epilogue in float32, the output narrowed on store (F16C); its
    float16-accumulation variant (``dtypes=FP16_ACCUMULATE``) is not (the generic sketches). int8 data
    is widened minus its zero point and accumulated with float32 FMAs, exact up to
    :data:`INT8_MAX_TAPS` taps (kernels up to 22x22), then dequantized or requantized as the generic
    epilogue does."""
    if task.op != "conv2d" or getattr(task, "sparsity", 0):
        return False
    if not task.quantized and (task.dtype not in ("float32", "float16") or task.buffer_dtypes != DTypes.of(task.dtype)):
        return False
    con = task.contraction()
    names = [a.name for a in con.axes]
    if not ("g" in names and "c" in names and con.axis("c").extent == 1 and con.axis("g").extent > 1):
        return False
    return not task.quantized or con.axis("ry").extent * con.axis("rx").extent <= INT8_MAX_TAPS


def geometry(con) -> dict:
    """The conv's sizes from its contraction: N, G (input channels), M (multiplier), OH, OW, H, W, KH,
    KW, SY, SX, DY, DX, PT, PL."""
    ext = {a.name: a.extent for a in con.axes}
    coef = {name: c for dim in con.data.dims[2:] for name, c in dim}
    _, _, h, w = con.data_api_shape
    return {"N": ext["n"], "G": ext["g"], "M": ext["k"], "OH": ext["y"], "OW": ext["x"], "H": int(h), "W": int(w),
            "KH": ext["ry"], "KW": ext["rx"], "SY": coef["y"], "SX": coef["x"], "DY": coef.get("ry", 1),
            "DX": coef.get("rx", 1), "PT": con.pad[2][0], "PL": con.pad[3][0]}


def default_schedule(space) -> tuple:
    """``(tiles, parallel, vec, unroll)`` of the sketch's default: the widest vector dividing the
    width's extent, a register block of up to 4 rows x 2 vectors (at most 8 accumulators of 16
    registers: the taps' broadcast and the loads need the rest), work units of about 16 rows, OpenMP
    over the units."""
    ext = {a.name: a.extent for a in space.axes}

    def largest(n: int, cap: int, multiple: int = 1) -> int:
        return max(d for d in range(1, min(n, cap) + 1) if n % d == 0 and d % multiple == 0) if n >= multiple else 1

    vec = max([v for v in space.vec_choices if ext["x"] % v == 0] or [1])
    xs3 = largest(ext["x"], 2 * vec, vec) if vec > 1 else largest(ext["x"], 4)
    rx = max(1, xs3 // vec)
    ry = largest(ext["y"], max(1, min(4, 8 // rx)))
    y2 = largest(ext["y"] // ry, max(1, 16 // ry))
    tiles = []
    for a in space.axes:
        if a.reduce:
            tiles.append((1, a.extent))
        elif a.name == "y":
            tiles.append((ext["y"] // (ry * y2), 1, y2, ry))
        elif a.name == "x":
            tiles.append((ext["x"] // xs3, 1, 1, xs3))
        else:
            tiles.append((a.extent, 1, 1, 1))
    return tuple(tiles), 1, vec, 1


def stage_rows(geo: dict, ry: int) -> int:
    """Input rows a register block of ``ry`` output rows reads (the staged buffer's rows)."""
    return (ry - 1) * geo["SY"] + (geo["KH"] - 1) * geo["DY"] + 1


def stage_width(geo: dict, vec: int) -> int:
    """Floats per staged row: the padded input row, plus room for one more vector's reach."""
    return geo["PL"] + geo["W"] + (geo["KW"] - 1) * geo["DX"] + geo["SX"] * vec + 8


def _stage_domain(space) -> tuple[int, ...]:
    geo = geometry(space.api_con)
    ry_max = max(d for d in range(1, 17) if geo["OH"] % d == 0)
    fits = 4 * stage_rows(geo, ry_max) * stage_width(geo, 16) <= STAGE_STACK_BYTES
    return (0, 1) if fits else (0,)


#: 0: peeled, guarded scalar edge columns; 1 (the default where it fits): each register block's input
#: rows staged, zero-padded, into a small row buffer on the stack, so every column runs vectorized (at
#: stride 2 deinterleaved into even and odd columns once per row: contiguous loads). No features of its own (the
#: reserved feature slots are taken by the sparse knobs and the knob walkthrough's): the cost model
#: tells the two apart only through the measurements it is trained on
DW_STAGE = register_knob(Knob(
    "dw_stage", (DW_SKETCH,), _stage_domain, lambda space: max(_stage_domain(space)), relax="index",
    mutation_weight=0.1,
    doc="depthwise: stage each register block's input rows into a zero-padded row buffer (1) or peel the edges (0)"))
