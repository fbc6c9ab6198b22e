"""Probe (issue 14): how ``gemm_packed``'s default splits its register-block rows among the cores.

The default split the rows into the largest divisor of the row-block count up to 2 chunks per core; on a
padded prime M that can leave an odd chunk count (257x96x384: 33 blocks of 8 rows -> 3 chunks on 2 cores,
one core doing two thirds). ``codegen.gemm_default.balanced_split`` now takes the fewest parts that give at
least 2 chunks per core with the busiest core at most ``MAX_IMBALANCE`` (1.05) times the mean. This
script builds, for every ``gemm_packed`` sketch (and padded variant) of each matmul / dense shape whose
default changes, the old and the new default, checks both against numpy before and after timing, times
them interleaved with onnxruntime at its default session options and prints GFLOP/s, new / old and the
ratios to onnxruntime.

Shape sets: ``designed`` (the fresh suite's token matmul, looked at while choosing), ``heldout`` (token
and batch shapes of common transformers, not looked at).

``--sketch``: instead, the untuned default *sketch* of float32 matmuls on targets without AVX2's 6-row
block: the exact ``gemm_packed`` (old) against its row-padded variant where that one's default block
reuses loads at least 10% more (``codegen.space._gemm_padded_default``); shape sets ``sketch-designed``
(197 and 257 rows, looked at) and ``sketch-heldout`` (prime-ish token counts, not looked at).

Run: ``python benchmarks/gemm_split_probe.py --shapes designed|heldout [--threads 2]``,
``python benchmarks/gemm_split_probe.py --sketch --shapes sketch-designed|sketch-heldout [--threads 2]``
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import codegen.gemm_default as gd  # noqa: E402
import codegen.space as cs  # noqa: E402
from codegen.ops import dense, matmul  # noqa: E402
from codegen.space import Space, default_config, default_sketch, sketches_for  # noqa: E402
from codegen.target import Target  # noqa: E402
from felixjax.baselines import checked_medians, kernel_contender, ort_contender  # noqa: E402

SHAPES = {
    "designed": [matmul(257, 96, 384)],
    "sketch-designed": [matmul(197, 768, 768), matmul(257, 96, 384)],
    "sketch-heldout": [matmul(31, 1024, 1024), matmul(127, 512, 512), matmul(211, 384, 384), matmul(577, 768, 768),
                       matmul(61, 2048, 512), matmul(101, 256, 1024)],
    "heldout": [matmul(197, 768, 768), matmul(50, 768, 3072), matmul(49, 512, 2048), matmul(77, 512, 512),
                matmul(385, 128, 512), matmul(129, 256, 256), dense(12, 1024, 1024), matmul(1000, 64, 64)],
}


def _old_split(blocks: int, chunks: int, cores: int) -> int:
    """The previous rule: the largest divisor up to 2 chunks per core."""
    return gd.largest_divisor_leq(blocks, max(1, -(-2 * cores // chunks)))


def _sketch_rows(args, target) -> list[float]:
    """``--sketch``: the default sketch's default, old pick (the exact sketch) vs new (row-padded)."""
    ratios = []
    for task in SHAPES[args.shapes]:
        with mock.patch.object(cs, "GEMM_PADDED_DEFAULT", False):
            old = default_sketch(task, target)
        new = default_sketch(task, target)
        if old == new:
            print(f"{task.name:28s} default sketch {new.name} (unchanged)")
            continue
        arrays = task.random_inputs(0)
        expected = task.reference(*arrays)
        contenders = {label: kernel_contender(task, default_config(Space(task, sk, target)), arrays,
                                              threads=args.threads, target=target, expected=expected, name=label)
                      for label, sk in (("old", old), ("new", new))}
        contenders["onnxruntime"] = ort_contender(task, arrays, threads=args.threads, expected=expected)
        med = checked_medians(contenders, rounds=args.rounds)
        ratios.append(med["old"] / med["new"])
        print(f"{task.name:28s} {old.name} -> {new.name}: old {task.flops / med['old'] / 1e9:6.1f} new "
              f"{task.flops / med['new'] / 1e9:6.1f} GFLOP/s  new/old {med['old'] / med['new']:.2f}x  vs onnxruntime "
              f"old {med['onnxruntime'] / med['old']:.2f}x new {med['onnxruntime'] / med['new']:.2f}x", flush=True)
    return ratios


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="designed")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--sketch", action="store_true", help="compare the default sketch's pick (exact vs "
                    "row-padded gemm_packed, codegen.space._gemm_padded_default) instead of the row split")
    args = ap.parse_args(argv)
    target = Target.cpu()
    print(f"{target.cores} cores, {target.simd_lanes} lanes; {args.threads} thread(s); shapes {args.shapes}")
    ratios = _sketch_rows(args, target) if args.sketch else []
    for task in ([] if args.sketch else SHAPES[args.shapes]):
        arrays = task.random_inputs(0)
        expected = task.reference(*arrays)
        ort = ort_contender(task, arrays, threads=args.threads, expected=expected)
        for sk in sketches_for(task, target):
            with mock.patch.object(gd, "balanced_split", _old_split):
                old = default_config(Space(task, sk, target))
            new = default_config(Space(task, sk, target))
            if old == new:
                continue
            contenders = {label: kernel_contender(task, cfg, arrays, threads=args.threads, target=target,
                                                  expected=expected, name=label)
                          for label, cfg in (("old", old), ("new", new))}
            contenders["onnxruntime"] = ort
            med = checked_medians(contenders, rounds=args.rounds)
            ratios.append(med["old"] / med["new"])
            m_old, m_new = old.tiles[1][0], new.tiles[1][0]
            print(f"{task.name:28s} {sk.name:24s} row parts {m_old} -> {m_new}: old {task.flops / med['old'] / 1e9:6.1f} "
                  f"new {task.flops / med['new'] / 1e9:6.1f} GFLOP/s  new/old {med['old'] / med['new']:.2f}x  vs "
                  f"onnxruntime old {med['onnxruntime'] / med['old']:.2f}x new {med['onnxruntime'] / med['new']:.2f}x",
                  flush=True)
    if ratios:
        print(f"geomean new/old over {len(ratios)} defaults: {math.exp(np.mean(np.log(ratios))):.2f}x "
              f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x)")
    else:
        print("no default changes on this target")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
