"""The schedule spaces of a (task, target): the CPU sketches of :mod:`codegen.space`, or the GPU sketch
of :mod:`codegen.cuda.space` for ``cuda-sim`` / ``cuda`` targets.

Example:
    >>> from codegen.ops import matmul
    >>> from codegen.target import Target
    >>> sorted(spaces_for(matmul(8, 8, 8), Target.cuda_sim("orin")))
    ['cuda_tiled']
"""
from __future__ import annotations

from .cuda.space import cuda_spaces
from .ops import Task
from .space import Space, sketches_for
from .target import Target


def spaces_for(task: Task, target: Target) -> dict[str, Space]:
    """``{sketch name: space}`` of ``task`` on ``target`` (on a CPU, the padded variants of the sketches
    where the task has awkward extents too: :mod:`codegen.padding`)."""
    if getattr(target, "is_gpu", False):
        return dict(cuda_spaces(task, target))
    return {sk.name: Space(task, sk, target) for sk in sketches_for(task, target)}
