"""`felixjax cache` and `codegen.build.prune_cache`: listing, LRU pruning, safety beside running tuners."""
from __future__ import annotations

import ctypes
import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from felixjax.cache_cli import parse_size
from felixjax.cli import main

cb = importlib.import_module("codegen.build")  # the module: `codegen.build` the attribute is the function
DAY = 86400.0


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    d.mkdir()
    monkeypatch.setenv("FELIXJAX_CACHE", str(d))
    monkeypatch.delenv("FELIXJAX_JAX_CACHE", raising=False)
    return d


def _age(path: Path, days: float) -> None:
    t = time.time() - days * DAY
    os.utime(path, (t, t))


def kernel(cache: Path, c: str, *, days: float, so: int = 9000, src: int = 1000, extra: tuple[str, ...] = ()
           ) -> list[Path]:
    """A fake cache entry `<key>.so` + `<key>.c` (+ sidecars) last used `days` ago."""
    key = c * 64
    files = [cache / f"{key}.so", cache / f"{key}.c", *(cache / f"{key}.{x}" for x in extra)]
    for f, n in zip(files, (so, src) + (10,) * len(extra)):
        f.write_bytes(b"x" * n)
        _age(f, days)
    return files


def names(cache: Path) -> set[str]:
    return {p.name for p in cache.iterdir() if p.is_file()}


def test_listing_shows_where_and_how_big(cache, capsys):
    kernel(cache, "a", days=3)
    kernel(cache, "b", days=1)
    (cache / "jax").mkdir()
    (cache / "jax" / "jit_f-0123-cache").write_bytes(b"j" * 5000)
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert f"kernel cache: {cache} ($FELIXJAX_CACHE)" in out
    assert "20K in 4 files, 2 kernels" in out  # the JAX subfolder is not counted as kernels
    assert "to 3 d ago (oldest)" in out and "1 d ago (newest)" not in out
    assert f"JAX cache: {cache / 'jax'}" in out and "4.9K in 1 file" in out


def test_default_locations(monkeypatch, tmp_path):
    from felixjax import jaxcache

    monkeypatch.delenv("FELIXJAX_CACHE", raising=False)
    monkeypatch.delenv("FELIXJAX_JAX_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cb.default_cache_dir() == tmp_path / ".cache" / "felixjax" / "build"
    assert jaxcache.cache_dir() == str(tmp_path / ".cache" / "felixjax" / "jax")
    monkeypatch.setenv("FELIXJAX_CACHE", "/x")
    assert (str(cb.default_cache_dir()), jaxcache.cache_dir()) == ("/x", "/x/jax")
    monkeypatch.setenv("FELIXJAX_JAX_CACHE", "0")
    assert jaxcache.cache_dir() is None


def test_prune_by_size_keeps_the_most_recently_used(cache):
    kernel(cache, "a", days=3)
    mid, new = kernel(cache, "b", days=2), kernel(cache, "c", days=1)
    assert cb.prune_cache(max_bytes=25_000) == (2, 10_000)  # 30 KB -> 20 KB: the least recently used pair goes
    assert names(cache) == {p.name for p in mid + new}
    assert cb.prune_cache(max_bytes=25_000) == (0, 0)


def test_cli_prune_and_older_than(cache, capsys):
    kernel(cache, "a", days=40)
    kernel(cache, "b", days=20)
    keep = kernel(cache, "c", days=1)
    assert main(["cache", "--older-than", "30"]) == 0
    assert "removed 2 files (9.8K)" in capsys.readouterr().out
    assert main(["cache", "--prune", "10K"]) == 0
    assert "removed 2 files (9.8K); 20K -> 9.8K" in capsys.readouterr().out
    assert names(cache) == {p.name for p in keep}


def test_a_cache_hit_marks_the_library_used(cache):
    """LRU by mtime is meaningful only if a hit refreshes it (atime is unreliable under relatime)."""
    r = cb.build("int lru_hit(void) { return 7; }")
    lib = Path(r.lib_path)
    for f in (lib, lib.with_suffix(".c")):
        _age(f, 5)
    other = kernel(cache, "b", days=1)
    assert cb.build("int lru_hit(void) { return 7; }").cached
    assert time.time() - lib.stat().st_mtime < 60
    cb.prune_cache(max_bytes=lib.stat().st_size + lib.with_suffix(".c").stat().st_size, keep_recent_s=0)
    assert lib.exists() and not any(p.exists() for p in other)


def test_a_kernel_goes_with_its_source_and_only_our_files_go(cache, capsys):
    # a session-77 code review: any `<sha256>.*` file went (a user's `<sha256>.json`), and files felixjax did
    # not write counted toward --prune's size, so a big one of the user's removed every kernel
    files = kernel(cache, "a", days=9, extra=("json", "ptx"))
    keep = kernel(cache, "b", days=1)
    (cache / "notes.txt").write_text("not ours")
    (cache / "big.bin").write_bytes(b"x" * 50_000)
    for p in ("notes.txt", "big.bin"):
        _age(cache / p, 100)
    assert cb.prune_cache(older_than_s=5 * DAY) == (2, 10_000)
    assert not any(p.exists() for p in files[:2]) and all(p.exists() for p in files[2:])
    assert names(cache) == {p.name for p in keep + files[2:]} | {"notes.txt", "big.bin"}
    assert cb.prune_cache(max_bytes=20_000) == (0, 0)  # b's 10 KB is under 20 KB: big.bin is not ours
    assert main(["cache", "--prune", "20K"]) == 0
    out = capsys.readouterr().out
    assert "files felixjax did not write, neither counted nor removed" in out and "still over" not in out


def test_live_builds_and_recent_kernels_are_kept(cache):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    done = subprocess.Popen(["true"])
    done.wait()
    try:
        live = cache / f".tmp-{sleeper.pid}-0123456789abcdef-x.c"
        dead = cache / f".tmp-{done.pid}-0123456789abcdef-y.c"
        for f in (live, dead):
            f.write_text("int x;")
            _age(f, 3)
        recent = kernel(cache, "a", days=0)
        old = kernel(cache, "b", days=30)
        assert cb.prune_cache(max_bytes=0) == (3, 10_006)  # the dead build's file and the old kernel
        assert live.exists() and not dead.exists()
        assert all(p.exists() for p in recent) and not any(p.exists() for p in old)
        assert cb.prune_cache(max_bytes=0, keep_recent_s=0) == (2, 10_000)
        assert live.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_library_served_while_pruning_is_put_back(cache, monkeypatch):
    """A build that hits a library after the pruner chose it (and touches it) keeps it: renamed aside, looked at
    again, put back."""
    files = kernel(cache, "a", days=30)
    scan = cb._scan

    def scan_then_hit(folder):
        found = scan(folder)
        os.utime(files[0])  # what `build` does on a hit, between the scan and the removal
        return found

    monkeypatch.setattr(cb, "_scan", scan_then_hit)
    assert cb.prune_cache(max_bytes=0) == (0, 0)
    assert all(p.exists() for p in files)
    assert names(cache) == {p.name for p in files}  # nothing left aside


@pytest.mark.parametrize("vanish_in", ["utime", "elf_intact"])
def test_an_entry_vanishing_between_hit_and_load_is_rebuilt(cache, monkeypatch, vanish_in):
    src = "int vanish(void) { return 42; }"
    lib = Path(cb.build(src).lib_path)
    real = cb.os.utime if vanish_in == "utime" else cb.elf_intact
    calls = []

    def pruned_first(path, *a, **k):
        if Path(path) == lib and not calls:
            calls.append(path)
            lib.unlink()  # another process's `felixjax cache --clear` got there first
        return real(path, *a, **k)

    if vanish_in == "utime":
        monkeypatch.setattr(cb.os, "utime", pruned_first)
    else:
        monkeypatch.setattr(cb, "elf_intact", pruned_first)
    r = cb.build(src)
    assert calls and r.status == "ok" and not r.cached and r.lib_path == str(lib)
    assert ctypes.CDLL(r.lib_path).vanish() == 42


def test_clear_removes_kernels_and_jax_cache(cache, capsys):
    kernel(cache, "a", days=2)
    kernel(cache, "b", days=3)
    jax = cache / "jax"
    jax.mkdir()
    for name in ("k1-cache", "k1-atime", "k2-cache"):
        (jax / name).write_bytes(b"j" * 1024)
    (jax / "README").write_text("not JAX's")
    assert main(["cache", "--clear"]) == 0
    out = capsys.readouterr().out
    assert f"kernel cache {cache}: removed 4 files, 20K" in out
    assert f"JAX cache {jax}: removed 3 files, 3.0K" in out
    assert "freed 23K in all" in out
    assert names(cache) == set() and {p.name for p in jax.iterdir()} == {"README"}


def test_dry_run_removes_nothing(cache, capsys):
    kernel(cache, "a", days=2)
    kernel(cache, "b", days=3)
    (cache / "jax").mkdir()
    (cache / "jax" / "k-cache").write_bytes(b"j")
    before = names(cache)
    assert main(["cache", "--prune", "0", "--dry-run"]) == 0
    assert "would remove 4 files (20K)" in capsys.readouterr().out
    assert main(["cache", "--older-than", "1", "--dry-run"]) == 0
    assert main(["cache", "--clear", "--dry-run"]) == 0
    assert "would free 20K in all" in capsys.readouterr().out
    assert names(cache) == before and (cache / "jax" / "k-cache").exists()


@pytest.mark.parametrize("argv, message", [
    (["--prune", "2X"], "--prune '2X' is not a size"),
    (["--prune=-1G"], "--prune '-1G' is not a size"),
    (["--prune", "G"], "--prune 'G' is not a size"),
    (["--prune", ""], "--prune '' is not a size"),
    (["--older-than", "abc"], "--older-than takes a number of days"),
    (["--older-than", "-2"], "--older-than takes a number of days"),
    (["--clear", "--prune", "1G"], "--clear removes everything"),
    (["--dry-run"], "--dry-run goes with"),
])
def test_bad_input_is_one_line(cache, capsys, argv, message):
    kernel(cache, "a", days=100)
    assert main(["cache", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"felixjax cache: error: {message}") and err.count("\n") == 1
    assert len(names(cache)) == 2


def test_parse_size():
    assert parse_size("2G") == 2 << 30 and parse_size("500m") == 500 << 20 and parse_size("1.5K") == 1536
    assert parse_size("3MiB") == parse_size("3MB") == 3 << 20 and parse_size("100") == 100
    with pytest.raises(ValueError):
        parse_size("2 gigs")


def test_a_cache_hit_does_not_reload_the_library_in_the_measuring_process(cache):
    # session 77 (a code review): a hit now sets the library's mtime (LRU for pruning), and the measuring
    # process keyed its loaded libraries on the mtime: every re-timing of a cached kernel unloaded and
    # reloaded it. The key is the file (path, inode, size): a rebuild is a new file, a hit is not
    from codegen.measure import TIMING_HARNESS_C
    from codegen.measure_child import _LibCache

    src = "void fj_kernel(float* const* b) { b[0][0] = 1.0f; }\n" + TIMING_HARNESS_C
    first = cb.build(src)
    libs = _LibCache(4)
    loaded = libs.get(first.lib_path)
    time.sleep(0.01)
    again = cb.build(src)
    assert again.cached and again.lib_path == first.lib_path
    assert libs.get(again.lib_path) is loaded  # not reloaded
    os.unlink(first.lib_path)  # pruned meanwhile: the next build is a new file, loaded afresh
    rebuilt = cb.build(src)
    assert not rebuilt.cached and libs.get(rebuilt.lib_path) is not loaded


def test_a_cache_path_naming_a_file_is_one_clear_error(tmp_path, monkeypatch, capsys):
    """Session 82, a review: ``felixjax cache`` reported '0B in 0 files' (exit 0) for FELIXJAX_CACHE naming a
    file, and a tune failed with only '[Errno 17] File exists'."""
    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("FELIXJAX_CACHE", str(afile))
    for argv in (["cache"], ["tune", "--op", "matmul:m=8,n=8,k=8", "--trials", "1", "--strategy", "random",
                             "--no-compare", "--db", str(tmp_path / "t.db")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and ("is a file, not a folder" in err or "a file is there" in err), err
    assert afile.read_text() == ""


def test_older_than_zero_says_which_recent_kernels_it_kept(cache, capsys):
    """Session 82, a review: ``--older-than 0`` over kernels used in the last 10 minutes said 'would remove 0
    files' and nothing of the rule that kept them (``--prune`` says it)."""
    kernel(cache, "a", days=0)
    assert main(["cache", "--older-than", "0", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would remove 0 files" in out and "kept 1 kernel used in the last 10 min" in out
