"""Static memory plan of a network: weights blob layout (packed kernel weights, raw constants), arena
placement of intermediates and step workspaces by liveness (first fit), aliases, output copies."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .spec import NetBuildError, NetSpec, Step, Value

ALIGN = 16  # floats: 64-byte alignment of arena and weight entries


@dataclass(frozen=True)
class MemoryPlan:
    """Where every value lives.

    Attributes:
        arena_floats: size of the intermediate arena.
        where: value id -> ``("input", i)``, ``("output", j)``, ``("const", offset in the weights blob)``,
            ``("arena", offset)`` or ``("alias", value id)`` (a Reshape that shares its input's storage).
        scratch: step index -> arena offset of the step's private workspace (kernels, layer norm).
        lifetimes: arena-placed item -> (first step, last step), for checks. Items are value ids, or
            ``("scratch", step)``.
        packed: (weight value id, step index) -> offset of the kernel-packed copy in the weights blob.
        weight_floats: size of the weights blob.
        copies: (output index, value id) pairs copied into the caller's buffer after the last step
            (outputs that are inputs, constants or repeated).
    """

    arena_floats: int
    where: dict[int, tuple[str, int]]
    scratch: dict[int, int]
    lifetimes: dict[Any, tuple[int, int]]
    placement: dict[Any, tuple[int, int]]  # item -> (offset, floats)
    packed: dict[tuple[int, int], int]
    weight_floats: int
    copies: tuple[tuple[int, int], ...]

    def root(self, v: int) -> int:
        while self.where[v][0] == "alias":
            v = self.where[v][1]
        return v


def _round_up(n: int) -> int:
    return -(-max(int(n), 0) // ALIGN) * ALIGN


def packed_floats(plan: Any) -> int:
    """4-byte slots of a kernel's packed weights: the layout's elements at the weight's element size
    (int8: a quarter of a float each), and for a VNNI plan the int32 weight sums after them."""
    task = plan.space.task
    nbytes = plan.buffers["weight"].layout.size * np.dtype(plan.arg_dtypes()[1]).itemsize
    if task.quantized and plan.pairs == 4:
        nbytes = plan.wsum_offset + 4 * task.input_shapes()[task.input_names().index("w_scales")][0]
    return -(-nbytes // 4)


def _scratch_floats(step: Step, values: Sequence[Value]) -> int:
    if step.op == "kernel":
        return -(-step.plan.workspace_bytes // 4)  # the arena counts floats
    if step.op == "LayerNormalization":
        x = values[step.inputs[0]]
        return 4 * math.prod(x.shape[: step.attrs["axis"]])  # mean and 1/std per row, as doubles
    if step.op == "TopK" and (len(step.outputs) < 2 or step.outputs[1] is None):  # the indices' k slots per row
        x = values[step.inputs[0]].shape
        return math.prod(x) // x[step.attrs["axis"]] * int(step.attrs["k"])
    return 0


def plan_memory(spec: NetSpec) -> MemoryPlan:
    """The static memory plan of a spec (see :class:`MemoryPlan`). Pure; raises NetBuildError on a
    malformed spec (a value produced twice, read before it is produced, an unknown id)."""
    values, n = spec.values, len(spec.values)
    where: dict[int, tuple[str, int]] = {}
    for i, v in enumerate(spec.inputs):
        if values[v].kind != "input":
            raise NetBuildError(f"graph input {i} is value {v} of kind {values[v].kind!r}, not 'input'")
        where[v] = ("input", i)
    out_slot: dict[int, int] = {}
    copies: list[tuple[int, int]] = []
    producer: dict[int, int] = {}
    for s, step in enumerate(spec.steps):
        for o in step.outputs:
            if o is None:
                continue
            if not 0 <= o < n or values[o].kind != "temp":
                raise NetBuildError(f"{step.where()}: output {o} is not a temp value")
            if o in producer:
                raise NetBuildError(f"{step.where()}: value {o} is already produced by step {producer[o]}")
            producer[o] = s
    for j, v in enumerate(spec.outputs):
        if values[v].kind == "temp" and v in producer and v not in out_slot:
            out_slot[v] = j
        else:
            copies.append((j, v))
    # weights blob: raw constants read by cheap ops (or copied out), kernel-packed weights per step: one
    # copy per (weight, layout, element type), converted (float16) or quantized once when the blob is made
    weight_floats = 0
    packed: dict[tuple[int, int], int] = {}
    packed_by_layout: dict[tuple[int, Any, str], int] = {}
    raw_needed = {v for _, v in copies if values[v].kind == "const"}
    for s, step in enumerate(spec.steps):
        for k, i in enumerate(step.inputs):
            if i is None:
                continue
            if not 0 <= i < n:
                raise NetBuildError(f"{step.where()}: input {i} is not a value id")
            if values[i].kind == "temp" and producer.get(i, s) >= s:
                raise NetBuildError(f"{step.where()}: input value {i} is read before it is produced")
            if step.op == "kernel" and k == 1:
                if values[i].kind != "const":
                    raise NetBuildError(f"{step.where()}: kernel weights must be a constant")
                layout = step.plan.buffers["weight"].layout
                key = (i, layout, step.plan.arg_dtypes()[1].str)  # a float32 and a float16 kernel may share a weight
                if key not in packed_by_layout:
                    packed_by_layout[key] = weight_floats
                    weight_floats += _round_up(packed_floats(step.plan))
                packed[(i, s)] = packed_by_layout[key]
            elif values[i].kind == "const":
                raw_needed.add(i)
    for v in sorted(raw_needed):
        where[v] = ("const", weight_floats)
        weight_floats += _round_up(values[v].floats)
    # storage of produced values: the caller's output buffer, an alias (Reshape) or the arena
    last_use: dict[int, int] = {}
    for s, step in enumerate(spec.steps):
        for i in step.inputs:
            if i is not None:
                last_use[i] = s
    for v, j in out_slot.items():
        where[v] = ("output", j)
    for s, step in enumerate(spec.steps):
        if step.op == "Reshape" and step.outputs[0] is not None and step.outputs[0] not in out_slot:
            where[step.outputs[0]] = ("alias", step.inputs[0])
    for _, v in copies:
        if values[v].kind == "temp" and v not in producer:
            raise NetBuildError(f"graph output value {v} is never produced")
    items: dict[Any, tuple[int, int, int]] = {}  # item -> (first, last, floats)
    for v, s in producer.items():
        if v not in where:
            where[v] = ("arena", -1)
            items[v] = (s, s, values[v].floats)
    for v in producer:  # extend each arena root's lifetime over the uses of its aliases
        root = v
        while where[root][0] == "alias":
            root = where[root][1]
        if root in items:
            first, last, size = items[root]
            end = max(last, last_use.get(v, producer[v]))
            if any(c[1] == v for c in copies):
                end = len(spec.steps)
            items[root] = (first, end, size)
    scratch_items = {}
    for s, step in enumerate(spec.steps):
        floats = _scratch_floats(step, values)
        if floats:
            scratch_items[("scratch", s)] = (s, s, floats)
    items.update(scratch_items)
    placement = _place(items)
    for item, (off, _) in placement.items():
        if isinstance(item, int):
            where[item] = ("arena", off)
    arena = max((off + _round_up(size) for off, size in placement.values()), default=0)
    return MemoryPlan(arena, where, {s: placement[("scratch", s)][0] for _, s in scratch_items},
                      {k: (a, b) for k, (a, b, _) in items.items()}, placement, packed, weight_floats,
                      tuple(copies))


def _place(items: Mapping[Any, tuple[int, int, int]]) -> dict[Any, tuple[int, int]]:
    """First-fit placement of lifetime intervals: an item never overlaps (in memory) an item whose
    lifetime overlaps its own. Larger items first among those born at the same step."""
    order = sorted(items, key=lambda k: (items[k][0], -items[k][2], str(k)))
    placed: list[tuple[int, int, int, int]] = []  # (first, last, offset, floats)
    out: dict[Any, tuple[int, int]] = {}
    for item in order:
        first, last, size = items[item]
        need = _round_up(max(size, 1))
        busy = sorted((off, off + fl) for f, l, off, fl in placed if f <= last and first <= l)
        off = 0
        for lo, hi in busy:
            if off + need <= lo:
                break
            off = max(off, hi)
        placed.append((first, last, off, need))
        out[item] = (off, size)
    return out


# ----------------------------------------------------------------------------------------------
# C emission helpers


def _aligned_zeros(n: int) -> np.ndarray:
    raw = np.zeros(max(n, 1) + ALIGN, dtype=np.float32)
    skip = (-raw.ctypes.data % 64) // 4
    return raw[skip: skip + max(n, 1)]
