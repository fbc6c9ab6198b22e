"""JAX's persistent compilation cache for felixjax's jitted functions.

The descent, the features and the cost-model steps compile in seconds each on a small CPU; caching
the executables on disk makes every later process (a resumed run, the next CLI call, the tests)
skip those compilations. It lives in ``$FELIXJAX_CACHE/jax``, or ``~/.cache/felixjax/jax`` when that is unset;
set ``FELIXJAX_JAX_CACHE=0`` to turn it off, or to a folder to move it. ``felixjax cache`` shows its size and
``felixjax cache --clear`` empties it (with the build cache).
"""
from __future__ import annotations

import os

_DONE = False
_COMPILE_S = 0.0  # seconds JAX spent tracing, lowering and compiling (or loading from this cache), process-wide


def _count_compiles(event: str, seconds: float, **_) -> None:
    global _COMPILE_S
    if event.startswith("/jax/core/compile/"):
        _COMPILE_S += seconds


def cache_dir() -> str | None:
    """Where felixjax puts JAX's cache: ``$FELIXJAX_JAX_CACHE`` when set (``0``: nowhere, None), else the
    ``jax`` folder of ``$FELIXJAX_CACHE``, else ``~/.cache/felixjax/jax`` (a cache the user configured in JAX
    itself, ``jax_compilation_cache_dir``, is used instead and not named here)."""
    where = os.environ.get("FELIXJAX_JAX_CACHE")
    if where == "0":
        return None
    from codegen.build import cache_root

    return where or str(cache_root() / "jax")


def cache_files(path: str) -> list[os.DirEntry]:
    """The JAX cache's own files in ``path`` (``<key>-cache``, and ``<key>-atime`` when JAX bounds its size):
    what ``felixjax cache`` counts and ``--clear`` removes; anything else in the folder is left alone."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return []
    return [e for e in entries if e.name.endswith(("-cache", "-atime")) and e.is_file(follow_symlinks=False)]


def compile_seconds() -> float:
    """Seconds this process's JAX compilations took so far, counted from :func:`enable` on (a tuning
    call's share: the difference over the call, as ``res.stats["jax_compile_s"]``)."""
    return _COMPILE_S


def enable() -> None:
    """Turn the cache on once per process (no-op if the user configured one already), and count the
    compilations' seconds (:func:`compile_seconds`)."""
    global _DONE
    if _DONE:
        return
    _DONE = True
    try:
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(_count_compiles)
    except (ImportError, AttributeError):  # pragma: no cover - an old jax: no count
        pass
    where = os.environ.get("FELIXJAX_JAX_CACHE")
    if where == "0":
        return
    import jax

    if jax.config.jax_compilation_cache_dir:
        return
    path = cache_dir()
    try:
        os.makedirs(path, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    except (OSError, AttributeError):  # pragma: no cover - a read-only home or an old jax
        pass
