"""Lowering: (task, sketch, config) -> a loop nest plan that renderers turn into source.

The plan is the loop IR of felixjax: the ordered loop levels ``S0 S1 R0 S2 R1 S3`` (each loop an
``(axis, level, extent)``), the physical layout of every buffer, and for every buffer the integer
stride of every loop variable, so that an access's address is ``sum(stride[v] * v)`` over the loop
variables. Layout decisions (padding copies, channel blocking, packed weight panels) are made here,
once, and shared by the C renderer, the weight packer and the feature extractor.

Layout rules (DESIGN.md ③):

* weights are packed once at load (untimed): blocked by the ``S3`` tile of ``sketch.weight_axis``,
  the block index moved to the front (a panel per block) and the block innermost;
* the data input is copied inside the kernel (timed) when it needs padding, or when it depends on the
  vector axis with a non-unit stride that blocking can fix (NCHW -> NCHW[x]c);
* the output accumulates in place when the vector axis is unit-stride in it, else in a blocked
  scratch buffer that the fused epilogue unpacks into the API layout.

Example:
    >>> from codegen.ops import matmul
    >>> from codegen.space import Space
    >>> from codegen.target import Target
    >>> sp = Space(matmul(64, 64, 64), "gemm_packed", Target.cpu())
    >>> plan = lower(sp, sp.default())
    >>> plan.buffers["weight"].size
    4096
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from .flat import IM2COL_SKETCH
from .ir import DTypes
from .ops import Access, Contraction
from .padding import embed
from . import winograd as _wg
from .space import MAX_UNROLL_STEP, Config, Space

LEVEL_ORDER = (("S", 0), ("S", 1), ("R", 0), ("S", 2), ("R", 1), ("S", 3))
ALIGN_FLOATS = 16  # 64-byte alignment of workspace sub-buffers
#: sketches whose plan is finished by a lowering of their own, ``base name -> finish(plan) -> Plan``
#: (registered by :mod:`codegen.sparse_lower`: the sparse sketch's weights compiled into the kernel)
SKETCH_LOWERINGS: dict = {}
SKETCH_LOWERINGS[_wg.WG_SKETCH] = SKETCH_LOWERINGS[_wg.WG4_SKETCH] = _wg.finish_plan
WS_UNIT = 4  # bytes of one workspace slot (``Buffer.ws_offset`` and ``Plan.workspace`` count slots)


@dataclass(frozen=True)
class Loop:
    """One loop of the nest: tile ``level`` of ``axis``; ``var`` is its C variable name.

    ``reduce``: a reduction axis's loop (its :attr:`kind` is ``"reduce"``, else ``"spatial"``);
    ``mapping``: how it runs (:data:`codegen.ir.LOOP_MAPPINGS`): ``parallel`` (the fused S0 loops),
    ``vectorized`` (the vector axis's S3 tile, ``vec`` lanes at a time), ``unrolled`` (the other S3
    loops of the register block, and the innermost R1 loop when ``unroll > 1``), else ``serial``;
    ``gpu_block`` / ``gpu_thread`` are reserved for the CUDA sketches."""

    axis: str
    level: int
    extent: int
    reduce: bool = False
    mapping: str = "serial"

    @property
    def var(self) -> str:
        return f"{self.axis}{self.level}"

    @property
    def kind(self) -> str:
        return "reduce" if self.reduce else "spatial"


@dataclass(frozen=True)
class DimLayout:
    """How one logical dimension maps to memory: ``plain`` (offset = stride * i) or ``block``
    (offset = stride * (i // block) + (i % block), the block innermost with stride 1)."""

    kind: str
    stride: int
    block: int = 1


@dataclass(frozen=True)
class Layout:
    """Physical layout of a buffer: one :class:`DimLayout` per logical dimension of its access."""

    shape: tuple[int, ...]  # logical shape
    dims: tuple[DimLayout, ...]
    size: int  # floats

    def offsets(self) -> np.ndarray:
        """Physical offset of every logical element (array of the logical shape)."""
        out = np.zeros(self.shape, dtype=np.int64)
        for d, (n, dl) in enumerate(zip(self.shape, self.dims)):
            i = np.arange(n, dtype=np.int64).reshape([-1 if j == d else 1 for j in range(len(self.shape))])
            out = out + (dl.stride * i if dl.kind == "plain" else dl.stride * (i // dl.block) + i % dl.block)
        return out

    def pack(self, array: np.ndarray, dtype: np.dtype | str = np.float32) -> np.ndarray:
        """Copy a logical-layout array into this layout (flat, of ``dtype``)."""
        flat = np.zeros(self.size, dtype=dtype)
        flat[self.offsets().ravel()] = np.asarray(array, dtype=dtype).ravel()
        return flat

    def unpack(self, flat: np.ndarray) -> np.ndarray:
        return np.asarray(flat)[self.offsets()]


def plain_layout(shape: tuple[int, ...]) -> Layout:
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    return Layout(tuple(shape), tuple(DimLayout("plain", s) for s in strides), math.prod(shape))


def blocked_layout(shape: tuple[int, ...], dim: int, block: int, *, front: bool) -> Layout:
    """Block logical ``dim`` by ``block``: the block index goes first (``front``) or stays in place, the
    in-block index goes innermost."""
    if shape[dim] % block:
        raise ValueError(f"block {block} does not divide dimension {dim} of extent {shape[dim]}")
    outer = shape[dim] // block
    # physical order of (logical dim, part) pairs
    others = [d for d in range(len(shape)) if d != dim]
    order = ([("o", dim)] + [("p", d) for d in others]) if front else [
        (("o", d) if d == dim else ("p", d)) for d in range(len(shape))]
    order.append(("i", dim))
    sizes = [outer if part == "o" else (block if part == "i" else shape[d]) for part, d in order]
    strides = [1] * len(order)
    for j in range(len(order) - 2, -1, -1):
        strides[j] = strides[j + 1] * sizes[j + 1]
    dims = []
    for d in range(len(shape)):
        if d == dim:
            dims.append(DimLayout("block", strides[order.index(("o", d))], block))
        else:
            dims.append(DimLayout("plain", strides[order.index(("p", d))]))
    return Layout(tuple(shape), tuple(dims), math.prod(shape))


@dataclass(frozen=True)
class Buffer:
    """A buffer of the kernel: its access (index maps), layout, and where it lives."""

    name: str
    access: Access
    layout: Layout
    storage: str  # "arg" (a kernel argument) or "workspace"
    ws_offset: int = 0  # in floats, for workspace buffers
    strides: tuple[tuple[str, int], ...] = ()  # loop var -> stride
    scope: str = "global"  # codegen.ir.SCOPES: arguments and the workspace are global memory
    dtype: str = "float32"  # element type (the task's dtype of the buffer's role, codegen.ir.DTypes)

    @property
    def size(self) -> int:
        return self.layout.size

    def stride(self, var: str) -> int:
        return dict(self.strides).get(var, 0)


@dataclass(frozen=True)
class Plan:
    """The lowered kernel. ``levels[name]`` lists the loops of each level in nest order."""

    space: Space = field(repr=False)
    config: Config
    levels: dict[str, tuple[Loop, ...]]
    parallel: tuple[Loop, ...]  # fused S0 loops run by the OpenMP parallel loop
    buffers: dict[str, Buffer]
    args: tuple[str, ...]  # kernel argument buffers in ABI order (inputs, then out)
    data_copy: bool  # the data input is copied (padded / blocked) inside the kernel
    acc: str  # buffer the reduction accumulates into ("out" or "scratch")
    epilogue: bool  # a fused epilogue pass runs after each S1 tile's reduction
    workspace: int  # 4-byte slots (see ``workspace_bytes``; float32 elements for a float32 task)
    vector_axis: str
    vec: int
    unroll: int  # the unroll step built: the config's, at most ``codegen.space.MAX_UNROLL_STEP``
    #: lines declared knobs emit at renderer sites (:class:`codegen.knobs.Hook`; see ``Knob.lower``)
    hooks: tuple = ()
    #: a ``gemm_packed`` padded on ``m`` only: the first data row of the partial register block(s),
    #: whose rows the kernel reads from ``data_tail`` (a small zero-padded copy) instead of copying the
    #: whole data input; -1 otherwise (see :func:`lower`)
    tail_row: int = -1
    #: int8 only: reduction steps per dot-product instruction (:func:`int8_pairs`): 4 on a VNNI target
    #: (``vpdpbusd``, weights in groups of four along the innermost R1 loop, their per-channel sums
    #: appended at load for the zero-point correction) and on AVX2 for 7-bit weights (``vpmaddubsw`` +
    #: ``vpmaddwd`` with ones, same layout), 2 on AVX2 (``vpmaddwd`` on exact int16 pairs), 1 otherwise
    #: (widening int8 -> int32 multiplies)
    pairs: int = 1
    #: groups of four (``pairs == 4``) whose data steps along the reduction with a stride (a conv's
    #: channels, NCHW): the timed data copy interleaves the channels in fours (NCHW -> N(C/4)HW4), so a
    #: group is one 4-byte broadcast instead of four byte loads; pairs (``pairs == 2``): the copy holds
    #: ``x - x_zp`` as int16 pairs (the data buffer's dtype "int16"; see :func:`_quad_data`)
    data_quads: bool = False

    @property
    def con(self) -> Contraction:
        return self.space.con

    @property
    def dtype(self) -> np.dtype:
        """Element type of the kernel's buffers (the task's dtype; float32 until low precision lands)."""
        return np.dtype(self.space.task.dtype)

    @property
    def dtypes(self) -> DTypes:
        """Element types per role (inputs, weights, accumulator, output) of the task."""
        return self.space.task.buffer_dtypes

    @property
    def scopes(self) -> dict[str, str]:
        """Where every buffer lives (:data:`codegen.ir.SCOPES`), plus the register block's
        ``accumulators`` (thread-local registers)."""
        return {**{name: b.scope for name, b in self.buffers.items()}, "accumulators": "local"}

    @property
    def layouts(self) -> dict[str, Layout]:
        """The physical layout of every buffer."""
        return {name: b.layout for name, b in self.buffers.items()}

    @property
    def workspace_bytes(self) -> int:
        """Size of the workspace the kernel ABI passes last (a byte buffer, 64-byte aligned)."""
        return self.workspace * WS_UNIT

    def arg_dtypes(self) -> tuple[np.dtype, ...]:
        """Element type of every kernel argument buffer, in ABI order (``args``: inputs, then out)."""
        return tuple(np.dtype(self.buffers[a].dtype) for a in self.args)

    def loops(self) -> tuple[Loop, ...]:
        """All loops in nest order ``S0 S1 R0 S2 R1 S3`` (extent-1 loops included)."""
        return tuple(lp for name in ("S0", "S1", "R0", "S2", "R1", "S3") for lp in self.levels[name])

    def pack_weight(self, weight: np.ndarray) -> np.ndarray:
        """Weights in the kernel's packed layout (done once at load, not timed)."""
        if self.space.sketch.base in _wg.VARIANTS:  # transformed: U = G g G^T (codegen.winograd)
            return _wg.transform_weight(weight, _wg.schedule(self.space, self.config)["KV"],
                                        _wg.variant_of(self.space.sketch))
        from .ops import check_weight_range
        check_weight_range(self.space.task, weight)  # 7-bit weights: out of range would saturate vpmaddubsw
        layout = self.buffers["weight"].layout
        # conv_flat / conv_im2col schedule a twin task whose weights are the same memory, reshaped
        full = embed(np.reshape(weight, self.space.api_con.weight.shape), layout.shape)
        flat = layout.pack(full, dtype=self.arg_dtypes()[1])
        g = self.pairs
        if g > 1:  # interleave rows k .. k+g-1 of every panel: ..., w[k][q], w[k+1][q], ..., w[k+g-1][q], ...
            sk = self.buffers["weight"].stride(_pair_loop(self).var)
            flat = flat.reshape(-1, g, sk).transpose(0, 2, 1).reshape(-1).copy()
        if g == 4:  # VNNI reads raw uint8 data: append sum_k w per output channel (int32, 64-byte aligned)
            ch = 1 if self.space.task.op == "matmul" else 0
            sums = np.asarray(full, np.int64).sum(axis=tuple(d for d in range(full.ndim) if d != ch))
            pad = np.zeros(self.wsum_offset - flat.size, np.int8)
            flat = np.concatenate([flat, pad, sums.astype("<i4").view(np.int8)])
        return flat

    def weight_key(self) -> tuple:
        """Everything :meth:`pack_weight` depends on besides the weights: plans with equal keys pack the same weights
        into the same bytes, so a caller packs once per key. The layout alone is not enough: an int8 plan with pairs
        or VNNI quads interleaves the same layout differently and appends per-channel sums."""
        key: tuple = (self.buffers["weight"].layout, self.arg_dtypes()[1].str, self.pairs)
        if self.pairs > 1:
            key += (self.buffers["weight"].stride(_pair_loop(self).var),)
        if self.space.sketch.base in _wg.VARIANTS:
            key += (_wg.variant_of(self.space.sketch), _wg.schedule(self.space, self.config)["KV"])
        return key

    @property
    def wsum_offset(self) -> int:
        """Byte offset of the per-channel weight sums in a VNNI plan's packed weights."""
        return -(-self.buffers["weight"].layout.size // 64) * 64

    def kernel_inputs(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """API-order task inputs -> kernel argument arrays (weights packed, contiguous, of ``arg_dtypes``)."""
        dts = self.arg_dtypes()
        out = [np.ascontiguousarray(arrays[0], dtype=dts[0]), self.pack_weight(arrays[1])]
        out += [np.ascontiguousarray(a, dtype=dt) for a, dt in zip(arrays[2:], dts[2:])]
        return out


def _pair_loop(plan: "Plan") -> Loop:
    """The innermost live R1 loop (the one an int8 pair path steps by two)."""
    return [lp for lp in plan.levels["R1"] if lp.extent > 1][-1]


def int8_pairs(plan: Plan) -> int:
    """Reduction steps per int8 dot-product instruction the register block can take: 4 on a target
    with ``avx512_vnni`` (``vpdpbusd``: u8 x s8 groups of four into int32, exact; signed data is
    offset by 128 and the zero point corrected with the weights' per-channel sums in the epilogue),
    and, on AVX2, for a task with 7-bit weights (``weight_bits=7``: ``vpmaddubsw`` u8 x s7 -> int16
    pair sums, which cannot saturate (2 * 255 * 64 = 32640 <= 32767), then ``vpmaddwd`` with ones ->
    int32; 32 products per pair of instructions; same data / weight layout and zero-point correction
    as VNNI; :meth:`Plan.pack_weight` rejects out-of-range weights), 2 elsewhere (AVX2 ``vpmaddwd``:
    exact int16 pairs, 16 products per instruction, summed in pairs into 8 int32 lanes), else 1.
    Needs: 4, 8 or 16 lanes; the weights are the vector operand (unit
    stride along the vector loop, the same for every row of the block) and the data the broadcast
    one; the innermost live R1 loop's extent is a multiple of the group, and its weight stride is the
    packed panel's row (so rows k .. k+g-1 interleave in place at load, untimed); groups of four also
    need an unbatched task (one weight sum per output channel). A function of the config, not a knob.

    Example:
        >>> from codegen.ops import matmul
        >>> from codegen.space import Space
        >>> from codegen.target import Target
        >>> sp = Space(matmul(16, 16, 32, dtype="int8"), "gemm_packed", Target(simd_lanes=8))
        >>> int8_pairs(lower(sp, sp.default()))
        2
        >>> sp = Space(matmul(16, 16, 32, dtype="int8", weight_bits=7), "gemm_packed", Target(simd_lanes=8))
        >>> int8_pairs(lower(sp, sp.default()))
        4
    """
    if not plan.space.task.quantized or plan.vec not in (4, 8, 16):
        return 1
    live_r1 = [lp for lp in plan.levels["R1"] if lp.extent > 1]
    if not live_r1 or live_r1[-1].extent % 2:
        return 1
    task, target = plan.space.task, plan.space.target
    # groups of four: VNNI, or AVX2 vpmaddubsw on 7-bit weights (u8 x s7 pair sums cannot saturate
    # int16: 2 * 255 * 64 = 32640), in vectors the target has
    quads = bool(target.avx512_vnni) or (task.weight_bits == 7 and plan.vec <= max(int(target.simd_lanes), 4))
    kr = live_r1[-1]
    w, d = plan.buffers["weight"], plan.buffers["data"]
    vloop = next((lp for lp in plan.levels["S3"] if lp.axis == plan.vector_axis), None)
    if vloop is None or w.stride(vloop.var) != 1 or d.stride(vloop.var) != 0:
        return 1
    rows = [lp for lp in plan.levels["S3"] if lp.extent > 1 and lp is not vloop]
    sk, lanes = w.stride(kr.var), vloop.extent
    if any(w.stride(lp.var) for lp in rows) or sk < lanes or sk % lanes:
        return 1
    live = {lp.var for lp in plan.loops() if lp.extent > 1} - {kr.var, vloop.var}
    for g in ((4, 2) if quads and not task.p.get("batch") and kr.extent % 4 == 0 else (2,)):
        # every other loop moves whole groups of rows of the pair loop, or within one such row (a
        # conv's taps between the channels: strides x g once interleaved, see _group_weight_strides)
        if w.layout.size % (g * sk) or any(st % (g * sk) and (st >= sk or st % lanes)
                                           for var, st in w.strides if var in live):
            continue
        return g
    return 1


def _group_weight_strides(plan: Plan) -> Plan:
    """The weights interleaved in groups of ``plan.pairs`` rows of the pair loop (:meth:`Plan.pack_weight`:
    element ``i`` of row ``k`` goes to ``i * g + k % g`` within its group): the loops moving within one
    row (a conv's taps, when the channel loop is the pair loop) step ``g`` times as far. The vector
    loop's offset is scaled by the renderer, which reads ``g * vec`` bytes per vector."""
    g = plan.pairs
    w = plan.buffers["weight"]
    kr = _pair_loop(plan)
    sk = w.stride(kr.var)
    vloop = next(lp for lp in plan.levels["S3"] if lp.axis == plan.vector_axis)
    strides = tuple((var, st * g if 0 < st < sk and var != vloop.var else st) for var, st in w.strides)
    if strides == w.strides:
        return plan
    return replace(plan, buffers={**plan.buffers, "weight": replace(w, strides=strides)})


def _quad_data(plan: Plan) -> Plan:
    """An int8 group plan's data, copied (timed, O(data)) so that a group is one 4-byte broadcast:

    * groups of four whose data steps along the pair loop with a stride ``sd > 1`` (NCHW channels):
      channels interleaved in fours (``blocked_layout(..., channel dim, 4, front=False)``), raw bytes;
    * pairs (``vpmaddwd``): ``x - x_zp`` as int16, interleaved in twos along the reduction (a
      matmul's rows unchanged but widened), so the kernel broadcasts one int32 per pair instead of
      building it from two bytes (2 loads, 2 subtracts, mask, shift, or, move per row and pair step);
      not where a built pair feeds 4 or more vector columns (AVX2 EPYC, CPU time, busy machine:
      matmul 128x768x768 67 -> 101 GOP/s, conv 3x3 64x56x56 46 -> 90, 1x1 256x28x28 72 -> 90).

    Unchanged where that does not hold exactly: a dimension other than the plain channel one, another
    loop moving the channel index by other than whole groups, or a channel count not a multiple of
    the group."""
    g = plan.pairs
    if g not in (2, 4) or plan.tail_row >= 0:
        return plan
    vloop = next(lp for lp in plan.levels["S3"] if lp.axis == plan.vector_axis)
    if g == 2 and vloop.extent // plan.vec >= 4:  # a pair built in registers feeds >= 4 vpmaddwd: no copy
        return plan  # (a batch-1 dense layer: 8 columns per row; the copy and its thread fork cost more)
    kr = _pair_loop(plan)
    space, con, d = plan.space, plan.con, plan.buffers["data"]
    sd = d.stride(kr.var)
    if (g == 4 and sd <= 1) or sd < 1 or any(dl.kind != "plain" for dl in d.layout.dims):
        return plan
    dims = [i for i, terms in enumerate(con.data.dims) if any(a == kr.axis for a, _ in terms)]
    if len(dims) != 1 or con.pad[dims[0]] != (0, 0):
        return plan
    dim = dims[0]
    shape = con.data.shape
    if shape[dim] % g or d.layout.dims[dim].stride != sd or dict(con.data.dims[dim]).get(kr.axis) != 1:
        return plan
    tiles = {a.name: t for a, t in zip(space.axes, plan.config.tiles)}
    unit = Layout(shape, tuple(DimLayout("plain", 1 if i == dim else 0) for i in range(len(shape))), 0)
    moves = _var_strides(con.data, unit, space, tiles)  # channel index moved per step of each loop
    live = {lp.var for lp in plan.loops() if lp.extent > 1}
    if any(m % g for var, m in moves.items() if var in live and var != kr.var):
        return plan
    blocked = blocked_layout(shape, dim, g, front=False)
    # per-loop strides: the channel index moves by whole groups (the group base's stride sd per
    # channel, as before), the other dimensions by their interleaved strides; the renderer reads a group
    # as 4 contiguous bytes at the group base
    virt = Layout(shape, tuple(DimLayout("plain", sd if i == dim else dl.stride)
                               for i, dl in enumerate(blocked.dims)), blocked.size)
    strides = tuple(sorted(_var_strides(con.data, virt, space, tiles).items()))
    buffers = dict(plan.buffers)
    args, ws = plan.args, plan.workspace
    dt = "int16" if g == 2 else d.dtype  # pairs: x - x_zp, exact in int16
    if d.storage == "workspace":  # already copied (padding): same buffer, interleaved
        buffers["data"] = replace(d, layout=blocked, strides=strides, dtype=dt)
    else:
        buffers["data_in"] = Buffer("data_in", Access("data_in", con.data_api_shape, ()),
                                    plain_layout(con.data_api_shape), "arg", dtype=d.dtype)
        buffers["data"] = replace(d, layout=blocked, strides=strides, storage="workspace", ws_offset=ws, dtype=dt)
        ws += -(-blocked.size // ALIGN_FLOATS) * ALIGN_FLOATS  # 4-byte slots: an int8 / int16 element fits one
        args = ("data_in",) + args[1:]
    return replace(plan, buffers=buffers, args=args, workspace=ws, data_copy=True, data_quads=True)


def _var_strides(access: Access, layout: Layout, space: Space, tiles: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Stride of every loop variable in a buffer: address = sum(stride[var] * var)."""
    ext = {a.name: a.extent for a in space.axes}
    strides: dict[str, int] = {}

    def add(var: str, v: int) -> None:
        strides[var] = strides.get(var, 0) + v

    for terms, dl in zip(access.dims, layout.dims):
        for axis, coeff in terms:
            t = tiles[axis]
            if dl.kind == "plain":
                for lvl in range(len(t)):
                    add(f"{axis}{lvl}", dl.stride * coeff * math.prod(t[lvl + 1:]))
            elif ext[axis] == 1:
                continue
            elif coeff == 1 and t[-1] == dl.block:
                # the blocked axis: outer levels index the block, the S3 level the lane
                for lvl in range(len(t) - 1):
                    add(f"{axis}{lvl}", dl.stride * math.prod(t[lvl + 1:-1]))
                add(f"{axis}{len(t) - 1}", 1)
            elif coeff % dl.block == 0:
                for lvl in range(len(t)):
                    add(f"{axis}{lvl}", dl.stride * (coeff // dl.block) * math.prod(t[lvl + 1:]))
            else:  # pragma: no cover - guarded by _blockable
                raise AssertionError("unblockable access")
    return {k: v for k, v in strides.items() if v}


def _blockable(access: Access, axis: str, block: int, ext: dict[str, int]) -> int | None:
    """The logical dim that can be blocked by ``axis``'s S3 tile, or None."""
    for d, terms in enumerate(access.dims):
        if not any(a == axis for a, _ in terms):
            continue
        ok = all((a == axis and c == 1) or ext[a] == 1 or (a != axis and c % ext[axis] == 0) for a, c in terms)
        return d if ok and access.shape[d] % block == 0 else None
    return None


def lower(space: Space, config: Config) -> Plan:
    """Lower one valid config of a space into a :class:`Plan` (validates first)."""
    space.validate(config)
    con = space.con
    tiles = {a.name: t for a, t in zip(space.axes, config.tiles)}
    ext = {a.name: a.extent for a in space.axes}
    v = space.sketch.vector_axis
    wa = space.sketch.weight_axis

    levels: dict[str, tuple[Loop, ...]] = {}
    inner_r1 = [a.name for a in space.axes if a.reduce][-1:]
    fused = set([a.name for a in space.axes if not a.reduce][: config.parallel])  # the parallel S0 loops
    for kind, lvl in LEVEL_ORDER:
        loops = []
        for a in space.axes:
            if (kind == "R") == a.reduce:
                mapping = "serial"
                if kind == "S" and lvl == 0 and a.name in fused:
                    mapping = "parallel"
                elif kind == "S" and lvl == 3:
                    mapping = "vectorized" if a.name == v and config.vec > 1 else "unrolled"
                elif kind == "R" and lvl == 1 and [a.name] == inner_r1 and config.unroll > 1:
                    mapping = "unrolled"
                loops.append(Loop(a.name, lvl, tiles[a.name][lvl], a.reduce, mapping))
        levels[f"{kind}{lvl}"] = tuple(loops)
    parallel = levels["S0"][: config.parallel]

    buffers: dict[str, Buffer] = {}
    ws = 0

    def ws_alloc(n: int) -> int:
        nonlocal ws
        off = ws
        ws += -(-n // ALIGN_FLOATS) * ALIGN_FLOATS
        return off

    dts = space.task.buffer_dtypes

    def make(name: str, access: Access, layout: Layout, storage: str, off: int = 0) -> Buffer:
        return Buffer(name, access, layout, storage, off, tuple(sorted(_var_strides(access, layout, space,
                                                                                      tiles).items())),
                      dtype=dts.for_buffer(name))

    # weights: packed panels blocked by the weight axis's S3 tile (untimed)
    wdim = _blockable(con.weight, wa, tiles[wa][-1], ext)
    wl = (blocked_layout(con.weight.shape, wdim, tiles[wa][-1], front=True) if wdim is not None
          else plain_layout(con.weight.shape))
    buffers["weight"] = make("weight", con.weight, wl, "arg")

    # data: copied (timed) when padded, or blocked when the vector axis is strided in it
    padded = any(b or a for b, a in con.pad)
    data_l = plain_layout(con.data.shape)
    probe = make("data", con.data, data_l, "arg")
    data_block = None
    if con.data.depends_on(v) and probe.stride(f"{v}3") != 1:
        data_block = _blockable(con.data, v, tiles[v][-1], ext)
    if data_block is not None:
        data_l = blocked_layout(con.data.shape, data_block, tiles[v][-1], front=False)
    im2col = space.sketch.base == IM2COL_SKETCH  # the columns are gathered from the real input (timed)
    data_copy = padded or data_block is not None or im2col
    tail_row = -1
    pad_dims = [i for i, (b, a) in enumerate(con.pad) if b or a]
    if (space.sketch.base == "gemm_packed" and data_block is None and pad_dims == [len(con.pad) - 2]
            and ext["b"] == 1):
        # a padded sketch whose data grows by rows only (m): rows keep their stride, so the kernel reads
        # the API array and only the rows of the last, partial register block from a small copy
        mr = tiles["m"][-1]
        tail_row = (space.api_con.axis("m").extent // mr) * mr
        data_copy = False
        rows = con.data.shape[-2] - tail_row
        tail_shape = (rows, con.data.shape[-1])
        buffers["data_tail"] = Buffer("data_tail", Access("data_tail", tail_shape, ()), plain_layout(tail_shape),
                                      "workspace", ws_alloc(rows * con.data.shape[-1]), dtype=dts.for_buffer("data"))
        # (ws_alloc counts 4-byte slots: an element of any dtype fits one)
    buffers["data"] = (make("data", con.data, data_l, "workspace", ws_alloc(data_l.size)) if data_copy
                       else probe)
    if data_copy:
        api = space.task.contraction().data_api_shape if im2col else con.data_api_shape
        buffers["data_in"] = Buffer("data_in", Access("data_in", api, ()), plain_layout(api), "arg",
                                    dtype=dts.for_buffer("data_in"))

    # output: accumulate in place when the vector axis is unit-stride, else in a blocked scratch
    # (low precision: always in a scratch of the accumulator type, float32 / int32, which the epilogue
    # converts: dequantizes / requantizes int8, rounds to float16)
    # (padded sketches: always in a padded scratch, which the epilogue crops; ``out`` then describes the
    # output over the padded range, as the features count it, and ``out_api`` holds the real strides)
    # (a masked padded sketch, codegen.padding.masked_tail: in place, its tail vectors stored under a mask)
    padded = bool(space.sketch.pad) and not space.masked
    lowp = space.task.dtype != "float32"
    out = make("out", con.out, plain_layout(con.out.shape), "arg")
    buffers["out"] = out
    acc = "out"
    if (out.stride(f"{v}3") != 1 and tiles[v][-1] > 1) or padded or lowp:
        d = _blockable(con.out, v, tiles[v][-1], ext) if out.stride(f"{v}3") != 1 and tiles[v][-1] > 1 else None
        if d is not None or padded or lowp:
            sl = (blocked_layout(con.out.shape, d, tiles[v][-1], front=False) if d is not None
                  else plain_layout(con.out.shape))
            buffers["scratch"] = make("scratch", Access("scratch", con.out.shape, con.out.dims), sl, "workspace",
                                      ws_alloc(sl.size))
            acc = "scratch"
    if padded:
        buffers["out_api"] = make("out", con.out, plain_layout(space.api_con.out.shape), "arg")
    if con.bias is not None:
        buffers["bias"] = make("bias", con.bias, plain_layout(con.bias.shape), "arg")
    if space.task.residual:
        buffers["residual"] = make("residual", Access("residual", con.out.shape, con.out.dims),
                                   plain_layout(con.out.shape), "arg")

    quant = tuple(n for n in space.task.input_names() if n not in ("data", "weight", "bias", "residual"))
    for name in quant:  # int8: x_scale, x_zp, w_scales (per output channel), y_scale, y_zp
        if name == "w_scales":
            ch = 1 if space.task.op == "conv2d" else len(con.out.dims) - 1
            sc = Access("w_scales", (con.out.shape[ch],), (con.out.dims[ch],))
            buffers[name] = make(name, sc, plain_layout(sc.shape), "arg")
        else:
            buffers[name] = make(name, Access(name, (1,), ((),)), plain_layout((1,)), "arg")
    args = ("data_in" if data_copy else "data", "weight") + (("bias",) if con.bias is not None else ()) + (
        ("residual",) if space.task.residual else ()) + quant + ("out",)
    epilogue = padded or acc != "out" or con.bias is not None or space.task.residual or space.task.act is not None
    plan = Plan(space, config, levels, parallel, buffers, args, data_copy, acc, epilogue, ws, v, config.vec,
                min(config.unroll, MAX_UNROLL_STEP), tail_row=tail_row)
    for knob in space.knobs:  # declared knobs adjust the plan (e.g. add renderer hooks)
        if knob.lower is not None:
            plan = knob.lower(plan, space.knob_value(config, knob))
    if space.task.quantized and int8_pairs(plan) > 1:
        plan = replace(plan, pairs=int8_pairs(plan))
        plan = _quad_data(_group_weight_strides(plan))
    finish = SKETCH_LOWERINGS.get(space.sketch.base)
    return finish(plan) if finish is not None else plan
