"""JAX's persistent compilation cache for felixjax's jitted functions.

The descent, the features and the cost-model steps compile in seconds each on a small CPU; caching
the executables on disk makes every later process (a resumed run, the next CLI call, the tests)
skip those compilations. Set ``FELIXJAX_JAX_CACHE=0`` to turn it off, or to a folder to move it.
"""
from __future__ import annotations

import os

_DONE = False


def enable() -> None:
    """Turn the cache on once per process (no-op if the user configured one already)."""
    global _DONE
    if _DONE:
        return
    _DONE = True
    where = os.environ.get("FELIXJAX_JAX_CACHE")
    if where == "0":
        return
    import jax

    if jax.config.jax_compilation_cache_dir:
        return
    base = os.environ.get("FELIXJAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "felixjax")
    path = where or os.path.join(base, "jax")
    try:
        os.makedirs(path, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    except (OSError, AttributeError):  # pragma: no cover - a read-only home or an old jax
        pass
