"""Every ```python block of README.md runs as written: each in a fresh namespace, in an empty temporary
directory as the working directory, under a time limit. A block that cannot run here (it needs a GPU
or a cluster) says so on the line before its fence: ``<!-- not executed: <reason> -->``."""
from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

#: A hang guard, not a speed check: each block prints its time (the whole README runs in about a minute
#: on a quiet 2-core machine; waiting for the other test worker's measuring lock can multiply that).
BLOCK_LIMIT_S = 300.0

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
_SKIP = re.compile(r"^<!--\s*not executed\b.*-->\s*$", re.IGNORECASE)


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """``(first line number, source, reason not executed or None)`` of every ```python block."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        if lang not in ("python", "py", "python3"):
            continue
        prev = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        reason = prev if _SKIP.match(prev) else None
        blocks.append((start + 2, "\n".join(body) + "\n", reason))
    return blocks


BLOCKS = python_blocks(README.read_text())


def test_readme_has_python_blocks():
    assert len([b for b in BLOCKS if b[2] is None]) >= 5
    assert len([b for b in BLOCKS if b[2] is not None]) <= 2, "mark blocks 'not executed' sparingly"


def test_extractor_honours_fences_and_markers():
    text = "\n".join([
        "# t", "```python", "a = 1", "```", "", "```text", "not python", "```",
        "<!-- not executed: needs a GPU -->", "", "```python", "b = 2", "```",
        "````markdown", "```python", "nested = 3", "```", "````", "```py", "c = 3", "```"])
    assert python_blocks(text) == [(3, "a = 1\n", None),
                                   (12, "b = 2\n", "<!-- not executed: needs a GPU -->"),
                                   (20, "c = 3\n", None)]


class _TimeLimit(Exception):
    pass


@pytest.mark.cc
@pytest.mark.parametrize("line,source,reason", BLOCKS, ids=[f"README.md:{b[0]}" for b in BLOCKS])
def test_readme_block_runs(line, source, reason, tmp_path, monkeypatch):
    if reason:
        pytest.skip(reason)
    monkeypatch.chdir(tmp_path)
    code = compile(source, f"README.md:{line}", "exec")  # tracebacks name the README line

    def timeout(signum, frame):
        raise _TimeLimit(f"README.md block at line {line} took more than {BLOCK_LIMIT_S:g} s")

    old = signal.signal(signal.SIGALRM, timeout)
    signal.setitimer(signal.ITIMER_REAL, BLOCK_LIMIT_S)
    t0 = time.perf_counter()
    try:
        exec(code, {"__name__": "__readme__"})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    print(f"README.md:{line}: {time.perf_counter() - t0:.1f} s")
