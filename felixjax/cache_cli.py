"""``felixjax cache``: where felixjax's caches are, how big they are, and pruning or clearing them.

The build cache (compiled kernels, ``codegen.build.default_cache_dir()``) grows by a ``.so`` and its ``.c``
per trial and is never trimmed by tuning; ``--prune SIZE`` / ``--older-than DAYS`` remove the least recently
used kernels (``codegen.build.prune_cache``), ``--clear`` empties it (but for kernels used in the last 10
minutes: a running tuner's) and JAX's compilation cache.

Example:
    felixjax cache --prune 2G
"""
from __future__ import annotations

import argparse
import math
import os
import re
import time
from collections.abc import Callable

EXAMPLE = """examples:
  felixjax cache                          # where the caches are, their sizes and ages
  felixjax cache --prune 2G               # least recently used kernels go until the kernel cache is <= 2 GiB
  felixjax cache --older-than 30          # kernels not used for 30 days go
  felixjax cache --prune 500M --dry-run   # what would go; nothing is removed
  felixjax cache --clear                  # every kernel unused for 10 min, JAX's and the GPU-simulation caches
(sizes: K, M, G, T are powers of 1024; kernels used in the last 10 minutes and the files of builds running
now are always kept, so pruning is safe beside running tuners)"""

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:I?B)?\s*", re.IGNORECASE)
_GPU_SUBDIRS = ("cubin", "cuda_emu")  # codegen.cuda.nvcc / codegen.cuda.emulate, under the cache root


def parse_size(text: str) -> int:
    """``"2G"`` -> bytes (K, M, G, T: powers of 1024; a ``B`` / ``iB`` suffix is allowed); ValueError otherwise.

    Example:
        >>> parse_size("500M"), parse_size("1.5k"), parse_size("2GiB"), parse_size("0")
        (524288000, 1536, 2147483648, 0)
    """
    m = _SIZE_RE.fullmatch(text)
    if not m:
        raise ValueError(f"{text!r} is not a size: give a number with K, M, G or T, such as 500M or 2G")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def human(n: float) -> str:
    """Bytes as du -h writes them: ``"850M"``, ``"1.2G"``."""
    for unit in ("B", "K", "M", "G", "T"):
        if n < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "B" or n >= 10 else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.0f}T"  # pragma: no cover


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _age(t: float | None) -> str:
    if t is None:
        return "-"
    s = max(0.0, time.time() - t)
    for limit, div, unit in ((120, 1, "s"), (7200, 60, "min"), (172800, 3600, "h")):
        if s < limit:
            return f"{s / div:.0f} {unit}"
    return f"{s / 86400:.0f} d"


def add_parser(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Register the ``cache`` subcommand (``add`` is cli.py's subparser factory)."""
    c = add("cache", "show where felixjax's caches are (compiled kernels, JAX's compilations) and their sizes; "
                     "prune the least recently used kernels or clear them")
    c.epilog = EXAMPLE
    c.add_argument("--prune", default=None, metavar="SIZE",
                   help="remove the least recently used kernels (a .so with its .c) until the kernel cache holds at "
                        "most SIZE, e.g. 500M or 2G")
    c.add_argument("--older-than", default=None, metavar="DAYS",
                   help="remove the kernels not used (built or served from the cache) for DAYS days")
    c.add_argument("--clear", action="store_true",
                   help="remove every kernel not used in the last 10 minutes (a running tuner's stay), JAX's "
                        "compilation cache and the GPU-simulation caches")
    c.add_argument("--dry-run", action="store_true", help="say what --prune / --older-than / --clear would remove, "
                                                          "removing nothing")


def run(args: argparse.Namespace, user_error: type[Exception]) -> int:
    """Run ``felixjax cache``; bad input raises ``user_error`` (one line, exit code 2)."""
    import importlib

    cb = importlib.import_module("codegen.build")  # the module (`codegen.build` the name is the function)

    kernels = cb.default_cache_dir()
    if kernels.exists() and not kernels.is_dir():  # it said "0B in 0 files"
        raise user_error(f"the build cache {kernels} is a file, not a folder: set FELIXJAX_CACHE to a folder")
    max_bytes = older_s = None
    if args.prune is not None:
        try:
            max_bytes = parse_size(args.prune)
        except ValueError as e:
            raise user_error(f"--prune {e}") from None
    if args.older_than is not None:
        try:
            days = float(args.older_than)
        except ValueError:
            days = math.nan
        if not (days >= 0 and math.isfinite(days)):
            raise user_error(f"--older-than takes a number of days >= 0, such as 30 (got {args.older_than!r})")
        older_s = days * 86400
    if args.clear and (max_bytes is not None or older_s is not None):
        raise user_error("--clear removes everything: give it without --prune / --older-than")
    if args.dry_run and not (args.clear or max_bytes is not None or older_s is not None):
        raise user_error("--dry-run goes with --prune SIZE, --older-than DAYS or --clear")
    if args.clear:
        return _clear(cb, args.dry_run)
    if max_bytes is None and older_s is None:
        return _show(cb)
    verb = "would remove" if args.dry_run else "removed"
    before = cb.cache_stats()
    n, freed = cb.prune_cache(max_bytes=max_bytes, older_than_s=older_s, dry_run=args.dry_run)
    ours = before.bytes - before.other_bytes  # what --prune counts: kernels and builds' temporary files
    print(f"kernel cache {before.path}: {verb} {_n(n, 'file')} ({human(freed)}); {human(ours)} -> "
          f"{human(ours - freed)}" + (f" (and {human(before.other_bytes)} of files felixjax did not write, neither "
                                      f"counted nor removed)" if before.other_bytes else ""))
    if max_bytes is not None and ours - freed > max_bytes:
        live = f" and {_n(before.live_tmp, 'file')} of builds running now" if before.live_tmp else ""
        print(f"  still over {human(max_bytes)}: kept {_n(before.recent, 'kernel')} used in the last "
              f"{cb.KEEP_RECENT_S / 60:.0f} min (a running tuner may load them){live}")
    elif older_s is not None and older_s < cb.KEEP_RECENT_S and before.recent:  # (--older-than 0 removed none)
        print(f"  kept {_n(before.recent, 'kernel')} used in the last {cb.KEEP_RECENT_S / 60:.0f} min (a running "
              "tuner may load them)")
    return 0


def _root() -> str:
    from codegen.build import cache_root

    return str(cache_root())


def _files(folder: str) -> list[os.DirEntry]:
    try:
        return [e for e in os.scandir(folder) if e.is_file(follow_symlinks=False)]
    except OSError:
        return []


def _sizes(entries: list[os.DirEntry]) -> tuple[int, list[float]]:
    total, times = 0, []
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        total += st.st_size
        times.append(st.st_mtime)
    return total, times


def _show(cb) -> int:
    from . import jaxcache

    s = cb.cache_stats()
    where = "$FELIXJAX_CACHE" if os.environ.get("FELIXJAX_CACHE") else "FELIXJAX_CACHE unset: the default"
    print(f"kernel cache: {s.path} ({where})")
    used = f"; last used {_age(s.newest)} ago (newest) to {_age(s.oldest)} ago (oldest)" if s.kernels else ""
    print(f"  {human(s.bytes)} in {_n(s.files, 'file')}, {_n(s.kernels, 'kernel')}{used}"
          + (f"; {_n(s.live_tmp, 'file')} of builds running now" if s.live_tmp else ""))
    total = s.bytes
    jax_dir = jaxcache.cache_dir()
    if jax_dir is None:
        print("JAX cache: off (FELIXJAX_JAX_CACHE=0)")
    else:
        size, times = _sizes(jaxcache.cache_files(jax_dir))
        total += size
        src = " ($FELIXJAX_JAX_CACHE)" if os.environ.get("FELIXJAX_JAX_CACHE") else ""
        print(f"JAX cache: {jax_dir}{src}")
        written = f"; written {_age(max(times))} ago (newest) to {_age(min(times))} ago (oldest)" if times else ""
        print(f"  {human(size)} in {_n(len(times), 'file')}{written}")
    gpu = [os.path.join(_root(), d) for d in _GPU_SUBDIRS if os.path.isdir(os.path.join(_root(), d))]
    if gpu:
        size, times = _sizes([e for d in gpu for e in _files(d)])
        total += size
        print(f"GPU-simulation caches: {', '.join(gpu)}")
        print(f"  {human(size)} in {_n(len(times), 'file')}")
    print(f"total: {human(total)}. `felixjax cache --prune 2G` removes the least recently used kernels down to 2G; "
          "--help for more")
    return 0


def _clear(cb, dry_run: bool) -> int:
    from . import jaxcache

    verb = "would remove" if dry_run else "removed"
    n, freed = cb.prune_cache(max_bytes=0, dry_run=dry_run)
    s = cb.cache_stats()
    kept = f"; kept {_n(s.recent, 'kernel')} used in the last {cb.KEEP_RECENT_S / 60:.0f} min" if s.recent else ""
    print(f"kernel cache {s.path}: {verb} {_n(n, 'file')}, {human(freed)}{kept}")
    total = freed
    jax_dir = jaxcache.cache_dir()
    if jax_dir is not None:
        # JAX reads a missing entry as a miss and compiles again: nothing here is kept back
        n, freed = _remove(jaxcache.cache_files(jax_dir), dry_run, keep_after=None)
        print(f"JAX cache {jax_dir}: {verb} {_n(n, 'file')}, {human(freed)}")
        total += freed
    # the GPU simulators run what they find at once: files written in the last minutes stay, as kernels do
    cutoff = time.time() - cb.KEEP_RECENT_S
    for d in _GPU_SUBDIRS:
        folder = os.path.join(_root(), d)
        if os.path.isdir(folder):
            entries = [e for e in _files(folder) if not e.name.endswith(".tmp")]
            n, freed = _remove(entries, dry_run, keep_after=cutoff)
            print(f"GPU-simulation cache {folder}: {verb} {_n(n, 'file')}, {human(freed)}")
            total += freed
    print(f"{'would free' if dry_run else 'freed'} {human(total)} in all")
    return 0


def _remove(entries: list[os.DirEntry], dry_run: bool, *, keep_after: float | None) -> tuple[int, int]:
    n = freed = 0
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
            if keep_after is not None and st.st_mtime > keep_after:
                continue
            if not dry_run:
                os.unlink(e.path)
        except OSError:
            continue
        n, freed = n + 1, freed + st.st_size
    return n, freed
