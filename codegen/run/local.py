"""The local process runner: builds with the C compiler on this machine (in parallel, through the build
cache), measures in one long-lived child process (:class:`~codegen.measure.LocalRunner`, whose lock,
canaries, timeouts and timing protocol it keeps).

Example:
    >>> import numpy as np
    >>> from codegen.measure import RunRequest, TIMING_HARNESS_C
    >>> src = '''void fj_kernel(void* const* b) {
    ...   const float* x = b[0]; float* y = b[1];
    ...   for (int i = 0; i < 8; ++i) y[i] = x[i] + 1;
    ... }''' + TIMING_HARNESS_C
    >>> x = np.arange(8, dtype=np.float32)
    >>> with LocalProcessRunner() as runner:
    ...     [b] = runner.build([src])
    ...     res = runner.run(RunRequest(None, [x], (8,), 0, x + 1), build=b)
    >>> res.status
    'ok'
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..build import DEFAULT_FLAGS, BuildResult, build_many
from ..measure import LocalRunner


class LocalProcessRunner(LocalRunner):
    """:class:`~codegen.measure.LocalRunner` plus the build half of the :class:`~codegen.run.Runner`
    protocol: ``build(sources)`` compiles with ``build_workers`` parallel compiler processes.

    Compiles and measurements never overlap when the caller builds a batch, then runs it (as the
    tuner does), so the compilers never share the cores being timed.

    Args:
        build_workers: concurrent compiler processes.
        flags: compiler flags of every build.
        cache_dir: the build cache (default ``codegen.build.default_cache_dir()``).
        build_timeout_s: limit of one compile.
        **runner_kwargs: passed to :class:`~codegen.measure.LocalRunner` (protocol, timeout_s, lock, ...).
    """

    def __init__(self, *, build_workers: int = 2, flags: Sequence[str] = DEFAULT_FLAGS,
                 cache_dir: str | os.PathLike | None = None, build_timeout_s: float | None = None,
                 **runner_kwargs: Any):
        super().__init__(**runner_kwargs)
        self.build_workers = int(build_workers)
        self.build_kwargs: dict[str, Any] = {"flags": tuple(flags)}
        if cache_dir is not None:
            self.build_kwargs["cache_dir"] = cache_dir
        if build_timeout_s is not None:
            self.build_kwargs["timeout_s"] = float(build_timeout_s)

    def __enter__(self) -> LocalProcessRunner:
        super().__enter__()
        return self

    def build(self, sources: Sequence[str]) -> list[BuildResult]:
        """Compile every source (identical sources once, cached ones not at all), in order."""
        return build_many(list(sources), workers=self.build_workers, **self.build_kwargs)
