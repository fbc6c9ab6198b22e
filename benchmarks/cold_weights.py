"""Cold-weight tuning A/B (issue 14): does timing kernels with flushed caches while tuning a network whose
weights exceed the last-level cache give a faster network than the usual warm timing?

A network whose weights outgrow the L3 (ResNet-18: 44 MB of float32 weights against a 32 MB L3 here)
reads every layer's weights from DRAM on every inference, while ``fj.tune_model`` times each kernel
alone, called back to back, its weights warm in cache (session 8, ``benchmarks/network_gap.py``: the
512-channel 4x4 convs of ResNet-18 ran 1.4-1.7x their isolated time in the network at 2 threads, their
Winograd-transformed weights 16.8 MB). This script tunes the same model twice with the same strategy,
seed and budget into two fresh databases:

* ``warm``: the networks benchmark's protocol (``TimingProtocol(warmup=0, min_repeat_ms=10, repeats=3)``);
* ``cold``: every timed call after a cache flush (``flush_cache=True``, a 64 MiB buffer written before
  each of 5 single-call repeats, ``min_repeat_ms=0``),

builds both, checks both against onnxruntime and times warm build, cold build and onnxruntime (at its
default session options) interleaved, whole network per block.

    python benchmarks/cold_weights.py --model resnet18 --threads 2 --trials-per-task 16
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout: `benchmarks` and `felixjax` importable
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import felixjax as fj  # noqa: E402
from codegen.measure import LocalRunner, TimingProtocol  # noqa: E402
from codegen.target import Target  # noqa: E402
from felixjax.network import time_interleaved, tune_model  # noqa: E402
from benchmarks.networks import checked_blocks  # noqa: E402

WARM = TimingProtocol(warmup=0, min_repeat_ms=10, repeats=3)
COLD = TimingProtocol(warmup=0, min_repeat_ms=0, repeats=5, flush_cache=True, flush_bytes=64 << 20)


def _log(msg: str) -> None:
    print(f"[cold_weights] {msg}", file=sys.stderr, flush=True)


def weight_bytes(proto) -> int:
    """Bytes of the model's initializers (its weights)."""
    from onnx import numpy_helper

    return sum(numpy_helper.to_array(t).nbytes for t in proto.graph.initializer)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--dataset", default="cifar10")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trials-per-task", type=int, default=16)
    ap.add_argument("--strategy", default="gradient")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    target = Target.cpu()
    proto = fj.zoo.make_model(args.model, dataset=args.dataset, seed=0)
    model = fj.load_onnx(proto)
    budget = args.trials_per_task * len(model.tasks)
    _log(f"{args.model} ({args.dataset}): {len(model.tasks)} tasks, weights {weight_bytes(proto) / 2**20:.1f} MiB, "
         f"{budget} trials per arm, {args.threads} thread(s)")
    builds, tune_s = {}, {}
    with tempfile.TemporaryDirectory(prefix="felixjax-cold-") as tmp:
        for arm, protocol in (("warm", WARM), ("cold", COLD)):
            t0 = time.perf_counter()
            with LocalRunner(protocol=protocol) as runner:
                res = tune_model(model, target, trials=budget, db=os.path.join(tmp, f"{arm}.db"),
                                 strategy=args.strategy, seed=args.seed, threads=args.threads, runner=runner,
                                 protocol=protocol, progress=False)
            tune_s[arm] = time.perf_counter() - t0
            _log(f"{arm}: tuned in {tune_s[arm]:.0f} s\n{res.table()}")
            builds[arm] = res.build(threads=args.threads)
    x = np.random.default_rng(args.seed).standard_normal(model.input_shapes[model.input_names[0]]).astype(np.float32)
    blocks, _ = checked_blocks(proto, {f"{arm}-tuned build": exe for arm, exe in builds.items()}, x, args.threads,
                               args.model)
    times = time_interleaved(blocks, rounds=args.rounds, min_time_s=args.min_time)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    low = {k: min(v) * 1e3 for k, v in times.items()}
    print(f"{args.model} ({args.dataset}), {args.threads} thread(s), {args.trials_per_task} trials per task "
          f"({args.strategy}), load {os.getloadavg()[0]:.1f}; median (min) ms of {args.rounds} interleaved rounds")
    print("| contender | ms | onnxruntime / it | tuning wall |")
    print("| --- | ---: | ---: | ---: |")
    for k in blocks:
        arm = k.split("-")[0]
        wall = f"{tune_s[arm] / 60:.1f} min" if arm in tune_s else ""
        print(f"| {k} | {med[k]:.3f} ({low[k]:.3f}) | {med['onnxruntime'] / med[k]:.2f}x | {wall} |")
    for arm, exe in builds.items():
        sketches = [f"{s.task.name}: {s.config.sketch}" for s in getattr(exe, "schedules", [])]
        if sketches:
            _log(f"{arm} schedules:\n  " + "\n  ".join(sketches))
    return 0


if __name__ == "__main__":
    sys.exit(main())
