"""The schedule spaces of a (task, target): the CPU sketches of :mod:`codegen.space`, or the GPU sketch
of :mod:`codegen.cuda.space` for ``cuda-sim`` / ``cuda`` targets.

Example:
    >>> from codegen.ops import matmul
    >>> from codegen.target import Target
    >>> sorted(spaces_for(matmul(8, 8, 8), Target.cuda_sim("orin")))
    ['cuda_tiled']
"""
from __future__ import annotations

from . import blocked, depthwise, flat, sparse, winograd
from .cuda.space import SKETCH as CUDA_SKETCH
from .cuda.space import cuda_spaces
from .ops import Task
from .space import Config, Space, default_sketch, sketches_for
from .target import Target


def spaces_for(task: Task, target: Target) -> dict[str, Space]:
    """``{sketch name: space}`` of ``task`` on ``target`` (on a CPU, the padded variants of the sketches
    where the task has awkward extents too: :mod:`codegen.padding`)."""
    if getattr(target, "is_gpu", False):
        return dict(cuda_spaces(task, target))
    return {sk.name: Space(task, sk, target) for sk in sketches_for(task, target)}


def sketch_names() -> tuple[str, ...]:
    """The name of every sketch (exact ones; a padded variant is ``<name>.pad_...``), e.g. to check a list of
    sketches to leave out.

    Example:
        >>> "conv_winograd4" in sketch_names() and "gemm_packed" in sketch_names()
        True
    """
    return ("gemm_packed", "conv_direct", "conv_spatial_pack", depthwise.DW_SKETCH, winograd.WG_SKETCH,
            winograd.WG4_SKETCH, flat.FLAT_SKETCH, flat.IM2COL_SKETCH, blocked.SKETCH, blocked.FLAT_SKETCH,
            blocked.DW_SKETCH, sparse.SPARSE_SKETCH, CUDA_SKETCH)


def default_config(task: Task, target: Target, *, winograd: bool = True) -> Config:
    """The schedule an untuned build of ``task`` runs on ``target``: its default sketch's default config
    (``winograd=False``: never a Winograd sketch's); on a GPU target the CUDA sketch's.

    Example:
        >>> from codegen.ops import matmul
        >>> default_config(matmul(8, 8, 8), Target.cuda_sim("orin")).sketch
        'cuda_tiled'
    """
    if getattr(target, "is_gpu", False):
        return next(iter(spaces_for(task, target).values())).default()
    return Space(task, default_sketch(task, target, winograd=winograd), target).default()
