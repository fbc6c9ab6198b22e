"""Sparse weights (issue 16): the block-sparse format of a sparse task's kernels and its knobs.

A task with ``sparsity > 0`` (:attr:`codegen.ops.Task.sparsity`) is a sparse GEMM over a weight
matrix ``W2 [O, R]`` (output features by reduction)::

    out[b, o, s] = epilogue(sum_r W2[o, r] * X[b, r, s])

* ``dense(n, in, out)``: ``W2 = W`` (``[out, in]``), ``s`` the rows of ``x`` (``S = n``), ``X = x.T``;
* ``matmul(m, n, k)``: ``W2 = B.T`` (``[n, k]``), ``S = m``, ``X = A.T``;
* ``conv2d`` (groups 1): ``W2 = W.reshape(K, C*R*S)``, ``s`` the output pixels (``S = OH * OW``), ``X``
  the im2col matrix of image ``b`` (the input itself for a 1x1, stride-1, unpadded conv).

:func:`to_blocks` stores ``W2`` block-sparse (BSR): blocks of ``br x bc`` weights, only those with a
non-zero; ``br = bc = 1`` is CSR. The block shape is a schedule knob: ``br`` is the register tile
(``S3``) of the output-feature axis, ``bc`` the declared knob ``sparse_bc`` registered here. The
weights are constants of the compiled kernel (``static const`` arrays in its source, as at
inference), so a kernel is built for one weight tensor: :func:`fingerprint` identifies it, and a
kernel called with other weights raises :class:`SparseWeightsError`.

Example:
    >>> import numpy as np
    >>> w = np.array([[1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 2, 3], [0, 0, 0, 4]], np.float32)
    >>> bw = to_blocks(w, 1, 2)
    >>> bw.block_ptr.tolist(), bw.block_col.tolist(), bw.nnz_blocks
    ([0, 1, 1, 2, 3], [0, 2, 2], 3)
    >>> bool(np.array_equal(bw.dense(), w))
    True
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from .knobs import Knob, register_knob

SPARSE_SKETCH = "sparse_bsr"
BLOCK_COLS = (1, 2, 4, 8, 16)  # candidate bc values (those dividing R apply)


class SparseWeightsError(ValueError):
    """A sparse kernel was called with weights other than those compiled into it."""


@dataclass(frozen=True)
class Geometry:
    """The sparse-GEMM view of a task: ``O`` output features, ``R`` reduction, ``S`` columns per
    batch item, ``batch`` items (conv images); ``copy``: how the kernel forms ``X`` (``"none"``: the
    data itself, ``"transpose"``: ``x.T`` (dense / matmul with ``S > 1``), ``"im2col"``).

    The columns come in rows of ``row`` (a conv's output width; dense / matmul: one row of ``S``). The
    padded sketch (``sparse_bsr.pad_x16``, :mod:`codegen.padding`) stores each row as ``row_pad`` columns
    of ``X``, zeros past ``row``, so that whole vectors tile it (49 pixels in 16 lanes: 7 rows of 16);
    ``cols`` is ``X``'s row length, and the kernel writes the outputs of real columns only."""

    op: str
    O: int
    R: int
    S: int
    batch: int
    copy: str
    row: int = 0
    row_pad: int = 0

    @property
    def padded(self) -> bool:
        return self.row_pad > self.row

    @property
    def cols(self) -> int:
        """Columns of ``X`` per reduction row: ``S``, or ``S / row * row_pad`` padded."""
        return self.S // self.row * self.row_pad if self.padded else self.S

    @property
    def workspace_floats(self) -> int:
        """Floats of the timed ``X`` copy (one batch item), 0 without a copy."""
        return 0 if self.copy == "none" else self.R * self.cols


def geometry(task, pad: dict[str, int] | None = None) -> Geometry:
    """The :class:`Geometry` of a sparse task (see the module docstring); ``pad``: the padded sketch's
    ``{vector axis: padded extent}`` (``x`` of a conv, ``m`` of a dense / matmul layer).

    Example:
        >>> from codegen.ops import conv2d, dense
        >>> geometry(dense(1, 64, 32, sparsity=0.5))
        Geometry(op='dense', O=32, R=64, S=1, batch=1, copy='none', row=1, row_pad=1)
        >>> geometry(conv2d(2, 8, 6, 6, out_channels=4, kernel=3, padding=1, sparsity=0.5)).copy
        'im2col'
        >>> g = geometry(conv2d(1, 8, 7, 7, out_channels=4, kernel=1, sparsity=0.5), {"x": 16})
        >>> g.copy, g.S, g.cols   # a 1x1 conv reads its input in place, unless padded
        ('im2col', 49, 112)
    """
    p, pad = task.p, dict(pad or {})
    axis = "x" if task.op == "conv2d" else "m"
    if set(pad) - {axis}:
        raise ValueError(f"a sparse {task.op} pads only its vector axis {axis!r}, got {sorted(pad)}")
    if task.op in ("dense", "matmul"):
        if task.op == "matmul" and p.get("batch"):
            raise ValueError("a sparse matmul has no batch= (one weight matrix)")
        o, r, s = (p["out"], p["in"], p["n"]) if task.op == "dense" else (p["n"], p["k"], p["m"])
        return Geometry(task.op, o, r, s, 1, "transpose" if s > 1 else "none", s, pad.get(axis, s))
    if p["groups"] != 1:
        raise ValueError(f"a sparse conv2d has groups=1, got {p['groups']}")
    n, k, oh, ow = task.output_shape
    direct = p["r"] == p["s"] == 1 and p["stride"] == (1, 1) and not any(p["pad"]) and axis not in pad
    return Geometry("conv2d", k, p["c"] * p["r"] * p["s"], oh * ow, n, "none" if direct else "im2col", ow,
                    pad.get(axis, ow))


def weight_matrix(task, weight: np.ndarray) -> np.ndarray:
    """The task's API weights as ``W2 [O, R]`` (float32, C order)."""
    w = np.asarray(weight, dtype=np.float32)
    if tuple(w.shape) != tuple(task.input_shapes()[1]):
        raise ValueError(f"{task.name}: weights have shape {w.shape}, expected {task.input_shapes()[1]}")
    if task.op == "matmul":
        w = w.T
    return np.ascontiguousarray(w.reshape(w.shape[0], -1))


def fingerprint(weight: np.ndarray) -> str:
    """A short hash of a weight tensor's float32 values and shape (what a sparse kernel was built for).

    Example:
        >>> fingerprint(np.zeros((2, 2))) == fingerprint(np.zeros((2, 2), np.float32))
        True
    """
    w = np.ascontiguousarray(weight, dtype=np.float32)
    h = hashlib.sha256(repr(w.shape).encode())
    h.update(w.view(np.uint8).reshape(-1) if w.size else b"")
    return h.hexdigest()[:16]


@dataclass(frozen=True, eq=False)
class BlockWeights:
    """``W2 [rows, cols]`` in block-sparse rows (BSR) of ``br x bc`` blocks.

    ``block_ptr [rows / br + 1]``: the blocks of block-row ``i`` are ``block_ptr[i] .. block_ptr[i + 1]``;
    ``block_col [nnz_blocks]``: each block's first column; ``values [nnz_blocks, br, bc]``."""

    rows: int
    cols: int
    br: int
    bc: int
    block_ptr: np.ndarray
    block_col: np.ndarray
    values: np.ndarray

    @property
    def nnz_blocks(self) -> int:
        return int(self.block_col.size)

    @property
    def stored(self) -> int:
        """Weights stored (zeros inside kept blocks included)."""
        return self.nnz_blocks * self.br * self.bc

    def dense(self) -> np.ndarray:
        """Back to ``W2`` (tests)."""
        out = np.zeros((self.rows, self.cols), np.float32)
        for i in range(self.rows // self.br):
            for p in range(self.block_ptr[i], self.block_ptr[i + 1]):
                c = int(self.block_col[p])
                out[i * self.br:(i + 1) * self.br, c:c + self.bc] = self.values[p]
        return out


def to_blocks(w2: np.ndarray, br: int, bc: int) -> BlockWeights:
    """``w2 [O, R]`` as :class:`BlockWeights` with ``br x bc`` blocks (``br | O``, ``bc | R``); a
    block is kept when any of its weights is non-zero."""
    w2 = np.ascontiguousarray(w2, dtype=np.float32)
    rows, cols = w2.shape
    if br < 1 or bc < 1 or rows % br or cols % bc:
        raise ValueError(f"block {br}x{bc} does not tile a {rows}x{cols} weight matrix")
    blocks = w2.reshape(rows // br, br, cols // bc, bc).transpose(0, 2, 1, 3)  # [O/br, R/bc, br, bc]
    keep = (blocks != 0).any(axis=(2, 3))
    ptr = np.zeros(rows // br + 1, np.int64)
    ptr[1:] = np.cumsum(keep.sum(axis=1))
    bi, bj = np.nonzero(keep)
    return BlockWeights(rows, cols, br, bc, ptr.astype(np.int32), (bj * bc).astype(np.int32),
                        np.ascontiguousarray(blocks[bi, bj], dtype=np.float32))


# ----------------------------------------------------------------------------------------------
# Declared knobs of the sparse sketch (codegen.knobs): the block width, and the task's density
# ----------------------------------------------------------------------------------------------

def _bc_domain(space) -> tuple[int, ...]:
    r = geometry(space.task).R
    return tuple(b for b in BLOCK_COLS if r % b == 0)


def _density_permille(space) -> tuple[int, ...]:
    return (round(1000 * (1.0 - space.task.sparsity)),)


#: the sparse sketch and its padded variants (codegen.padding)
_SKETCHES = (SPARSE_SKETCH, SPARSE_SKETCH + ".pad_*")

SPARSE_BC = register_knob(Knob(
    "sparse_bc", _SKETCHES, _bc_domain, 1, relax="log2",
    features=lambda xp, v, info: {"sparse_block_cols": v}, feature_names=("sparse_block_cols",),
    mutation_weight=0.1,
    doc="columns of a weight block (BSR; 1 = CSR): a kept block stores bc weights per row, zeros included"))

#: the task's density (non-zero fraction, per mille) as a one-value knob: the features see it (the
#: density, and the FLOPs that remain), the search has nothing to choose
SPARSE_DENSITY = register_knob(Knob(
    "sparse_density", _SKETCHES, _density_permille, lambda space: _density_permille(space)[0],
    features=lambda xp, v, info: {"sparse_density": v / 1000.0, "sparse_flops": info["flops"] * v / 1000.0},
    feature_names=("sparse_density", "sparse_flops"), mutation_weight=0.0,
    doc="fraction of non-zero weights (per mille), a constant of the task"))


def expected_speedup(sparsity: float) -> float:
    """The FLOP ratio of a dense over a sparse layer (DLAS's expected speedup): ``1 / (1 - sparsity)``.

    Example:
        >>> expected_speedup(0.9)
        10.000000000000002
    """
    return 1.0 / (1.0 - sparsity)


def block_rows_choices(o: int, cap: int = 8) -> tuple[int, ...]:
    """Divisors of ``o`` up to ``cap`` (the block rows a default may pick)."""
    return tuple(d for d in range(1, min(o, cap) + 1) if o % d == 0) or (1,)


__all__ = ["BLOCK_COLS", "SPARSE_SKETCH", "BlockWeights", "Geometry", "SparseWeightsError", "block_rows_choices",
           "expected_speedup", "fingerprint", "geometry", "to_blocks", "weight_matrix"]
