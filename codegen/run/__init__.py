"""Runners: where kernels are built and where they run (:class:`Runner`: ``build``, ``run``, ``close``).

* :mod:`codegen.run.base`: the :class:`Runner` protocol.
* :mod:`codegen.run.local`: :class:`LocalProcessRunner`, gcc on this machine + a measuring child process
  (``codegen.measure.LocalRunner`` with the build half added; ``LocalRunner`` stays importable there).
* :mod:`codegen.run.replay`: :class:`ReplayRunner`, recorded results per source (tests; no compiler).

Room for more, each one class with the same three methods: a Dask runner placing builds and runs on
other workers, a GPU runner calling nvcc and the simulator.
"""
from __future__ import annotations

from ..measure import LocalRunner
from .base import Runner, run_many
from .local import LocalProcessRunner
from .replay import ReplayRunner

__all__ = ["LocalProcessRunner", "LocalRunner", "ReplayRunner", "Runner", "run_many"]
