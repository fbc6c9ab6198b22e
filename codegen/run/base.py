"""The runner protocol: where kernels are built and where they run, behind one small interface.

A :class:`Runner` turns sources into builds and runs a :class:`~codegen.measure.RunRequest` against a
build. Keeping both behind one object lets a runner decide where builds happen as well as runs: the
local runner compiles with ``gcc`` on this machine and measures in a child process
(:class:`~codegen.run.local.LocalProcessRunner`); a replay runner answers from recorded results without
compiling (:class:`~codegen.run.replay.ReplayRunner`); a Dask runner can place builds on other workers
and a GPU runner can call ``nvcc`` and the simulator, each as one more class with these three methods.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ..build import BuildResult
from ..measure import MeasureResult, RunRequest


@runtime_checkable
class Runner(Protocol):
    """Builds sources and measures requests.

    ``build(sources)`` returns one :class:`~codegen.build.BuildResult` per source, in order (failed builds
    are results, never exceptions; a cache that cannot take a build raises ``codegen.build.CacheWriteError``);
    ``run(request, build=b)`` measures ``request`` against build ``b``
    (a failed ``b`` comes back as its ``compile_error`` / ``timeout`` status without running; without
    ``b``, ``request.lib_path`` names the library); ``close()`` releases processes and connections.
    """

    def build(self, sources: Sequence[str]) -> list[BuildResult]: ...

    def run(self, request: RunRequest, *, build: BuildResult | None = None) -> MeasureResult: ...

    def close(self) -> None: ...


def run_many(runner: Runner, requests: Sequence[RunRequest], builds: Sequence[BuildResult]) -> list[MeasureResult]:
    """Measure requests one after another, each against its build (any runner)."""
    return [runner.run(r, build=b) for r, b in zip(requests, builds, strict=True)]
