"""Probe (issue 14): float32 convolutions with the 6-column x 2-vector register block.

On a 16-register AVX2 core the GEMM micro-kernel is 6 rows x 2 vectors (12 accumulators; see
``register_block_probe.py``). ``conv_spatial_pack`` vectorizes over output channels, so its rows are
output columns; their extents (56, 28, 14, 17) have no divisor 6 and the default block had 4 rows.
``codegen.padding.row_padded_sketch`` pads the columns to a multiple of 6 (56 -> 60, 14 -> 18), and the
renderer leaves the kernel-width loop rolled when its unrolled copies would share the block's
broadcasts (``codegen.renderers.cstyle._sliding_loops``: gcc kept them live and spilled accumulators).

This script times, interleaved in one process against onnxruntime at its default session options, the
untuned default of each sketch of a few float32 convs (the kernels suites' and shapes outside them),
each checked against numpy before and after timing, and prints GFLOP/s and the ratio to onnxruntime.

Run: ``python benchmarks/conv_block_probe.py [--threads 1] [--rounds 5] [--shapes all|fresh|1x1]``
(about 1 minute per thread count; ``--shapes 1x1``: the 1x1 convs ``conv_flat`` was judged on).
"""
from __future__ import annotations

import argparse

import numpy as np

from codegen import winograd
from codegen.ops import conv2d, depthwise_conv2d
from codegen.space import Space, default_config, default_sketch, sketches_for
from codegen.target import Target
from felixjax.baselines import kernel_contender, ort_contender, time_interleaved

SUITE = {  # the op / fresh suites' convs (the design was looked at on the first two)
    "64x56x56 3x3": conv2d(1, 64, 56, 56, out_channels=64, kernel=3, padding=1),
    "128x28x28 3x3": conv2d(1, 128, 28, 28, out_channels=128, kernel=3, padding=1),
    "256x14x14 1x1 k256": conv2d(1, 256, 14, 14, out_channels=256, kernel=1),
    "128x17x17 3x3": conv2d(1, 128, 17, 17, out_channels=128, kernel=3, padding=1),
}
FRESH = {  # not looked at while designing: ResNet / MobileNet / VGG-like layers
    "256x14x14 3x3": conv2d(1, 256, 14, 14, out_channels=256, kernel=3, padding=1),
    "512x7x7 3x3": conv2d(1, 512, 7, 7, out_channels=512, kernel=3, padding=1),
    "96x24x24 3x3": conv2d(1, 96, 24, 24, out_channels=96, kernel=3, padding=1),
    "32x112x112 1x1 k64": conv2d(1, 32, 112, 112, out_channels=64, kernel=1),
    "144x56x56 1x1 k24": conv2d(1, 144, 56, 56, out_channels=24, kernel=1),
    "64x56x56 3x3 s2 k128": conv2d(1, 64, 56, 56, out_channels=128, kernel=3, stride=2, padding=1),
    "192x35x35 1x1 k64": conv2d(1, 192, 35, 35, out_channels=64, kernel=1),
}

ONE_BY_ONE = {  # conv_flat (codegen.flat), session 7: designed on 256x14x14 -> 1024; the others judge it
    "256x14x14 1x1 k1024 (design)": conv2d(1, 256, 14, 14, out_channels=1024, kernel=1),
    **{f"{c}x{h}x{h} 1x1 k{k}": conv2d(1, c, h, h, out_channels=k, kernel=1) for c, h, k in (
        (192, 35, 64), (64, 56, 256), (32, 112, 64), (256, 56, 64), (128, 28, 512), (1024, 14, 256),
        (16, 112, 96), (384, 14, 64), (576, 14, 96), (64, 56, 64))},
}

ONE_BY_ONE_HELDOUT = {  # AVX-512's masked conv_flat default (session 21) was judged on these, not chosen on them
    f"{c}x{h}x{h} 1x1 k{k} bias relu": conv2d(1, c, h, h, out_channels=k, kernel=1, bias=True, act="relu")
    for c, h, k in ((96, 14, 576), (768, 17, 192), (512, 13, 64), (64, 13, 256), (256, 10, 512), (160, 14, 960))
}

STRIDED = {  # conv_im2col (codegen.flat) after its branch-free gather (session 8): stems and downsampling
    "3x128x128 5x5 s2 k32 (fresh stem)": conv2d(1, 3, 128, 128, out_channels=32, kernel=5, stride=2, padding=2),
    "3x224x224 7x7 s2 k64 (ResNet stem)": conv2d(1, 3, 224, 224, out_channels=64, kernel=7, stride=2, padding=3),
    "3x224x224 3x3 s2 k32 (MobileNet stem)": conv2d(1, 3, 224, 224, out_channels=32, kernel=3, stride=2, padding=1),
    "64x56x56 3x3 s2 k128": conv2d(1, 64, 56, 56, out_channels=128, kernel=3, stride=2, padding=1),
    "128x28x28 3x3 s2 k256": conv2d(1, 128, 28, 28, out_channels=256, kernel=3, stride=2, padding=1),
    "256x14x14 3x3 s2 k512": conv2d(1, 256, 14, 14, out_channels=512, kernel=3, stride=2, padding=1),
    "64x56x56 1x1 s2 k128": conv2d(1, 64, 56, 56, out_channels=128, kernel=1, stride=2),
    "64x32x32 3x3 s2 k128 (CIFAR)": conv2d(1, 64, 32, 32, out_channels=128, kernel=3, stride=2, padding=1),
}

STRIDED_HELDOUT = {  # not looked at while choosing the strided default: it is judged on these
    "3x299x299 3x3 s2 k32 (Inception stem)": conv2d(1, 3, 299, 299, out_channels=32, kernel=3, stride=2),
    "288x35x35 3x3 s2 k384 (Inception)": conv2d(1, 288, 35, 35, out_channels=384, kernel=3, stride=2),
    "96x48x48 5x5 s2 k64": conv2d(1, 96, 48, 48, out_channels=64, kernel=5, stride=2, padding=2),
    "160x20x20 3x3 s2 k320": conv2d(1, 160, 20, 20, out_channels=320, kernel=3, stride=2, padding=1),
    "512x28x28 1x1 s2 k1024 (ResNet-50 shortcut)": conv2d(1, 512, 28, 28, out_channels=1024, kernel=1, stride=2),
    "32x112x112 3x3 s2 k64": conv2d(1, 32, 112, 112, out_channels=64, kernel=3, stride=2, padding=1),
}

DEPTHWISE = {  # the depthwise default (codegen.space._depthwise_sketch) was chosen on these: MobileNetV2 at 224
    f"dw {c}x{h}x{h} s{st}": depthwise_conv2d(1, c, h, h, kernel=3, stride=st, padding=1, bias=True, act="relu6")
    for c, h, st in ((32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (192, 28, 2),
                     (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1))
}

DEPTHWISE_HELDOUT = {  # not looked at while choosing it: EfficientNet / MnasNet-like and odd sizes
    f"dw {c}x{h}x{h} {k}x{k} s{st}": depthwise_conv2d(1, c, h, h, kernel=k, stride=st, padding=k // 2, bias=True,
                                                     act="relu")
    for c, h, k, st in ((240, 28, 5, 1), (672, 14, 5, 2), (480, 14, 3, 1), (1152, 7, 3, 1), (72, 56, 3, 2),
                        (32, 150, 3, 1), (128, 20, 3, 1), (256, 10, 3, 1), (144, 75, 3, 2))
}


def probe(name: str, task, threads: int, rounds: int, target: Target) -> None:
    arrays = task.random_inputs(0)
    expected = task.reference(*arrays)
    contenders = {"onnxruntime": ort_contender(task, arrays, threads=threads, expected=expected)}
    chosen = default_sketch(task, target).name
    names = [sk.name for sk in sketches_for(task, target)]
    if winograd.applies(task) and winograd.WG_SKETCH not in names:
        names.append(winograd.WG_SKETCH)  # listed by name (codegen.winograd)
    for sk in names:
        cfg = default_config(Space(task, sk, target))
        label = sk + (" (default)" if sk == chosen else "")
        contenders[label] = kernel_contender(task, cfg, arrays, threads=threads, target=target, expected=expected)
    for c in contenders.values():
        c.check()
    times = time_interleaved(contenders, rounds=rounds)
    ort = np.median(times["onnxruntime"])
    print(f"{name}  ({task.name}, {threads} thread(s))")
    for label, c in contenders.items():
        c.check()  # after timing too
        t = np.median(times[label])
        print(f"  {label:36s} {task.flops / t / 1e9:6.1f} GFLOP/s  {ort / t:5.2f}x onnxruntime")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1", help="comma-separated thread counts (default 1)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", choices=("all", "suite", "fresh", "1x1", "1x1-heldout", "strided", "strided-heldout",
                                         "depthwise", "depthwise-heldout"), default="all",
                    help="1x1: the conv_flat shapes, strided(-heldout): stems and downsampling convs, "
                         "depthwise(-heldout): depthwise convs (none of these in 'all')")
    args = ap.parse_args()
    shapes = {**(SUITE if args.shapes in ("all", "suite") else {}), **(FRESH if args.shapes in ("all", "fresh") else {})}
    sets = {"1x1": ONE_BY_ONE, "1x1-heldout": ONE_BY_ONE_HELDOUT, "strided": STRIDED, "strided-heldout": STRIDED_HELDOUT,
            "depthwise": DEPTHWISE, "depthwise-heldout": DEPTHWISE_HELDOUT}
    if args.shapes in sets:
        shapes = sets[args.shapes]
    target = Target.cpu()
    for threads in (int(t) for t in args.threads.split(",")):
        for name, task in shapes.items():
            probe(name, task, threads, args.rounds, target)


if __name__ == "__main__":
    main()
