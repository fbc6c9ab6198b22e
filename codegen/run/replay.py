"""The replay runner: recorded results instead of compiling and timing, for tests of the layers above
(tuning sessions, schedulers) that must not depend on a compiler or on timing noise.

It answers at the level of sources: ``build`` never compiles (every build is ``ok``, its ``lib_path`` a
``replay:`` key of the source), ``run`` returns the result recorded for that source. (Its config-level
sibling, ``felixjax.testing.ReplayRunner``, replays per config and stands in for a whole measurer.)

Example:
    >>> import numpy as np
    >>> from codegen.measure import RunRequest
    >>> r = ReplayRunner(lambda source: 1e-3 * len(source))
    >>> [b] = r.build(["int k;"])
    >>> r.run(RunRequest(None, [], (1,), 0, np.zeros(1)), build=b).latency_s
    0.006
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence

from ..build import BuildResult
from ..measure import MeasureResult, RunRequest

Recorded = float | MeasureResult


class ReplayRunner:
    """A :class:`~codegen.run.Runner` that replays recorded results.

    Args:
        results: ``{source: latency seconds or MeasureResult}`` or a callable ``source -> ...``. A source
            missing from the table, or a non-finite or non-positive latency, comes back as
            ``runtime_error``.
    """

    def __init__(self, results: Mapping[str, Recorded] | Callable[[str], Recorded]):
        self.results = results
        self._sources: dict[str, str] = {}  # replay key -> source
        self.runs: list[str] = []  # sources run, in order

    def __enter__(self) -> ReplayRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def build(self, sources: Sequence[str]) -> list[BuildResult]:
        out = []
        for src in sources:
            key = hashlib.sha256(src.encode()).hexdigest()
            self._sources[key] = src
            out.append(BuildResult("ok", f"replay:{key}", "", 0.0, True, key))
        return out

    def run(self, request: RunRequest, *, build: BuildResult | None = None) -> MeasureResult:
        if build is not None and build.status != "ok":
            return MeasureResult("timeout" if build.status == "timeout" else "compile_error", error=build.error)
        lib = build.lib_path if build is not None else request.lib_path
        src = self._sources.get(str(lib or "").removeprefix("replay:"))
        if src is None:
            return MeasureResult("runtime_error", error=f"replay: {lib!r} was not built by this runner")
        self.runs.append(src)
        if isinstance(self.results, Mapping):
            if src not in self.results:
                return MeasureResult("runtime_error", error="replay: source not in the recorded table")
            v = self.results[src]
        else:
            v = self.results(src)
        if isinstance(v, MeasureResult):
            return v
        if not math.isfinite(v) or v <= 0:
            return MeasureResult("runtime_error", error=f"replay: recorded latency {v}")
        return MeasureResult("ok", (float(v),))

    def close(self) -> None:
        pass
