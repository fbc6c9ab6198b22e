"""Compiles C kernel sources into shared libraries, through a content-addressed cache.

`build` invokes gcc as a subprocess (an argv list, never a shell) with a timeout, compiles from a
temporary file and renames the result into the cache, so a half-written library is never seen.
The cache key covers everything a `-march=native` binary depends on: source, flags, compiler
version and CPU identity (a binary from another host may die of SIGILL).

A kill -9 cannot leave debris behind for long: temporary files and folders carry their owner's pid
in their name (`.tmp-<pid>-...` in the cache, `felixjax-tmp-<pid>-...` in the temp directory), and
every running compiler is recorded in a pid file (`.tmp-<pid>-compiler-<cc pid>.json`: its argv and
process group). The first build of a process removes the temporary files of dead owners and kills
the compilers they left running (`clean_stale`) -- only when the owner pid is dead and, for a
compiler, only when its command line is still the recorded one; never by name alone. Compilers run
in a process group of their own, killed as a whole on timeout.

Building never trims the cache (a `.so` and its `.c` per key, ~20 KB for a small op). A cache hit sets the
library's mtime, so mtime is its last use; `prune_cache` removes the least recently used keys (`felixjax
cache --prune 2G`), never a key used in the last `KEEP_RECENT_S` seconds nor a live build's temporary files,
and `build` compiles again when an entry vanishes between its hit and the check that follows.

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
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterable, Sequence

from codegen.target import compiler_version, cpu_identity

__all__ = [
    "BuildError",
    "BuildResult",
    "CacheWriteError",
    "CC",
    "DEFAULT_FLAGS",
    "assemble",
    "build",
    "build_key",
    "build_many",
    "cache_stats",
    "clean_stale",
    "default_cache_dir",
    "prune_cache",
]

CC = "gcc"
DEFAULT_FLAGS: tuple[str, ...] = (
    "-O3",
    "-march=native",
    "-fopenmp",
    "-ffp-contract=fast",  # let a*b+c become an FMA (not -ffast-math: results stay checkable)
    # no code here reads or traps on floating-point exception flags; with trapping math gcc keeps float
    # compare-and-select (clamps, NaN-aware max) as branches and vectorizes no loop containing one:
    # the networks' erf / exp loops ran 4.9x slower, with bit-identical results
    "-fno-trapping-math",
    "-std=gnu11",
    "-shared",
    "-fPIC",
)
# Linked after the source file; libraries given before it may be dropped by --as-needed.
_LIBS: tuple[str, ...] = ("-lm",)
_MAX_ERROR_CHARS = 4000
_SOURCE_NAME = "kernel.c"  # how compiler messages name the source (instead of a temp path)
# Temporary files / folders: `.tmp-<owner pid>-...` (cache) or `felixjax-tmp-<owner pid>-...` (temp dir).
_TMP_RE = re.compile(r"^(?:\.|felixjax-)tmp-(\d+)-")
_COMPILER_RE = re.compile(r"^(?:\.|felixjax-)tmp-(\d+)-compiler-(\d+)\.json$")
_cleaned: set[str] = set()  # directories this process has cleaned (once per process)
_cleaned_lock = threading.Lock()


class BuildError(RuntimeError):
    """Raised by `assemble` when the compiler fails (`build` reports failures in its result)."""


class CacheWriteError(OSError):
    """The build cache cannot take a build (a full disk, a read-only folder, ``FELIXJAX_CACHE`` naming a file):
    a fault of the machine, not of the source, so `build` raises it rather than report a ``compile_error``
    that a tuner would store against the config for good."""


# what gcc / ld say when the disk, not the source, is at fault
_ENVIRONMENT_HINTS = ("No space left on device", "Disk quota exceeded", "Read-only file system")


def _cache_write_error(cache: Path, why: object) -> CacheWriteError:
    return CacheWriteError(f"the build cache {cache} cannot take a build ({why}): set FELIXJAX_CACHE to a writable "
                           "folder with free space")


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


def cache_root() -> Path:
    """Where felixjax keeps its caches: `$FELIXJAX_CACHE` if set, else `~/.cache/felixjax` (the JAX and
    GPU-simulation caches are folders of it; the kernels are `default_cache_dir`)."""
    env = os.environ.get("FELIXJAX_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "felixjax"


def default_cache_dir() -> Path:
    """`$FELIXJAX_CACHE` if set, else `~/.cache/felixjax/build`."""
    return cache_root() if os.environ.get("FELIXJAX_CACHE") else cache_root() / "build"


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

    Raises:
        CacheWriteError: the cache cannot take the build (a full disk, a read-only folder, a file in its
            place): the machine's fault, never stored as the source's ``compile_error``.

    Example:
        >>> build("int broken(").status
        'compile_error'
    """
    start = time.perf_counter()
    flags = tuple(flags)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise _cache_write_error(cache, "a file is there, not a folder") from None
    except OSError as e:
        raise _cache_write_error(cache, e.strerror or e) from None
    key = build_key(source, flags)
    lib = cache / f"{key}.so"

    def result(status: str, error: str = "", cached: bool = False) -> BuildResult:
        path = str(lib) if status == "ok" else None
        return BuildResult(status, path, error, time.perf_counter() - start, cached, key)

    if _touch(lib):  # a hit: its mtime now says "used", for `prune_cache` (atime is unreliable: relatime, noatime)
        if elf_intact(lib):  # False too when it vanished since (pruned by another process): built again below
            return result("ok", cached=True)
        if lib.exists() and not elf_intact(lib):  # cut short (a crash or power loss mid-write): built again below
            with contextlib.suppress(OSError):
                lib.unlink()
    _clean_once(cache)
    try:
        fd, tmp_c = tempfile.mkstemp(prefix=f".tmp-{os.getpid()}-{key[:16]}-", suffix=".c", dir=cache)
    except OSError as e:
        raise _cache_write_error(cache, e.strerror or e) from None
    tmp_so = tmp_c[:-2] + ".so"
    try:
        try:
            with os.fdopen(fd, "w") as f:
                f.write(source)
        except OSError as e:
            raise _cache_write_error(cache, e.strerror or e) from None
        status, error = _run_compiler([CC, *flags, "-o", tmp_so, tmp_c, *_LIBS], timeout_s, pid_dir=cache)
        if status == "compile_error" and any(h in error for h in _ENVIRONMENT_HINTS):
            hint = next(h for h in _ENVIRONMENT_HINTS if h in error)  # (gcc's own temporary files go to TMPDIR)
            raise _cache_write_error(cache, f"the compiler: {hint.lower()}; or the temporary folder "
                                            f"{tempfile.gettempdir()}")
        if status != "ok":
            return result(status, _trim(error.replace(tmp_c, _SOURCE_NAME)))
        os.replace(tmp_c, cache / f"{key}.c")  # kept next to the library, for reading
        _fsync(tmp_so)  # on disk before its name is: a crash leaves no library cut short under the key
        os.replace(tmp_so, lib)  # atomic: concurrent builders of one key agree
        return result("ok")
    finally:
        for leftover in (tmp_c, tmp_so):
            if os.path.exists(leftover):
                os.unlink(leftover)


def _touch(path: Path) -> bool:
    """Whether the library at `path` exists, setting its mtime to now when it does (one syscall). A cache
    this user may not write (a shared, read-only one) still serves its hits, untouched."""
    try:
        os.utime(path)
        return True
    except FileNotFoundError:
        return False
    except OSError:
        return path.exists()


def elf_intact(path: str | os.PathLike) -> bool:
    """Whether an ELF file (a cached library or executable) holds every byte its header says it has:
    the program and section header tables end inside the file (a file cut short loses them first, and
    loading it would crash the measuring process with SIGBUS rather than fail cleanly).

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "x.so"; _ = p.write_bytes(b"not an ELF file")
        >>> elf_intact(p)
        False
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return False
    if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        return False
    end = "<" if head[5] == 1 else ">"
    if head[4] == 2:  # 64-bit
        if len(head) < 64:
            return False
        phoff, shoff = struct.unpack_from(end + "QQ", head, 0x20)
        phent, phnum, shent, shnum = struct.unpack_from(end + "HHHH", head, 0x36)
    else:
        phoff, shoff = struct.unpack_from(end + "II", head, 0x1C)
        phent, phnum, shent, shnum = struct.unpack_from(end + "HHHH", head, 0x2A)
    return phoff + phent * phnum <= size and shoff + shent * shnum <= size


def _fsync(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


#: per thread: the _Compilers of the build_many call a worker builds for (None elsewhere)
_compilers = threading.local()


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
    live = _Compilers()  # this call's running compilers (its worker threads register them)

    def one(source: str) -> BuildResult | None:
        if live.cancelled:
            return None
        _compilers.live = live
        try:
            return build(source, **build_kwargs)
        finally:
            _compilers.live = None

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        done = dict(zip(unique, pool.map(one, unique)))
    except BaseException:  # a Ctrl-C (or a build that raised): neither wait for the running builds nor leave them
        pool.shutdown(wait=False, cancel_futures=True)
        live.cancel()
        raise
    pool.shutdown()
    return [done[s] for s in sources]


class _Compilers:
    """A build_many call's running compilers, and whether the call was cancelled (a compiler started after
    the cancel kills itself at once)."""

    def __init__(self) -> None:
        self.procs: set[subprocess.Popen] = set()
        self.cancelled = False
        self.lock = threading.Lock()

    def add(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.procs.add(proc)
            if self.cancelled:
                _kill_group(proc)

    def discard(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.procs.discard(proc)

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            for proc in list(self.procs):
                _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


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
    _clean_once(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(prefix=f"felixjax-tmp-{os.getpid()}-asm-") as tmp:
        src, asm = os.path.join(tmp, _SOURCE_NAME), os.path.join(tmp, "kernel.s")
        Path(src).write_text(source)
        status, error = _run_compiler([CC, *flags, "-S", "-o", asm, src], timeout_s, pid_dir=tmp)
        if status != "ok":
            raise BuildError(f"{status}: {_trim(error)}")
        return Path(asm).read_text()


def _run_compiler(argv: list[str], timeout_s: float, *, pid_dir: str | os.PathLike | None = None
                  ) -> tuple[str, str]:
    """Runs the compiler; returns (status, stderr). Kills the whole process group on timeout.

    With `pid_dir`, the compiler's pid, process group and argv are recorded there while it runs, so a
    later process can kill it if this one dies first (`clean_stale`)."""
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
    pid_file = _record_compiler(pid_dir, proc.pid, argv) if pid_dir is not None else None
    live = getattr(_compilers, "live", None)  # build_many's: killed there on a Ctrl-C
    if live is not None:
        live.add(proc)
    try:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            return "timeout", f"{argv[0]} timed out after {timeout_s:g} s"
        except BaseException:  # interrupted (Ctrl-C): the compiler's group goes with us
            _kill_group(proc)
            raise
    finally:
        if live is not None:
            live.discard(proc)
        if pid_file is not None:
            _unlink(pid_file)
    if proc.returncode != 0:
        return "compile_error", (err or out or f"{argv[0]} exited with {proc.returncode}")
    return "ok", ""


def _record_compiler(directory: str | os.PathLike, pid: int, argv: list[str]) -> str | None:
    path = os.path.join(os.fspath(directory), f".tmp-{os.getpid()}-compiler-{pid}.json")
    try:
        with open(path, "w") as f:
            json.dump({"owner": os.getpid(), "pid": pid, "pgid": pid, "argv": list(argv)}, f)
        return path
    except OSError:
        return None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (another user's counts: never touch what may be live)."""
    if pid <= 0:
        return True  # not a real owner: never treat as dead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]] if raw else None


def _kill_orphan_compiler(pid_file: str) -> bool:
    """Kills the compiler (process group) recorded in `pid_file` if it still runs the recorded
    command; returns whether it killed one."""
    try:
        with open(pid_file) as f:
            rec = json.load(f)
        pid, pgid, argv = int(rec["pid"]), int(rec.get("pgid", rec["pid"])), list(rec["argv"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if pid <= 0 or pgid <= 0 or not argv or _cmdline(pid) != [str(a) for a in argv]:
        return False  # gone, or the pid now belongs to another program
    try:
        if os.getpgid(pid) == pgid:
            os.killpg(pgid, signal.SIGKILL)  # the driver and its cc1 / as / ld
        else:
            os.kill(pid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def clean_stale(directory: str | os.PathLike) -> list[str]:
    """Removes the temporary build files and folders in `directory` whose owner process is dead, after
    killing the compilers those owners left running. Returns the removed names.

    An entry is touched only when its name carries an owner pid (`.tmp-<pid>-...` or
    `felixjax-tmp-<pid>-...`), that pid is not this process and no process with it exists, and it
    belongs to this user; a compiler is killed only if its command line is still the recorded one.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = open(os.path.join(d, f".tmp-{os.getpid()}-mine.c"), "w")
        ...     clean_stale(d)
        []
    """
    directory = os.fspath(directory)
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    uid = os.getuid() if hasattr(os, "getuid") else None
    removed = []
    dead: dict[int, bool] = {}
    # compilers first (top level and inside stale folders), then files and folders
    for entry in entries:
        m = _TMP_RE.match(entry.name)
        if not m:
            continue
        owner = int(m.group(1))
        if owner == os.getpid():
            continue
        if owner not in dead:
            dead[owner] = not _pid_alive(owner)
        if not dead[owner]:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if uid is not None and st.st_uid != uid:
                continue
            is_dir = entry.is_dir(follow_symlinks=False)
            if is_dir:
                for inner in os.listdir(entry.path):
                    if _COMPILER_RE.match(inner):
                        _kill_orphan_compiler(os.path.join(entry.path, inner))
                shutil.rmtree(entry.path)
            else:
                if _COMPILER_RE.match(entry.name):
                    _kill_orphan_compiler(entry.path)
                os.unlink(entry.path)
            removed.append(entry.name)
        except FileNotFoundError:
            continue  # another process cleaned it first
        except OSError:
            continue
    return removed


def _clean_once(directory: str | os.PathLike) -> None:
    """`clean_stale` on the first build of this process in `directory`."""
    key = os.path.abspath(os.fspath(directory))
    with _cleaned_lock:
        if key in _cleaned:
            return
        _cleaned.add(key)
    clean_stale(key)


def _trim(text: str, limit: int = _MAX_ERROR_CHARS) -> str:
    """Keeps the head of long compiler output (the first errors are the informative ones)."""
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [{len(text) - limit} more characters]"


# ---- the cache's size: listing and pruning ------------------------------------------------------------------
# A library is "used" when it is built or served from the cache (`build` sets its mtime then). One used this
# recently is never pruned: a process that got it from `build` may be about to load it (a measurement batch is
# built first, then loaded kernel by kernel), and a library deleted before its dlopen() fails that trial.
# Deleting one already loaded is harmless (Linux keeps the mapped file until it is unloaded).
KEEP_RECENT_S = 600.0
_KEY_RE = re.compile(r"^([0-9a-f]{64})\.(?:so|c)$")  # what `build` writes: `<key>.so` and its `<key>.c`
_KERNEL_SUBDIRS = ("dask-libs",)  # libraries shipped from Dask workers (codegen.run.remote), `<key>.so` too


@dataclasses.dataclass(frozen=True)
class CacheStats:
    """What a build cache holds (`cache_stats`): sizes are the files' lengths, times are mtimes (last use).

    Attributes:
        path: the cache folder.
        bytes: total size of its files (kernels, temporary files and anything else in it; not its other
            caches' subfolders such as `jax/`).
        files: number of those files.
        kernels: number of cache keys (a `.so` with its `.c`).
        oldest, newest: the least and most recent last use of a kernel (epoch seconds), None when empty.
        live_tmp: temporary files of builds running now (never removed).
        recent: kernels used in the last `KEEP_RECENT_S` seconds (never pruned).
        other_bytes: the part of `bytes` in files felixjax did not write (neither counted by `prune_cache`
            nor removed).
    """

    path: str
    bytes: int
    files: int
    kernels: int
    oldest: float | None
    newest: float | None
    live_tmp: int
    recent: int
    other_bytes: int = 0


@dataclasses.dataclass
class _Group:
    """The files of one cache key: (path, size, mtime_ns) each."""

    files: list[tuple[str, int, int]]

    @property
    def size(self) -> int:
        return sum(f[1] for f in self.files)

    @property
    def last_use_ns(self) -> int:
        return max(f[2] for f in self.files)


def _scan(cache: Path) -> tuple[dict[tuple[str, str], _Group], list[tuple[str, int, bool]], int, int]:
    """The kernel cache's files: key groups, temp files (path, size, owner alive) and the count and size
    of other files (not ours: listed, never removed)."""
    groups: dict[tuple[str, str], _Group] = {}
    tmp: list[tuple[str, int, bool]] = []
    other_n = other_bytes = 0
    alive: dict[int, bool] = {}
    for folder in (cache, *(cache / d for d in _KERNEL_SUBDIRS)):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for e in entries:
            try:
                if not e.is_file(follow_symlinks=False):
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue  # removed meanwhile
            m, t = _KEY_RE.match(e.name), _TMP_RE.match(e.name)
            if m:
                groups.setdefault((str(folder), m.group(1)), _Group([])).files.append(
                    (e.path, st.st_size, st.st_mtime_ns))
            elif t:
                owner = int(t.group(1))
                if owner not in alive:
                    alive[owner] = owner == os.getpid() or _pid_alive(owner)
                tmp.append((e.path, st.st_size, alive[owner]))
            else:
                other_n, other_bytes = other_n + 1, other_bytes + st.st_size
    return groups, tmp, other_n, other_bytes


def cache_stats(cache_dir: str | os.PathLike | None = None, *, keep_recent_s: float = KEEP_RECENT_S
                ) -> CacheStats:
    """Sizes, counts and ages of the build cache (default `default_cache_dir()`).

    Example:
        >>> import tempfile
        >>> cache_stats(tempfile.mkdtemp()).kernels
        0
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    groups, tmp, other_n, other_bytes = _scan(cache)
    uses = [g.last_use_ns / 1e9 for g in groups.values()]
    cutoff = time.time() - keep_recent_s
    return CacheStats(
        path=str(cache),
        bytes=sum(g.size for g in groups.values()) + sum(t[1] for t in tmp) + other_bytes,
        files=sum(len(g.files) for g in groups.values()) + len(tmp) + other_n,
        kernels=len(groups),
        oldest=min(uses) if uses else None,
        newest=max(uses) if uses else None,
        live_tmp=sum(1 for t in tmp if t[2]),
        recent=sum(1 for u in uses if u > cutoff),
        other_bytes=other_bytes,
    )


def prune_cache(
    max_bytes: int | None = None,
    older_than_s: float | None = None,
    dry_run: bool = False,
    *,
    cache_dir: str | os.PathLike | None = None,
    keep_recent_s: float = KEEP_RECENT_S,
) -> tuple[int, int]:
    """Deletes least-recently-used kernels from the build cache; returns (files removed, bytes freed).

    Kernels last used more than `older_than_s` seconds ago go first, then the least recently used ones until
    the cache's kernels hold at most `max_bytes` (`max_bytes=0`: every kernel; files felixjax did not write are
    neither counted nor removed). A kernel's `.so` and `.c` go together; "used" is its last build or cache hit (`build` sets the mtime). Safe beside
    running tuners: temporary files of live builds stay (those of dead processes go, as in `clean_stale`), so
    do kernels used in the last `keep_recent_s` seconds (a process may be about to load one), and a library
    that a `build` serves while it is being pruned is put back. With `dry_run`, counts what would go and
    removes nothing.

    Example:
        >>> import tempfile
        >>> prune_cache(max_bytes=0, cache_dir=tempfile.mkdtemp())
        (0, 0)
    """
    if max_bytes is not None and not max_bytes >= 0:  # (NaN too)
        raise ValueError(f"max_bytes must be >= 0 (got {max_bytes})")
    if older_than_s is not None and not older_than_s >= 0:
        raise ValueError(f"older_than_s must be >= 0 (got {older_than_s})")
    if older_than_s is not None and older_than_s > 1e12:  # past any file's age (inf too): nothing is that old
        older_than_s = 1e12
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    groups, tmp, _, _ = _scan(cache)
    now_ns = time.time_ns()
    keep_ns = now_ns - int(keep_recent_s * 1e9)
    removed = freed = 0
    # temporary files of dead processes: what the next build would remove anyway
    dead = {p: size for p, size, live in tmp if not live}
    if dead:
        if dry_run:
            removed, freed = len(dead), sum(dead.values())
        else:
            gone = set()
            for folder in {os.path.dirname(p) for p in dead}:
                gone.update(os.path.join(folder, name) for name in clean_stale(folder))
            removed, freed = len(gone & dead.keys()), sum(dead[p] for p in gone & dead.keys())
    total = sum(g.size for g in groups.values()) + sum(t[1] for t in tmp) - freed  # others' files: not counted
    order = sorted((g for g in groups.values() if g.last_use_ns <= keep_ns), key=lambda g: g.last_use_ns)
    old_ns = None if older_than_s is None else now_ns - int(older_than_s * 1e9)
    for g in order:
        too_old = old_ns is not None and g.last_use_ns < old_ns
        too_big = max_bytes is not None and total > max_bytes
        if not (too_old or too_big):
            break  # least recently used first: nothing later is older, and the size only shrinks
        n, size = (len(g.files), g.size) if dry_run else _remove_group(g)
        removed, freed, total = removed + n, freed + size, total - size
    return removed, freed


def _remove_group(g: _Group) -> tuple[int, int]:
    """Removes one key's files, the library first: it is renamed aside (a temporary name of this process)
    and looked at again, and put back if a `build` touched it after the scan (a cache hit it may load)."""
    removed = freed = 0
    for path, size, mtime_ns in sorted(g.files, key=lambda f: not f[0].endswith(".so")):
        if path.endswith(".so"):
            aside = os.path.join(os.path.dirname(path), f".tmp-{os.getpid()}-prune-{os.path.basename(path)}")
            try:
                os.rename(path, aside)
            except FileNotFoundError:
                continue  # another pruner, or a rebuild in flight: nothing of ours to count
            except OSError:
                return removed, freed
            try:
                touched = os.stat(aside).st_mtime_ns != mtime_ns
            except OSError:
                touched = False
            if touched:
                with contextlib.suppress(OSError):
                    os.replace(aside, path)  # served meanwhile: keep the kernel, source and all
                return removed, freed
            path = aside
        try:
            os.unlink(path)
            removed, freed = removed + 1, freed + size
        except FileNotFoundError:
            continue
        except OSError:
            continue
    return removed, freed
