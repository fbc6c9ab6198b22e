"""Layer by layer against onnxruntime, inside the network (issue 14): where a built model loses.

For a zoo model, build it from a tuning database in one or more layouts (``nchw``, ``nchwc``:
:mod:`felixjax.layout`) and compare every convolution's time **inside the network** with onnxruntime's own
per-node profile of the same model (``SessionOptions.enable_profiling``: its ``*_kernel_time`` events,
one per node of its optimized graph, whose fused convolutions are matched to ours in order). The
contenders alternate in rounds (onnxruntime runs, then each of our builds' per-step profile,
``CompiledModel.profile``), so the per-layer ratios come from the same minutes of a noisy machine; the
medians over rounds are printed, then sums by kind (the first conv, depthwise, the others).

This is the measurement behind docs/BENCHMARKS.md's per-layer tables; single-op onnxruntime sessions
(``benchmarks/kernels.py``) pay NCHW <-> NCHWc reorders that onnxruntime does not pay inside a network.

Usage:
    python benchmarks/layer_peer.py --model mobilenet_v2 --dataset imagenet --db results/mbv2.db --threads 1
    python benchmarks/layer_peer.py --layouts nchw,nchwc ...   # both builds (tune both into the db first:
                                                               # benchmarks/networks.py --layout both)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import felixjax as fj  # noqa: E402
from codegen.target import Target  # noqa: E402
from felixjax.network import build_model  # noqa: E402


def ort_node_times(proto, x: np.ndarray, threads: int, runs_per_round: int, rounds: int, between) -> list[tuple]:
    """onnxruntime's per-node kernel times (median ms over every profiled run) in graph order, as
    ``(node name, op name, ms)``; ``between(round)`` runs after each round of ``runs_per_round`` runs."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="felixjax-ortprof-") as tmp:
        so = ort.SessionOptions()  # defaults (spinning on), profiling added
        so.intra_op_num_threads = threads
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "ort")
        so.log_severity_level = 3
        sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        for _ in range(3):
            sess.run(None, {name: x})
        for r in range(rounds):
            time.sleep(0.2)
            for _ in range(runs_per_round):
                sess.run(None, {name: x})
            between(r)
        events = json.loads(Path(sess.end_profiling()).read_text())
    nodes: dict[str, tuple[str, list[float]]] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            nodes.setdefault(e["name"][: -len("_kernel_time")], (e["args"].get("op_name", "?"), []))[1].append(
                e["dur"] / 1e3)
    # the 3 warm-up runs are the first events of every node
    return [(k, op, statistics.median(v[3:] or v)) for k, (op, v) in nodes.items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mobilenet_v2", choices=fj.zoo.MODELS)
    ap.add_argument("--dataset", default="imagenet", choices=fj.zoo.DATASETS)
    ap.add_argument("--db", default=None, help="tuning database (default: every task's default schedule)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layouts", default="nchw", help="comma-separated: nchw, nchwc")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--number", type=int, default=20, help="runs per round (ours: per-step profile; onnxruntime)")
    args = ap.parse_args(argv)

    layouts = [s.strip() for s in args.layouts.split(",") if s.strip()]
    target = Target.cpu()
    proto = fj.zoo.make_model(args.model, dataset=args.dataset, seed=0)
    models = {lay: fj.load_onnx(proto, layout=lay) for lay in layouts}
    exes = {lay: build_model(m, target, db=args.db, threads=args.threads) for lay, m in models.items()}
    x = np.random.default_rng(0).standard_normal(next(iter(models.values())).input_shapes["input"]).astype(np.float32)
    profiles: dict[str, list] = {lay: [] for lay in layouts}

    def ours(_round: int) -> None:
        for lay, exe in exes.items():
            time.sleep(0.2)
            profiles[lay].append(exe.profile(x, number=args.number))

    ort_nodes = ort_node_times(proto, x, args.threads, args.number, args.rounds, ours)
    ort_convs = [ms for _, op, ms in ort_nodes if op in ("Conv", "FusedConv")]
    ort_total = sum(ms for *_, ms in ort_nodes)
    convs, per = {}, {}
    for lay, m in models.items():
        idx = [k for k, n in enumerate(m.graph.nodes) if n.is_anchor and n.task.op != "dense"]
        convs[lay] = [m.graph.nodes[k].task for k in idx]
        med = [statistics.median(p[k]["ms"] for p in profiles[lay]) for k in range(len(m.graph.nodes))]
        per[lay] = ([med[k] for k in idx], sum(med))
    names = [t.name for t in convs[layouts[0]]]
    if len(ort_convs) != len(names):
        raise SystemExit(f"onnxruntime profiled {len(ort_convs)} convolutions, the model has {len(names)}")
    print(f"{args.model} ({args.dataset}), {args.threads} thread(s), db {args.db}, {platform.processor() or platform.machine()}; "
          f"medians of {args.rounds} interleaved rounds of {args.number} runs; ms per layer inside the network")
    print()
    print("| layer | onnxruntime | " + " | ".join(f"ours {lay}" for lay in layouts) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in layouts) + " |")
    kinds: dict[str, list[float]] = {}
    for i, nm in enumerate(names):
        kind = "first conv" if i == 0 else ("depthwise" if nm.startswith("dw") else "other convs")
        row = [ort_convs[i]] + [per[lay][0][i] for lay in layouts]
        acc = kinds.setdefault(kind, [0.0] * len(row))
        for j, v in enumerate(row):
            acc[j] += v
        print(f"| {nm} | {ort_convs[i]:.3f} | " + " | ".join(
            f"{v:.3f} ({ort_convs[i] / v:.2f}x)" for v in row[1:]) + " |")
    print()
    print("| kind | onnxruntime | " + " | ".join(f"ours {lay}" for lay in layouts) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in layouts) + " |")
    for kind, row in kinds.items():
        print(f"| {kind} | {row[0]:.3f} | " + " | ".join(f"{v:.3f} ({row[0] / v:.2f}x)" for v in row[1:]) + " |")
    print(f"| whole network (sum of its steps) | {ort_total:.3f} | " + " | ".join(
        f"{per[lay][1]:.3f} ({ort_total / per[lay][1]:.2f}x)" for lay in layouts) + " |")
    print(f"\n(load average {os.getloadavg()[0]:.2f}. Sums of per-step profiles on both sides: each of our steps is "
          "timed alone in C (a clock read around every step, no overlap of one step's tail with the next), each of "
          "onnxruntime's by its profiler; a whole network's own end-to-end time is benchmarks/networks.py's, and "
          "the two tables need not agree.)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
