"""Probe (issue 14): padded vector axes run in place under masks vs through a copy and a cropping scratch.

A padded sketch (``codegen.padding``) computes over a pad-to extent. Before, its data went through a
zero-padded copy and its output through a padded scratch that the epilogue cropped; now, where only
the vector axis is padded and spans at least ``MASKED_MIN_VECTORS`` vectors
(``codegen.padding.masked_tail``), the kernel reads and writes the API arrays in place and the
register blocks whose vectors run past the extent load and store under masks. This script builds the
same default config of every such padded sketch both ways (the old way by emptying
``codegen.padding.MASKED_BASES``), checks each against numpy before and after timing, times them
interleaved with onnxruntime at its default session options, and prints GFLOP/s and masked / copy.

Shape sets: ``designed`` (the fresh suite's 1x1 conv 256x14x14 -> 1024, looked at while building it),
``heldout`` (1x1 convs of other networks, a padded-column matmul, a strided conv through im2col: not
looked at before the mechanism was fixed).

Run: ``python benchmarks/masked_tail_probe.py --shapes designed|heldout [--threads 1] [--rounds 5]``
(a minute or two per set and thread count).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks import shape_probe_args  # noqa: E402
from codegen import padding  # noqa: E402
from codegen.ops import conv2d, matmul  # noqa: E402
from codegen.space import Space, default_config, sketches_for  # noqa: E402
from codegen.target import Target  # noqa: E402
from felixjax.baselines import checked_medians, kernel_contender, ort_contender  # noqa: E402

SHAPES = {
    "designed": [conv2d(1, 256, 14, 14, out_channels=1024, kernel=1)],
    "heldout": [conv2d(1, 512, 7, 7, out_channels=2048, kernel=1), conv2d(1, 160, 17, 17, out_channels=192, kernel=1),
                conv2d(1, 64, 15, 15, out_channels=256, kernel=1, bias=True, act="relu"),
                conv2d(1, 96, 35, 35, out_channels=64, kernel=1), conv2d(1, 128, 9, 9, out_channels=512, kernel=1),
                matmul(64, 1000, 512), matmul(8, 1000, 1280),
                conv2d(1, 32, 30, 30, out_channels=64, kernel=3, stride=2, padding=1),
                conv2d(1, 64, 25, 25, out_channels=64, kernel=3, padding=1)],
}


def _copying():
    """The padded sketches built the old way: a data copy and a cropping scratch."""
    return mock.patch.object(padding, "MASKED_BASES", ())


def main(argv=None) -> int:
    args = shape_probe_args(__doc__, SHAPES, argv)
    target = Target.cpu()
    print(f"{target.name}: {target.simd_lanes} lanes; {args.threads} thread(s); shapes {args.shapes}")
    ratios = []
    for task in SHAPES[args.shapes]:
        arrays = task.random_inputs(0)
        expected = task.reference(*arrays)
        contenders = {}
        for s in sketches_for(task, target):
            sp = Space(task, s, target)
            if not (s.pad and sp.masked):
                continue
            cfg = default_config(sp)
            contenders[f"masked {s.name}"] = kernel_contender(task, cfg, arrays, threads=args.threads, target=target,
                                                              expected=expected, name=f"masked {s.name}")
            with _copying():
                contenders[f"copy {s.name}"] = kernel_contender(task, cfg, arrays, threads=args.threads,
                                                                target=target, expected=expected, name=f"copy {s.name}")
        if not contenders:
            print(f"{task.name}: no padded sketch runs masked here", flush=True)
            continue
        contenders["onnxruntime"] = ort_contender(task, arrays, threads=args.threads, expected=expected)
        med = checked_medians(contenders, rounds=args.rounds)
        ort = med["onnxruntime"]
        print(f"{task.name}: onnxruntime {task.flops / ort / 1e9:.1f} GFLOP/s")
        for label in contenders:
            if label == "onnxruntime":
                continue
            line = f"  {label:36s} {task.flops / med[label] / 1e9:6.1f} GFLOP/s  {ort / med[label]:.3f}x onnxruntime"
            if label.startswith("masked "):
                r = med["copy " + label[7:]] / med[label]
                ratios.append(r)
                line += f"  masked / copy {r:.3f}x"
            print(line, flush=True)
    if ratios:
        print(f"geomean masked / copy over {len(ratios)} sketches: {math.exp(np.mean(np.log(ratios))):.3f}x "
              f"(min {min(ratios):.3f}x, max {max(ratios):.3f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
