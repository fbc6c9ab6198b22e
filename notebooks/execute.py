"""Execute notebooks in place, keeping their outputs (plots visible on the repository page).

The generators (``make_NN.py``) write sources only; after regenerating a notebook, run this so the
committed file carries the outputs of a real run on this machine. CI executes every notebook again
(tests/test_notebooks.py) and compares sources, not outputs, with the generators.

Usage:
    python notebooks/execute.py                 # every notebooks/*.ipynb
    python notebooks/execute.py 01 04           # notebooks whose names start with these prefixes
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import nbclient
import nbformat

ROOT = Path(__file__).resolve().parent.parent


def execute(path: Path, *, timeout: int = 900) -> float:
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}}).execute()
    nbformat.write(nb, path)
    return time.perf_counter() - t0


def main(argv: list[str]) -> int:
    paths = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if argv:
        paths = [p for p in paths if any(p.name.startswith(a) for a in argv)]
    for p in paths:
        print(f"{p.name}: executed in {execute(p):.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
