"""What did chunked builds do to each arm's clock? Two measured ablations of the same arms, ops and seeds, one
per ``--build-chunk``, read side by side (``benchmarks/ablation.py --measured --own`` writes them; nothing is
measured here).

A run's first round proposes the same candidates in both files (nothing measured informs it yet), so the
seconds at which its k-th result arrived compare the two ways of building directly. Later rounds diverge (each
run times its own candidates), so reaching 95% is judged against one bar per op: 95% of the best latency any
run of either file found. Per arm: median seconds at which results 1, 8 and 32 arrived, and the geomean over
ops of the median seconds to that bar (runs that never reach it enter at the seconds they spent), per file,
with their ratio; then each round's clock per file: seconds from one round's last result to the next round's
first (the search's own time and the first chunk), and on to its last.

    python benchmarks/chunk_effect.py --a results/own_s64/dwg_chunk8/cmp.csv --b results/own_s64/dwg_all/cmp.csv

Any two such runs read the same way: session 65 compared the runs of two commits (a search made cheaper without
changing its picks) with ``--marks 1,32,64,96,128``, the results at which each round ends.
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


def compare_files(a: dict, b: dict, marks: tuple[int, ...] = MARKS) -> dict[str, dict]:
    """Per strategy: arrival seconds of results ``marks`` and geomean seconds to one 95% bar per op, both files."""
    best: dict = defaultdict(lambda: math.inf)
    for runs in (a, b):
        for (task, _, _), recs in runs.items():
            best[task] = min([best[task]] + [lat for _, _, lat in recs])
    out = {}
    for s in sorted({k[1] for k in a} & {k[1] for k in b}):
        row: dict = {}
        for tag, runs in (("a", a), ("b", b)):
            mine = {k: v for k, v in runs.items() if k[1] == s}
            for m in marks:
                row[f"{tag}_result{m}"] = float(np.median([v[m - 1][1] for v in mine.values() if len(v) >= m]))
            per_op = defaultdict(list)
            for (task, _, _), recs in mine.items():
                per_op[task].append(seconds_to(recs, best[task] / REACH))
            row[f"{tag}_to95"] = math.exp(np.mean([math.log(np.median(v)) for v in per_op.values()]))
        row["ratio"] = row["b_to95"] / row["a_to95"]
        out[s] = row
    return out


def round_clock(runs: dict, batch: int = 32) -> dict[str, tuple[float, float]]:
    """Per strategy, means over runs and rounds: seconds from a round's last result to the next round's first
    (the model's update, the search's propose and the first chunk's builds; from the run's start for the first
    round), and from a round's first result to its last (the rest of its builds and timings)."""
    gaps: dict = defaultdict(lambda: ([], []))
    for (_, s, _), recs in runs.items():
        t = [e for _, e, _ in recs]
        for r in range(len(t) // batch):
            lo = r * batch
            gaps[s][0].append(t[lo] - (t[lo - 1] if r else 0.0))
            gaps[s][1].append(t[lo + batch - 1] - t[lo])
    return {s: (float(np.mean(a)), float(np.mean(b))) for s, (a, b) in sorted(gaps.items())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="per-trial CSV of one way (e.g. chunked builds)")
    ap.add_argument("--b", type=Path, required=True, help="per-trial CSV of the other (e.g. the whole batch first)")
    ap.add_argument("--marks", default=",".join(map(str, MARKS)),
                    help="the results whose arrival is reported, comma-separated (default 1,8,32)")
    ap.add_argument("--batch", type=int, default=32, help="candidates per round of the runs (default 32)")
    args = ap.parse_args(argv)
    marks = tuple(int(m) for m in args.marks.split(","))
    rows = compare_files(tuning_runs(args.a), tuning_runs(args.b), marks)
    print(f"a = {args.a}, b = {args.b}; seconds since each run began (median over runs; 95%: of the best of both)\n")
    print("| arm | " + " | ".join(f"result {m}: a / b" for m in marks) + " | to 95%, a | to 95%, b | b / a |")
    print("| --- | " + " | ".join("---:" for _ in marks) + " | ---: | ---: | ---: |")
    for s, r in rows.items():
        print(f"| {s} | " + " | ".join(f"{r[f'a_result{m}']:.2f} / {r[f'b_result{m}']:.2f}" for m in marks)
              + f" | {r['a_to95']:.2f} | {r['b_to95']:.2f} | {r['ratio']:.2f} |")
    clocks = {tag: round_clock(tuning_runs(path), args.batch) for tag, path in (("a", args.a), ("b", args.b))}
    print(f"\nEach round's clock ({args.batch} per round; means over runs and rounds, seconds): to its first result from the"
          " last of the round before (update, propose, first chunk), then to its last\n")
    print("| arm | to the first result, a / b | rest of the round, a / b |")
    print("| --- | ---: | ---: |")
    for s in sorted(set(clocks["a"]) & set(clocks["b"])):
        (fa, ra), (fb, rb) = clocks["a"][s], clocks["b"][s]
        print(f"| {s} | {fa:.2f} / {fb:.2f} | {ra:.2f} / {rb:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
