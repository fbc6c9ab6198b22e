"""What did chunked builds do to each arm's clock? Two measured ablations of the same arms, ops and seeds, one
per ``--build-chunk``, read side by side (``benchmarks/ablation.py --measured --own`` writes them; nothing is
measured here).

A run's first round proposes the same candidates in both files (nothing measured informs it yet), so the
seconds at which its k-th result arrived compare the two ways of building directly. Later rounds diverge (each
run times its own candidates), so reaching 95% is judged against one bar per op: 95% of the best latency any
run of either file found. Per arm: median seconds at which results 1, 8 and 32 arrived, and the geomean over
ops of the median seconds to that bar (runs that never reach it enter at the seconds they spent), per file,
with their ratio.

    python benchmarks/chunk_effect.py --a results/own_s64/dwg_chunk8/cmp.csv --b results/own_s64/dwg_all/cmp.csv
"""
from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.ratio_intervals import read_rows
from felixjax.compare import REACH

MARKS = (1, 8, 32)


def tuning_runs(path: Path) -> dict[tuple[str, str, str], list[tuple[int, float, float]]]:
    """``{(task, strategy, seed): [(trial, elapsed_s, latency_s)] in trial order}`` of a per-trial CSV."""
    runs: dict = defaultdict(list)
    for r in read_rows(path):
        if r["phase"] == "tune" and not r["strategy"].startswith("reference:"):
            lat = float(r["latency_s"]) if r["latency_s"] else math.inf
            runs[(r["task"], r["strategy"], r["seed"])].append((int(r["trial"]), float(r["elapsed_s"] or 0), lat))
    return {k: sorted(v) for k, v in runs.items()}


def seconds_to(recs: list, bar: float) -> float:
    """Seconds at which a run first measured a latency at or under ``bar`` (else the seconds it spent)."""
    return next((t for _, t, lat in recs if lat <= bar), recs[-1][1])


def compare_files(a: dict, b: dict) -> dict[str, dict]:
    """Per strategy: arrival seconds of results ``MARKS`` and geomean seconds to one 95% bar per op, both files."""
    best: dict = defaultdict(lambda: math.inf)
    for runs in (a, b):
        for (task, _, _), recs in runs.items():
            best[task] = min([best[task]] + [lat for _, _, lat in recs])
    out = {}
    for s in sorted({k[1] for k in a} & {k[1] for k in b}):
        row: dict = {}
        for tag, runs in (("a", a), ("b", b)):
            mine = {k: v for k, v in runs.items() if k[1] == s}
            for m in MARKS:
                row[f"{tag}_result{m}"] = float(np.median([v[m - 1][1] for v in mine.values() if len(v) >= m]))
            per_op = defaultdict(list)
            for (task, _, _), recs in mine.items():
                per_op[task].append(seconds_to(recs, best[task] / REACH))
            row[f"{tag}_to95"] = math.exp(np.mean([math.log(np.median(v)) for v in per_op.values()]))
        row["ratio"] = row["b_to95"] / row["a_to95"]
        out[s] = row
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="per-trial CSV of one way (e.g. chunked builds)")
    ap.add_argument("--b", type=Path, required=True, help="per-trial CSV of the other (e.g. the whole batch first)")
    args = ap.parse_args(argv)
    rows = compare_files(tuning_runs(args.a), tuning_runs(args.b))
    print(f"a = {args.a}, b = {args.b}; seconds since each run began (median over runs; 95%: of the best of both)\n")
    print("| arm | " + " | ".join(f"result {m}: a / b" for m in MARKS) + " | to 95%, a | to 95%, b | b / a |")
    print("| --- | " + " | ".join("---:" for _ in MARKS) + " | ---: | ---: | ---: |")
    for s, r in rows.items():
        print(f"| {s} | " + " | ".join(f"{r[f'a_result{m}']:.2f} / {r[f'b_result{m}']:.2f}" for m in MARKS)
              + f" | {r['a_to95']:.2f} | {r['b_to95']:.2f} | {r['ratio']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
