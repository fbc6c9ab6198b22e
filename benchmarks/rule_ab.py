"""A default-schedule rule on and off inside whole networks (issue 14), onnxruntime beside.

A rule of :mod:`codegen.blocked`'s default schedule is judged kernel by kernel in
``benchmarks/blocked_bcast.py``; this script judges it where it matters, end to end: the zoo model is
built twice from default schedules (no tuning database), once with the rule switched off
(``blocked_bcast.RULES``) and once as the code stands, both checked against onnxruntime, then the two
libraries and onnxruntime at its default session options are timed in interleaved rounds (each timed
block after a pause and two untimed runs). ``--event cycles`` adds the same rounds counted in user-mode
cycles per run (:mod:`felixjax.cycles`; 1 thread: onnxruntime's own threads are counted too, so read
its column at 1 thread only).

Usage:
    python benchmarks/rule_ab.py --rule strided --model resnet18 --dataset imagenet --threads 1
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
try:
    import felixjax  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402
from blocked_bcast import RULES, _without  # noqa: E402

import felixjax as fj  # noqa: E402
from felixjax.baselines import time_blocks  # noqa: E402
from felixjax.network import build_model  # noqa: E402
from felixjax.ort_compare import _ort_session  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rule", choices=sorted(RULES), required=True)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--dataset", default="imagenet")
    ap.add_argument("--layout", default="nchwc")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--event", choices=("cycles",), default=None)
    args = ap.parse_args(argv)

    proto = fj.zoo.make_model(args.model, dataset=args.dataset, seed=0)
    model = fj.load_onnx(proto, layout=args.layout)
    with _without(args.rule):
        off = build_model(model, threads=args.threads)
    on = build_model(model, threads=args.threads)
    sess = _ort_session(proto, args.threads)
    x = np.random.default_rng(0).standard_normal(model.input_shapes[model.input_names[0]]).astype(np.float32)
    ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    for name, exe in (("off", off), ("on", on)):
        got = exe(x)
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        if not err <= 1e-3:
            raise AssertionError(f"rule {name}: output differs from onnxruntime ({err:.3g})")
    changed = sum(a.config != b.config for a, b in zip(off.schedules, on.schedules))

    def lib_block(exe):
        ins, outs = exe._inputs([x]), exe.library.new_outputs()
        return lambda number: exe.library.timeit(ins, outs, number)

    feeds = {sess.get_inputs()[0].name: x}

    def ort_block(number: int) -> float:
        t0 = time.perf_counter()
        for _ in range(number):
            sess.run(None, feeds)
        return time.perf_counter() - t0

    timers = {"rule off": lib_block(off), "rule on": lib_block(on), "onnxruntime": ort_block}
    print(f"{args.model} ({args.dataset}, {args.layout}), rule {args.rule!r}, {args.threads} thread(s), "
          f"default schedules, {platform.processor() or platform.machine()}; medians of {args.rounds} interleaved "
          f"rounds; the rule changes {changed} of {len(on.schedules)} schedules")
    for event in (None, args.event) if args.event else (None,):
        t = time_blocks(timers, rounds=args.rounds, min_time_s=0.3, event=event)
        med = {k: statistics.median(v) for k, v in t.items()}
        unit, scale = ("ms", 1e3) if event is None else (f"M{event}", 1e-6)
        print(f"  {event or 'wall'}: " + ", ".join(f"{k} {v * scale:.3f} {unit}" for k, v in med.items())
              + f" | on / off {med['rule off'] / med['rule on']:.3f}x | vs onnxruntime: off "
              f"{med['onnxruntime'] / med['rule off']:.3f}x, on {med['onnxruntime'] / med['rule on']:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
