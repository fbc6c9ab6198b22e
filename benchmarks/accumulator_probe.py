"""Probe (issue 14): the defaults' register block on a 32-register (AVX-512) core, 12 vs more accumulators.

The untuned defaults size their register block to at most ``codegen.space.ACCUMULATOR_CAP``
accumulators (``Space.default_accumulators``): 12, AVX2's 6 x 2-vector block on 16 registers. An AVX-512
core has 32 (28 after the operand reserve), so a block of 24 would load each broadcast or weight
vector for twice the FMAs. Session 19 (Zen 4, 1 thread): the NCHW sketches and Winograd 0.51-1.76x,
no rule; the blocked ``conv_nchwc`` default 0.96-1.12x, 9 of 10 faster: its cap
(``codegen.blocked.ACCUMULATOR_CAP``) is 24 now, the others' 12. ``old`` here is 12 everywhere. This script builds, for every sketch of each float32 conv whose default
changes with the cap (the NCHW sketches, Winograd, and the blocked NCHW8c/16c ``conv_nchwc`` default),
the default at cap 12 and at ``--cap``; checks both against numpy before and after timing; times them
interleaved with onnxruntime at its default session options; prints GFLOP/s, new / old and the ratio
to onnxruntime, and the geomean of new / old per shape set.

Shape sets: ``designed`` (the kernel suites' convs and the fresh 5x5 stem: looked at while choosing),
``heldout`` (stems, downsampling and 3x3 / 1x1 layers not looked at).

Run: ``python benchmarks/accumulator_probe.py --shapes designed|heldout [--threads 1] [--cap 24]``
(a minute or two per set and thread count). On a 16-register target both caps give the same blocks.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import codegen.space as cs  # noqa: E402
from codegen import blocked, winograd  # noqa: E402
from codegen.blocked import conv2d_nchwc, plain_twin  # noqa: E402
from codegen.ops import conv2d  # noqa: E402
from codegen.space import Space, default_config, sketches_for  # noqa: E402
from codegen.target import Target  # noqa: E402
from felixjax.baselines import checked_medians, kernel_contender, ort_contender  # noqa: E402


def _plain(c, h, k, kernel=3, stride=1):
    return conv2d(1, c, h, h, out_channels=k, kernel=kernel, stride=stride, padding=kernel // 2)


def _blocked(c, h, k, kernel=3, stride=1):
    return conv2d_nchwc(1, c, h, h, out_channels=k, kernel=kernel, stride=stride, padding=kernel // 2, bias=True,
                        act="relu", plain_data=c < 8)


SHAPES = {
    "designed": [_plain(64, 56, 64), _plain(128, 28, 128), _plain(256, 14, 256, 1), _plain(128, 17, 128),
                 _plain(256, 14, 1024, 1), _plain(3, 128, 32, 5, 2),
                 _blocked(64, 56, 64), _blocked(512, 7, 512), _blocked(3, 224, 64, 7, 2), _blocked(128, 28, 256, 3, 2)],
    "heldout": [_plain(3, 224, 64, 7, 2), _plain(3, 224, 32, 3, 2), _plain(64, 56, 128, 3, 2), _plain(96, 24, 96),
                _plain(512, 7, 512), _plain(32, 112, 64, 1), _plain(192, 35, 64, 1), _plain(96, 48, 64, 5, 2),
                _blocked(256, 14, 256), _blocked(96, 24, 96), _blocked(3, 128, 32, 5, 2), _blocked(64, 56, 128, 3, 2),
                _blocked(192, 13, 384), _blocked(32, 56, 64, 5, 2)],
}


@contextlib.contextmanager
def _cap(n: int):
    """Every default's accumulator cap set to ``n`` (``codegen.space``'s and ``codegen.blocked``'s)."""
    saved = cs.ACCUMULATOR_CAP, blocked.ACCUMULATOR_CAP
    cs.ACCUMULATOR_CAP = blocked.ACCUMULATOR_CAP = n
    try:
        yield
    finally:
        cs.ACCUMULATOR_CAP, blocked.ACCUMULATOR_CAP = saved


def _sketches(task, target) -> list[str]:
    if task.op == "conv2d_nchwc":
        return [cs.default_sketch(task, target).name]
    names = [s.name for s in sketches_for(task, target)]
    if winograd.applies(task) and winograd.WG_SKETCH not in names:
        names.append(winograd.WG_SKETCH)
    return names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="designed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cap", type=int, default=24, help="the new accumulator cap (old: 12)")
    ap.add_argument("--kinds", default="nchw,blocked", help="comma-separated: nchw (the NCHW sketches and "
                    "Winograd), blocked (conv_nchwc)")
    args = ap.parse_args(argv)
    target = Target.cpu()
    print(f"{target.simd_lanes} lanes, {target.vector_registers} vector registers; cap 12 vs {args.cap}; "
          f"{args.threads} thread(s); shapes {args.shapes}")
    ratios = []
    kinds = set(args.kinds.split(","))
    for task in SHAPES[args.shapes]:
        if ("blocked" if task.op == "conv2d_nchwc" else "nchw") not in kinds:
            continue
        arrays = task.random_inputs(0)
        expected = task.reference(*arrays)
        twin = plain_twin(task) if task.op == "conv2d_nchwc" else task
        twin_arrays = twin.random_inputs(0) if twin is not task else arrays
        ort = ort_contender(twin, twin_arrays, threads=args.threads, expected=twin.reference(*twin_arrays))
        for sk in _sketches(task, target):
            configs = {}
            for label, cap in (("old", 12), ("new", args.cap)):
                with _cap(cap):
                    configs[label] = default_config(Space(task, sk, target))
            if configs["old"] == configs["new"]:
                continue
            contenders = {label: kernel_contender(task, cfg, arrays, threads=args.threads, target=target,
                                                  expected=expected, name=label) for label, cfg in configs.items()}
            contenders["onnxruntime"] = ort
            med = checked_medians(contenders, rounds=args.rounds)
            ratios.append(med["old"] / med["new"])
            print(f"{task.name:46s} {sk:28s} old {task.flops / med['old'] / 1e9:6.1f} new "
                  f"{task.flops / med['new'] / 1e9:6.1f} GFLOP/s  new/old {med['old'] / med['new']:.2f}x  "
                  f"vs onnxruntime old {med['onnxruntime'] / med['old']:.2f}x new {med['onnxruntime'] / med['new']:.2f}x",
                  flush=True)
    if ratios:
        print(f"geomean new/old over {len(ratios)} sketch defaults: {math.exp(np.mean(np.log(ratios))):.2f}x "
              f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x)")
    else:
        print("no default changes with the cap on this target")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
