"""Compiles C kernel sources into shared libraries, through a content-addressed cache.

`build` invokes gcc as a subprocess (an argv list, never a shell) with a timeout, compiles from a
temporary file and renames the result into the cache, so a half-written library is never seen.
The cache key covers everything a `-march=native` binary depends on: source, flags, compiler
version and CPU identity (a binary from another host may die of SIGILL).

Example:
    >>> from codegen.build import build
    >>> r = build("void f(void) {}")
    >>> r.status, r.lib_path.endswith(".so")
    ('ok', True)
    >>> build("void f(void) {}").cached
    True
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterable, Sequence

from codegen.target import compiler_version, cpu_identity

__all__ = [
    "BuildError",
    "BuildResult",
    "CC",
    "DEFAULT_FLAGS",
    "assemble",
    "build",
    "build_key",
    "build_many",
    "default_cache_dir",
]

CC = "gcc"
DEFAULT_FLAGS: tuple[str, ...] = (
    "-O3",
    "-march=native",
    "-fopenmp",
    "-ffp-contract=fast",  # let a*b+c become an FMA (not -ffast-math: results stay checkable)
    "-std=gnu11",
    "-shared",
    "-fPIC",
)
# Linked after the source file; libraries given before it may be dropped by --as-needed.
_LIBS: tuple[str, ...] = ("-lm",)
_MAX_ERROR_CHARS = 4000
_SOURCE_NAME = "kernel.c"  # how compiler messages name the source (instead of a temp path)


class BuildError(RuntimeError):
    """Raised by `assemble` when the compiler fails (`build` reports failures in its result)."""


@dataclasses.dataclass(frozen=True)
class BuildResult:
    """Outcome of one build.

    Attributes:
        status: "ok", "compile_error" or "timeout".
        lib_path: path of the shared library when ok, else None.
        error: the compiler's stderr (trimmed, temp paths replaced by "kernel.c") on failure.
        seconds: wall time of this call (compile, or cache lookup when cached).
        cached: the library came from the cache.
        key: cache key (sha256 hex) of (source, flags, compiler, CPU identity).
    """

    status: str
    lib_path: str | None
    error: str
    seconds: float
    cached: bool
    key: str = ""


def default_cache_dir() -> Path:
    """`$FELIXJAX_CACHE` if set, else `~/.cache/felixjax/build`."""
    env = os.environ.get("FELIXJAX_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "felixjax" / "build"


def build_key(source: str, flags: Sequence[str] = DEFAULT_FLAGS) -> str:
    """The cache key of a build: sha256 of source, flags, compiler version and CPU identity.

    Example:
        >>> build_key("int x;") != build_key("int x;", ("-O2", "-shared", "-fPIC"))
        True
    """
    blob = json.dumps(
        {
            "source": source,
            "flags": list(flags),
            "libs": list(_LIBS),
            "compiler": compiler_version(CC),
            "cpu": cpu_identity(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def build(
    source: str,
    *,
    flags: Sequence[str] = DEFAULT_FLAGS,
    cache_dir: str | os.PathLike | None = None,
    timeout_s: float = 60.0,
) -> BuildResult:
    """Compiles `source` into a shared library, or returns the cached one.

    Compile errors and timeouts are returned (status), never raised; failures are not cached.

    Args:
        source: C source text.
        flags: compiler flags (must produce a shared library, e.g. include -shared -fPIC).
        cache_dir: cache directory; default `default_cache_dir()`.
        timeout_s: wall-clock limit of the compiler process.

    Returns:
        A `BuildResult`.

    Example:
        >>> build("int broken(").status
        'compile_error'
    """
    start = time.perf_counter()
    flags = tuple(flags)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    key = build_key(source, flags)
    lib = cache / f"{key}.so"

    def result(status: str, error: str = "", cached: bool = False) -> BuildResult:
        path = str(lib) if status == "ok" else None
        return BuildResult(status, path, error, time.perf_counter() - start, cached, key)

    if lib.exists():
        return result("ok", cached=True)
    fd, tmp_c = tempfile.mkstemp(prefix=f".{key[:16]}-", suffix=".c", dir=cache)
    tmp_so = tmp_c[:-2] + ".so"
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
        status, error = _run_compiler([CC, *flags, "-o", tmp_so, tmp_c, *_LIBS], timeout_s)
        if status != "ok":
            return result(status, _trim(error.replace(tmp_c, _SOURCE_NAME)))
        os.replace(tmp_c, cache / f"{key}.c")  # kept next to the library, for reading
        os.replace(tmp_so, lib)  # atomic: concurrent builders of one key agree
        return result("ok")
    finally:
        for leftover in (tmp_c, tmp_so):
            if os.path.exists(leftover):
                os.unlink(leftover)


def build_many(
    sources: Iterable[str], *, workers: int = 2, **build_kwargs
) -> list[BuildResult]:
    """Builds several sources in parallel (gcc runs as a subprocess, so threads suffice).

    Identical sources are compiled once. Results are in the order of `sources`.

    Args:
        sources: C sources.
        workers: concurrent compiler processes.
        **build_kwargs: passed to `build` (flags, cache_dir, timeout_s).

    Example:
        >>> [r.status for r in build_many(["int a;", "int b;"])]
        ['ok', 'ok']
    """
    sources = list(sources)
    unique = list(dict.fromkeys(sources))
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        done = dict(zip(unique, pool.map(lambda s: build(s, **build_kwargs), unique)))
    return [done[s] for s in sources]


def assemble(
    source: str, flags: Sequence[str] = DEFAULT_FLAGS, *, timeout_s: float = 60.0
) -> str:
    """Compiles `source` with -S and returns the assembly text (not cached).

    Raises:
        BuildError: the compiler failed or timed out.

    Example:
        >>> "ret" in assemble("int f(int x) { return x + 1; }")
        True
    """
    with tempfile.TemporaryDirectory(prefix="felixjax-asm-") as tmp:
        src, asm = os.path.join(tmp, _SOURCE_NAME), os.path.join(tmp, "kernel.s")
        Path(src).write_text(source)
        status, error = _run_compiler([CC, *flags, "-S", "-o", asm, src], timeout_s)
        if status != "ok":
            raise BuildError(f"{status}: {_trim(error)}")
        return Path(asm).read_text()


def _run_compiler(argv: list[str], timeout_s: float) -> tuple[str, str]:
    """Runs the compiler; returns (status, stderr). Kills the whole process group on timeout."""
    try:
        # A session of its own, so a timeout can kill cc1/as/ld too, not only the gcc driver.
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except OSError as e:
        return "compile_error", f"cannot run {argv[0]}: {e}"
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        return "timeout", f"{argv[0]} timed out after {timeout_s:g} s"
    if proc.returncode != 0:
        return "compile_error", (err or out or f"{argv[0]} exited with {proc.returncode}")
    return "ok", ""


def _trim(text: str, limit: int = _MAX_ERROR_CHARS) -> str:
    """Keeps the head of long compiler output (the first errors are the informative ones)."""
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [{len(text) - limit} more characters]"
