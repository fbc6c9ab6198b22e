"""Probe (issue 14): ``conv_direct``'s default register block on convolutions strided along their columns.

Each data vector of a column-strided ``conv_direct`` is two loads and a permute; the old default block
(the largest axes first: e.g. 4 output rows x 2 vectors on the 5x5 stride-2 stem) fed each one to a
single FMA per row. The new one (``codegen.space.strided_channel_rows``) is one vector by rows of output
channels, which share it. This script builds both defaults of ``conv_direct`` (and its padded variants)
for each strided float32 conv, checks them against numpy before and after timing, times them
interleaved with onnxruntime at its default session options and with the best other sketch default
(``conv_im2col`` / ``conv_spatial_pack``), and prints GFLOP/s, new / old, the ratios to onnxruntime and
which sketch ``codegen.space.default_sketch`` picks on this target.

Shape sets: ``designed`` (the fresh suite's 5x5 stem, looked at while choosing), ``r18`` (ResNet-18's
7x7 stem, looked at for the cap), ``heldout`` (stems and downsampling convs of common networks, not
looked at while choosing the block), ``heldout2`` (10 more, measured after everything was chosen; they
also rejected a default-sketch rule drawn from ``heldout``: ``conv_spatial_pack`` for strided convs of
8+ input channels on AVX-512, 0.96x geomean over the 4 picks it changed, 0.73-1.11x).

Run: ``python benchmarks/strided_direct_probe.py --shapes designed|r18|heldout [--threads 1] [--cap N]
[--old-cap N] [--avx2]`` (a minute or two per set and thread count; ``--old-cap`` compares two caps of
the new block; ``--avx2`` emits 8-lane, 16-register code on this host).
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
from codegen.ops import conv2d  # noqa: E402
from codegen.space import Space, default_config, default_sketch, sketches_for  # noqa: E402
from codegen.target import Target  # noqa: E402
from felixjax.baselines import checked_medians, kernel_contender, ort_contender  # noqa: E402


def _conv(c, h, k, kernel, stride=2):
    return conv2d(1, c, h, h, out_channels=k, kernel=kernel, stride=stride, padding=kernel // 2)


SHAPES = {
    "designed": [_conv(3, 128, 32, 5)],
    "r18": [_conv(3, 224, 64, 7)],
    "heldout2": [_conv(24, 112, 48, 3), _conv(48, 64, 96, 3), _conv(160, 14, 320, 3), _conv(32, 28, 64, 1),
                 _conv(512, 14, 1024, 1), _conv(8, 150, 16, 5), _conv(40, 40, 80, 5), _conv(96, 34, 192, 3),
                 _conv(3, 160, 24, 3), _conv(3, 300, 16, 5)],
    "heldout": [_conv(3, 224, 64, 7), _conv(3, 224, 32, 3), _conv(16, 112, 32, 3), _conv(64, 56, 128, 3),
                _conv(128, 28, 256, 3), _conv(256, 14, 512, 3), _conv(64, 56, 128, 1), _conv(96, 48, 64, 5),
                _conv(32, 56, 64, 5), _conv(3, 96, 24, 3)],
}


@contextlib.contextmanager
def _rule(on: bool, cap: int | None = None):
    saved = cs.STRIDED_CHANNEL_ROWS, cs.STRIDED_ROWS_CAP
    cs.STRIDED_CHANNEL_ROWS = on
    cs.STRIDED_ROWS_CAP = cap or cs.STRIDED_ROWS_CAP
    try:
        yield
    finally:
        cs.STRIDED_CHANNEL_ROWS, cs.STRIDED_ROWS_CAP = saved


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="designed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cap", type=int, default=None, help="the new block's accumulator cap "
                    "(default: codegen.space.STRIDED_ROWS_CAP)")
    ap.add_argument("--old-cap", type=int, default=None, help="compare against the new rule at this cap "
                    "instead of the old block")
    ap.add_argument("--avx2", action="store_true", help="emit AVX2 code (8 lanes, 16 registers) on this host")
    args = ap.parse_args(argv)
    target = Target.cpu(simd_lanes=8, vector_registers=16) if args.avx2 else Target.cpu()
    print(f"{target.simd_lanes} lanes, {target.vector_registers} vector registers; {args.threads} thread(s); "
          f"shapes {args.shapes}")
    ratios, vs_ort = [], []
    for task in SHAPES[args.shapes]:
        arrays = task.random_inputs(0)
        expected = task.reference(*arrays)
        contenders, configs = {}, {}
        for s in sketches_for(task, target):
            with _rule(args.old_cap is not None, args.old_cap):
                old = default_config(Space(task, s, target))
            with _rule(True, args.cap):
                new = default_config(Space(task, s, target))
            if s.base == "conv_direct" and old != new:
                configs[f"old {s.name}"], configs[f"new {s.name}"] = old, new
            elif s.base != "conv_direct":
                configs[s.name] = new
        for label, cfg in configs.items():
            contenders[label] = kernel_contender(task, cfg, arrays, threads=args.threads, target=target,
                                                 expected=expected, name=label)
        contenders["onnxruntime"] = ort_contender(task, arrays, threads=args.threads, expected=expected)
        med = checked_medians(contenders, rounds=args.rounds)
        ort = med["onnxruntime"]
        print(f"{task.name}: onnxruntime {task.flops / ort / 1e9:.1f} GFLOP/s; default sketch "
              f"{default_sketch(task, target).name}")
        for label in configs:
            print(f"  {label:36s} {task.flops / med[label] / 1e9:6.1f} GFLOP/s  {ort / med[label]:.2f}x onnxruntime")
        for label in configs:
            if label.startswith("new "):
                r = med["old " + label[4:]] / med[label]
                ratios.append(r)
                print(f"  {label[4:]}: new / old {r:.2f}x")
        best = min(v for k, v in med.items() if k != "onnxruntime" and not k.startswith("old "))
        vs_ort.append(ort / best)
        print(f"  best sketch default (new rule) {ort / best:.2f}x onnxruntime", flush=True)
    if ratios:
        print(f"geomean conv_direct new / old over {len(ratios)} defaults: {math.exp(np.mean(np.log(ratios))):.2f}x "
              f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x)")
    print(f"best sketch default vs onnxruntime: geomean {math.exp(np.mean(np.log(vs_ort))):.2f}x, "
          f"min {min(vs_ort):.2f}x over {len(vs_ort)} shapes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
