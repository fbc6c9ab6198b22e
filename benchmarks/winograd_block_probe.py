"""Probe (issue 14): the Winograd defaults' work unit, ``V`` in the L1d vs in a quarter of L2.

A Winograd kernel (``codegen.winograd``) transforms the input patches of a work unit of tiles into ``V``
(``alpha^2 x C x tiles`` floats), then runs its ``alpha^2`` GEMMs over ``V``. The default work unit used to
fill up to a quarter of L2 with ``V`` (16 tiles on a 64-channel 32x32 F(4x4) conv: 147 KB); now it fits
the L1d (``codegen.winograd.v_budget``: 4 tiles, 36 KB). This script builds the default config of the
Winograd sketch both ways for each 3x3 conv, checks them against numpy before and after timing, times
them interleaved with onnxruntime at its default session options and with ``conv_direct``'s default, and
prints GFLOP/s (direct-conv FLOPs), the work unit's tiles and new / old.

Shape sets: ``designed`` (looked at while choosing: ResNet-18 CIFAR's and the suites' 3x3 convs),
``heldout`` (not looked at before the rule was fixed), ``f2`` (convs whose default is F(2x2): small or
odd tile grids; the L1d budget was tried there too, 0.969x geomean, and not adopted, so both rules now
give F(2x2) the same work unit).

Run: ``python benchmarks/winograd_block_probe.py --shapes designed|heldout|f2 [--threads 1] [--rounds 5]``
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

import codegen.winograd as wg  # noqa: E402
from benchmarks import shape_probe_args  # noqa: E402
from codegen.ops import conv2d  # noqa: E402
from codegen.space import Space, default_config  # noqa: E402
from codegen.target import Target  # noqa: E402
from felixjax.baselines import checked_medians, kernel_contender, ort_contender  # noqa: E402

SHAPES = {  # (channels in = out, image side)
    "designed": [(64, 32), (64, 56), (128, 28), (128, 16), (256, 8), (128, 17)],
    "heldout": [(32, 64), (96, 24), (64, 40), (192, 12), (160, 20), (48, 48), (256, 14), (80, 30)],
    "f2": [(512, 4), (512, 7), (256, 7), (384, 6), (128, 9), (320, 5)],
}


def _rule(in_l1: bool):
    """The work-unit rule in force: ``V`` in the L1d (new) or in a quarter of L2 (old)."""
    return mock.patch.object(wg, "V_IN_L1", in_l1)


def main(argv=None) -> int:
    args = shape_probe_args(__doc__, SHAPES, argv)
    target = Target.cpu()
    print(f"{target.name}: {target.simd_lanes} lanes, L1d {target.l1d_bytes // 1024} KiB, L2 "
          f"{target.l2_bytes // 1024} KiB; {args.threads} thread(s); shapes {args.shapes}")
    ratios = []
    for c, h in SHAPES[args.shapes]:
        task = conv2d(1, c, h, h, out_channels=c, kernel=3, padding=1, bias=True, act="relu")
        variant = wg.default_variant(task, target) or wg.F2
        sketch = wg.WG4_SKETCH if variant is wg.F4 else wg.WG_SKETCH
        arrays = task.random_inputs(0)
        expected = task.reference(*arrays)
        cfgs, tiles = {}, {}
        for label, in_l1 in (("new", True), ("old", False)):
            with _rule(in_l1):
                sp = Space(task, sketch, target)
                cfgs[label] = default_config(sp)
            s = wg.schedule(sp, cfgs[label])
            tiles[label] = s["YB"] * s["XB"]
        contenders = {label: kernel_contender(task, cfg, arrays, threads=args.threads, target=target,
                                              expected=expected, name=label) for label, cfg in cfgs.items()}
        contenders["conv_direct"] = kernel_contender(task, default_config(Space(task, "conv_direct", target)), arrays,
                                                     threads=args.threads, target=target, expected=expected)
        contenders["onnxruntime"] = ort_contender(task, arrays, threads=args.threads, expected=expected)
        med = checked_medians(contenders, rounds=args.rounds)
        gf = {k: task.flops / v / 1e9 for k, v in med.items()}
        r = med["old"] / med["new"]
        ratios.append(r)
        print(f"{task.name} ({sketch}): onnxruntime {gf['onnxruntime']:.1f}, conv_direct {gf['conv_direct']:.1f}, "
              f"old {gf['old']:.1f} ({tiles['old']} tiles), new {gf['new']:.1f} ({tiles['new']} tiles) GFLOP/s; "
              f"new / old {r:.3f}x, new vs onnxruntime {med['onnxruntime'] / med['new']:.2f}x", flush=True)
    print(f"geomean new / old over {len(ratios)}: {math.exp(np.mean(np.log(ratios))):.3f}x "
          f"(min {min(ratios):.3f}x, max {max(ratios):.3f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
