"""Lowering of the sparse sketch (``sparse_bsr``, :mod:`codegen.sparse`): weights compiled into the kernel.

:func:`codegen.lower.lower` builds the sketch's loop nest as for any sketch (the features and the
feature extractor read its layouts: a stand-in of the sparse program with the task's own axes), then
:func:`finish` turns it into a :class:`SparsePlan`: the weights in ``br x bc`` blocks (``br`` the
output-feature axis's ``S3`` tile, ``bc`` the ``sparse_bc`` knob), the columns per vector block
(``ts``, the vector axis's ``S3`` tile), and the workspace of the timed ``X`` copy. The weights are
those of ``task.random_inputs(seed=0)`` (what the tuner measures with) unless :func:`with_weights`
regenerates the plan for a layer's real weights (the network build). The renderer is
:mod:`codegen.renderers.sparse`.

A sparse plan's ``pack_weight(w)`` is where a kernel meets its weights at load: it checks ``w``
against the fingerprint of the compiled-in weights and raises :class:`codegen.sparse.SparseWeightsError`
on a mismatch (so ``Kernel(plan, lib)(x, other_w)`` is a clear error, never a wrong answer).

Example:
    >>> from codegen.ops import dense
    >>> from codegen.space import Space
    >>> from codegen.target import Target
    >>> from codegen.lower import lower
    >>> sp = Space(dense(1, 64, 32, sparsity=0.9), "sparse_bsr", Target.cpu())
    >>> plan = lower(sp, sp.default())
    >>> plan.blocks.br, plan.blocks.bc, plan.blocks.nnz_blocks == int((sp.task.random_inputs()[1] != 0).sum())
    (1, 1, True)
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np

from .lower import SKETCH_LOWERINGS, Plan
from .sparse import (
    SPARSE_SKETCH,
    BlockWeights,
    Geometry,
    SparseWeightsError,
    fingerprint,
    geometry,
    to_blocks,
    weight_matrix,
)

WEIGHT_TOKEN_FLOATS = 16  # the kernel's weight argument: unused (the weights are compiled in)


@dataclass(frozen=True)
class SparsePlan(Plan):
    """A :class:`~codegen.lower.Plan` of the sparse sketch plus what its renderer needs."""

    geometry: Geometry | None = None
    blocks: BlockWeights | None = None
    weights_fingerprint: str = ""
    ts: int = 1  # columns (s) per register block
    br: int = 1

    @property
    def sparse(self) -> bool:
        return True

    def weight_key(self) -> tuple:
        """The weights are constants compiled into the kernel: its packed argument is a token for those weights."""
        return ("sparse", self.weights_fingerprint)

    def pack_weight(self, weight: np.ndarray) -> np.ndarray:
        """Check ``weight`` against the compiled-in weights; the kernel's weight argument (unused)."""
        got = fingerprint(weight)
        if got != self.weights_fingerprint:
            raise SparseWeightsError(
                f"{self.space.task.name}: this sparse kernel was built for other weights (fingerprint "
                f"{self.weights_fingerprint}, got {got}); a sparse kernel's weights are constants compiled into it: "
                f"regenerate it for these weights with codegen.sparse_lower.with_weights(plan, weights)")
        return np.zeros(WEIGHT_TOKEN_FLOATS, np.float32)


@lru_cache(maxsize=8)
def _tuning_weights(task) -> tuple[np.ndarray, str]:
    w = task.random_inputs(seed=0)[1]
    w.flags.writeable = False
    return w, fingerprint(w)


@lru_cache(maxsize=32)
def _tuning_blocks(task, br: int, bc: int) -> BlockWeights:
    return to_blocks(weight_matrix(task, _tuning_weights(task)[0]), br, bc)


def finish(plan: Plan, weights: np.ndarray | None = None) -> SparsePlan:
    """The :class:`SparsePlan` of a lowered nest of the sparse sketch, for ``weights`` (default: those of
    ``task.random_inputs(seed=0)``)."""
    space, cfg = plan.space, plan.config
    task = space.task
    geo = geometry(task, dict(space.sketch.pad))
    tiles = {a.name: t for a, t in zip(space.axes, cfg.tiles)}
    br, ts = tiles[space.sketch.weight_axis][-1], tiles[space.sketch.vector_axis][-1]
    bc = space.knob_value(cfg, next(k for k in space.knobs if k.name == "sparse_bc"))
    if weights is None:
        fp = _tuning_weights(task)[1]
        blocks = _tuning_blocks(task, br, bc)
    else:
        fp = fingerprint(weights)
        blocks = to_blocks(weight_matrix(task, weights), br, bc)
    base = {f.name: getattr(plan, f.name) for f in fields(Plan)}
    base["workspace"] = max(geo.workspace_floats, 16)
    return SparsePlan(**base, geometry=geo, blocks=blocks, weights_fingerprint=fp, ts=ts, br=br)


def with_weights(plan: SparsePlan, weights: np.ndarray) -> SparsePlan:
    """``plan`` regenerated for ``weights`` (the API weight tensor of its task): same schedule, the
    weights' own pattern.

    Example:
        >>> import numpy as np
        >>> from codegen.ops import dense
        >>> from codegen.space import Space
        >>> from codegen.target import Target
        >>> from codegen.lower import lower
        >>> sp = Space(dense(1, 8, 4, sparsity=0.5), "sparse_bsr", Target.cpu())
        >>> w = np.eye(4, 8, dtype=np.float32)
        >>> with_weights(lower(sp, sp.default()), w).blocks.nnz_blocks
        4
    """
    if not isinstance(plan, SparsePlan):
        raise TypeError(f"with_weights takes a sparse plan, got {type(plan).__name__}")
    return finish(plan, weights)


def is_sparse_plan(plan) -> bool:
    """True for a plan of the sparse sketch."""
    return isinstance(plan, SparsePlan)


SKETCH_LOWERINGS[SPARSE_SKETCH] = finish

__all__ = ["SparsePlan", "SparseWeightsError", "finish", "is_sparse_plan", "with_weights"]
