"""Where a built network's time goes beyond its kernels (issue 14: the 2-thread ResNet-18 miss).

For a zoo model and a tuning database, build the network from the database's best records and compare,
layer by layer:

* ``isolated``: the layer's kernel timed alone by the measuring protocol (``fj.Measurer``: its inputs and
  weights warm in cache, the same protocol as while tuning), re-timed here, not read from the database;
* ``in network``: the same step timed inside one run of the whole library (``CompiledModel.profile``:
  every step timed in C, so the C build's own steps — pads, adds, pools, copies — show up too);
* the whole library (``library.timeit``) and onnxruntime at its defaults, interleaved.

A layer whose in-network time is well above its isolated time is paying for cold caches (its weights
or inputs evicted by the layers before it: ResNet-18's 11 M float32 weights are 44 MB) or for thread
start-up; the sum of the non-anchor steps is the overhead of the rest of the build.

``--ort-profile``: onnxruntime's own per-node times inside its network (its profiler, at its default
session options and the same threads; a second session, not the one timed against ours), listed next to
ours for the convolutions in graph order (both runtimes fuse a conv's bias, activation and residual add
into the conv node, so the k-th conv of each is the same layer), and summed by op type.

Usage:
    python benchmarks/network_gap.py --model resnet18 --db results/net_s7_t2.db --threads 2 [--ort-profile]
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
try:
    import felixjax  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import felixjax as fj  # noqa: E402
from codegen.measure import LocalRunner, TimingProtocol  # noqa: E402
from codegen.target import Target  # noqa: E402
from felixjax.measurer import Measurer  # noqa: E402
from felixjax.network import build_model  # noqa: E402
from felixjax.ort_compare import compare_onnxruntime  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--dataset", default="cifar10")
    ap.add_argument("--db", required=True, help="tuning database whose best records the build uses")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--number", type=int, default=50, help="network runs averaged by the per-step profile")
    ap.add_argument("--layout", choices=("nchw", "nchwc"), default="nchw", help="the convolutions' layout (felixjax.layout)")
    ap.add_argument("--ort-profile", action="store_true", help="onnxruntime's per-node times next to ours")
    args = ap.parse_args(argv)

    target = Target.cpu()
    proto = fj.zoo.make_model(args.model, dataset=args.dataset, seed=0)
    model = fj.load_onnx(proto, layout=args.layout)
    exe = build_model(model, target, db=args.db, threads=args.threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(model.input_shapes[model.input_names[0]]).astype(np.float32)

    # isolated kernels, re-timed by the measuring process (output checked against the reference)
    by_task = {s.task: s for s in exe.schedules}
    iso: dict = {}
    with LocalRunner(protocol=TimingProtocol()) as runner:
        for task in by_task:
            cfg = by_task[task].config
            got: list = []
            Measurer(task, target, runner, threads=args.threads).measure([cfg], lambda c, r, got=got: got.append(r) or True)
            iso[task] = got[0].latency_s if got[0].ok else float("nan")

    profiles = [exe.profile(x, number=args.number) for _ in range(3)]
    rows = []
    for k, node in enumerate(model.graph.nodes):
        ms = statistics.median(p[k]["ms"] for p in profiles)
        rows.append((node, ms))

    # the whole library vs onnxruntime at its defaults, interleaved (outputs checked against it first)
    whole = compare_onnxruntime(exe, proto, threads=args.threads, rounds=args.rounds, min_time_s=0.2)
    med = {"ours": whole["felixjax_ms"], "onnxruntime": whole["onnxruntime_ms"]}

    anchor_net = sum(ms for n, ms in rows if n.is_anchor)
    anchor_iso = sum(1e3 * iso[n.task] for n, _ in rows if n.is_anchor)
    other = sum(ms for n, ms in rows if not n.is_anchor)
    print(f"{args.model} ({args.dataset}), {args.threads} thread(s), db {args.db}, {platform.processor() or platform.machine()}")
    print(f"whole network (library.timeit, medians of {args.rounds} interleaved): ours {med['ours']:.3f} ms, "
          f"onnxruntime {med['onnxruntime']:.3f} ms, onnxruntime / ours {med['onnxruntime'] / med['ours']:.2f}x")
    print(f"sum of steps in the per-step profile: {anchor_net + other:.3f} ms = anchors {anchor_net:.3f} ms + "
          f"other steps {other:.3f} ms; the anchors' kernels alone (isolated, warm): {anchor_iso:.3f} ms")
    print()
    print("| layer | task | isolated ms | in network ms | network / isolated |")
    print("| --- | --- | ---: | ---: | ---: |")
    for n, ms in rows:
        if n.is_anchor:
            i = 1e3 * iso[n.task]
            print(f"| {n.name} | {n.task.name} | {i:.4f} | {ms:.4f} | {ms / i:.2f}x |")
    if args.ort_profile:
        _ort_table(proto, x, args.threads, args.number, [(n, ms) for n, ms in rows if n.is_anchor])
    print()
    print("| other step | op | in network ms |")
    print("| --- | --- | ---: |")
    for n, ms in rows:
        if not n.is_anchor and ms > 0.002:
            print(f"| {n.name} | {n.op} | {ms:.4f} |")
    return 0


def ort_node_times(proto, x: np.ndarray, threads: int, number: int) -> list[tuple[str, str, float]]:
    """``(node name, op type, median ms)`` of every node onnxruntime ran, in its execution order: its
    profiler over ``number`` runs (after 5 untimed ones) at its default session options but ``threads``."""
    import json
    import tempfile

    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    so.log_severity_level = 3
    with tempfile.TemporaryDirectory() as tmp:
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "ort")
        sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
        feed = {sess.get_inputs()[0].name: x}
        for _ in range(5 + number):
            sess.run(None, feed)
        events = json.loads(Path(sess.end_profiling()).read_text())
    runs: dict[str, list[float]] = {}
    ops: dict[str, str] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            name = e["name"][: -len("_kernel_time")]
            runs.setdefault(name, []).append(e["dur"] / 1e3)
            ops[name] = e.get("args", {}).get("op_name", "?")
    # the last `number` runs of each node (the untimed warm-up runs are profiled too)
    return [(n, ops[n], statistics.median(v[-number:])) for n, v in runs.items()]


def _ort_table(proto, x, threads: int, number: int, anchors: list) -> None:
    """Print onnxruntime's per-node times next to ours: convolutions in order, then sums by op type."""
    nodes = ort_node_times(proto, x, threads, number)
    convs = [(n, op, ms) for n, op, ms in nodes if "Conv" in op]
    ours = [(n, ms) for n, ms in anchors if n.task.op.startswith("conv")]
    print()
    print(f"onnxruntime per node (its profiler, median of {number} runs; sum {sum(ms for *_, ms in nodes):.3f} ms "
          f"over {len(nodes)} nodes)")
    print()
    print("| # | our task | ours in network ms | onnxruntime node | op | onnxruntime ms | onnxruntime / ours |")
    print("| ---: | --- | ---: | --- | --- | ---: | ---: |")
    for i in range(max(len(convs), len(ours))):
        a = ours[i] if i < len(ours) else None
        b = convs[i] if i < len(convs) else None
        mine = f"{a[1]:.4f}" if a else "-"
        ratio = f"{b[2] / a[1]:.2f}x" if a and b and a[1] > 0 else "-"
        print(f"| {i} | {a[0].task.name if a else '-'} | {mine} | {b[0] if b else '-'} | {b[1] if b else '-'} | "
              f"{f'{b[2]:.4f}' if b else '-'} | {ratio} |")
    by_op: dict[str, float] = {}
    for _, op, ms in nodes:
        by_op[op] = by_op.get(op, 0.0) + ms
    print()
    print("| onnxruntime op | ms |")
    print("| --- | ---: |")
    for op, ms in sorted(by_op.items(), key=lambda kv: -kv[1]):
        print(f"| {op} | {ms:.4f} |")


if __name__ == "__main__":
    raise SystemExit(main())
