"""Whole networks: tune every task of a model with Ansor's gradient task scheduler, then build the
model into one C library from the best schedules (``codegen.netbuild``).

This module only re-exports (every old name stays importable from here); the code lives by job in
``felixjax.scheduler`` (task scheduler), ``felixjax.network_tune`` (the task-scheduled rounds), ``felixjax.network_build``
(schedules, graph to NetSpec, CompiledModel), ``felixjax.pipeline`` (tune_model, build_model), ``felixjax.ort_compare`` (onnxruntime session,
check and interleaved timing) and ``felixjax.network_cli`` (command-line glue).

``tune_model`` spends a trial budget over a model's distinct tasks. After a warm-up round per task it
gives each round to the task whose next round is expected to cut the end-to-end latency the most
(Ansor's "gradient" task scheduler, PRIOR_ART §3): with ``g_i`` task ``i``'s best latency, ``w_i`` its
occurrence count and ``t_i`` its rounds so far, the estimated network latency is ``f = sum_i w_i g_i`` and
the task chosen is ``argmin_i  df/dg_i * (alpha * backward_i + (1 - alpha) * forward_i)`` where

* ``backward_i = (g_i(t_i) - g_i(t_i - window)) / window`` (recent progress; 0 until there are enough
  rounds),
* ``forward_i = min(g_i - g_i / t_i, beta * flops_i / best_flops_of_similar_tasks) - g_i`` (optimistic
  next-round gain, and what a similar task already reaches),

with ``alpha = 0.2``, ``beta = 2``, ``window = 3``. Similar tasks share an op kind and a FLOP bucket
``int(log_1.618(flops + 1))``; a task that stays ``beta`` times slower than its group's best after many
more rounds leaves the group. A task whose round measured nothing new (its space is exhausted) drops out.

``build_model`` lowers each anchor task with its best record in the database (``Space.default()`` of
``codegen.space.default_sketch`` where there is none), turns the fused graph into a
``codegen.netbuild.NetSpec``, compiles one library and returns a :class:`CompiledModel`: ``exe(x)`` runs
the compiled C (never a Python fallback), ``exe.export(dir)`` writes a standalone folder that builds with
``make``.

Example:
    >>> import numpy as np
    >>> import felixjax as fj
    >>> from felixjax.network import build_model
    >>> model = fj.load_onnx(fj.zoo.make_model("transformer_block", seq=16, dim=32, heads=2))
    >>> exe = build_model(model)
    >>> x = np.random.default_rng(0).standard_normal((1, 16, 32)).astype(np.float32)
    >>> bool(np.allclose(exe(x), model.run_numpy(x), rtol=1e-4, atol=1e-4))
    True
"""
from __future__ import annotations

# ruff: noqa: F401  (re-exports)
from .network_build import CompiledModel, Schedule, _as_model, _open_db, choose_schedules, graph_to_spec
from .network_cli import build_model_cli, tune_model_cli
from .network_tune import NetworkTuneResult, TaskTuning, _default_strategy, _round_progress
from .pipeline import build_model, choose_layout, tune_model
from .ort_compare import _ort_session, compare_onnxruntime, time_interleaved
from .scheduler import NO_LATENCY, TaskScheduler, similarity_tag

__all__ = ["CompiledModel", "NetworkTuneResult", "Schedule", "TaskScheduler", "build_model", "compare_onnxruntime",
           "graph_to_spec", "tune_model", "tune_model_cli"]
