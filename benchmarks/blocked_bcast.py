"""Probe (issue 14): blocked (NCHW8c) direct convs with memory broadcasts vs scalar broadcasts.

``conv_nchwc`` broadcasts one data element per pixel of its register block against a vector of weights.
Rendered as a scalar load and a register broadcast (``const float d0 = data_p[..]; acc += d0 * w``),
gcc saw that the kernel-width loop's next tap reads the element the block's next pixel read, kept the
scalars alive across taps and rotated them through registers (the loop was left rolled since unrolled
it spilled). ``Dialect.bcast8`` reads each broadcast straight from memory (``vbroadcastss mem``), and
the kernel-width loop is then left to gcc (``CStyleRenderer._memory_broadcasts``).

This script builds each conv's untuned default both ways (the old spelling: the C dialect without
``bcast8``), checks both against numpy before and after timing, times them interleaved in one process
and prints GFLOP/s and new / old. ``--shapes designed``: the 8 shapes the rule was chosen on;
``--shapes heldout``: 8 others, not looked at before the rule was fixed.

``--what padx``: instead, convs whose output width is a prime (13, 17, ...): the exact ``conv_nchwc``
default (a block of output channels only) vs the default of its padded variant ``conv_nchwc.pad_x<W+1>``
(:func:`codegen.blocked.pad_x`; the default sketch now), shape sets ``prime`` (designed on: the first
two) and ``prime-heldout``.

``--what taps`` (session 14): the default before and after tap chunks (:func:`codegen.blocked.tap_chunk`:
where one register block's weights exceed 24 KB, input-channel chunks with the kernel rows in R0, so a
chunk's weights for one kernel row stay in L1 while every pixel reads them, and unroll 64), with
onnxruntime at its defaults as a third contender; shape sets ``taps`` (designed on: ResNet-18 224's
3x3s), ``taps-heldout`` (3x3s of other sizes) and ``taps-more`` (stride 2, 5x5).

``--what strided`` (session 15): the default of a blocked 1x1 conv at stride 2 before and after it runs
row-major (:func:`codegen.blocked.strided_rows`), shape sets ``strided`` (designed on: ResNet-18's
projections) and ``strided-heldout``. ``--event cycles`` counts user-mode cycles per call
(:mod:`felixjax.cycles`) instead of timing, for A/B decisions on this noisy shared host (columns in
millions of cycles and flop per cycle).

Run: ``python benchmarks/blocked_bcast.py [--threads 1] [--rounds 5] [--shapes designed|heldout|stride2|wide-stride2]``,
``python benchmarks/blocked_bcast.py --what padx --shapes prime|prime-heldout``,
``python benchmarks/blocked_bcast.py --what taps --shapes taps|taps-heldout|taps-more`` (about a minute per set),
``python benchmarks/blocked_bcast.py --what strided --shapes strided|strided-heldout [--event cycles]``.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses

import numpy as np

from codegen import blocked
from codegen.blocked import conv2d_nchwc, plain_twin
from codegen.build import build
from codegen.lower import lower
from codegen.renderers.c import C_DIALECT, render
from codegen.renderers.cstyle import CStyleRenderer
from codegen.space import Space, default_config, default_sketch
from codegen.target import Target
from felixjax.baselines import KernelContender, ort_contender, time_interleaved


def _conv(c: int, h: int, k: int, kernel: int = 3, stride: int = 1, plain: bool = False):
    return conv2d_nchwc(1, c, h, h, out_channels=k, kernel=kernel, stride=stride, padding=kernel // 2,
                        bias=True, act="relu", plain_data=plain)


SHAPES = {
    "designed": [(512, 7, 512), (256, 14, 256), (128, 28, 128), (64, 56, 64), (64, 32, 64), (96, 17, 96),
                 (160, 10, 320), (128, 28, 256, 3, 2)],
    "heldout": [(192, 13, 384), (48, 27, 128), (112, 20, 112), (40, 30, 80), (176, 9, 176), (256, 12, 512),
                (64, 24, 128, 3, 2), (32, 40, 64, 5)],
    "stride2": [(128, 28, 256, 3, 2), (64, 24, 128, 3, 2), (256, 14, 512, 3, 2), (64, 56, 128, 3, 2)],
    # 5x5 / 7x7 at stride 2 (plain_data: the network's image, 3 channels); the first one designed on
    "wide-stride2": [(3, 224, 64, 7, 2, True), (3, 112, 32, 7, 2, True), (3, 128, 32, 5, 2, True), (32, 56, 64, 5, 2),
                     (16, 64, 32, 7, 2), (3, 299, 64, 7, 2, True), (24, 40, 48, 5, 2)],
    "taps": [(512, 7, 512), (256, 14, 256), (128, 28, 128), (64, 56, 64)],
    "taps-heldout": [(64, 32, 64), (128, 16, 128), (256, 8, 256), (512, 4, 512), (96, 24, 96), (192, 12, 192),
                     (48, 40, 64), (320, 10, 320)],
    "taps-more": [(64, 56, 128, 3, 2), (128, 28, 256, 3, 2), (256, 14, 512, 3, 2), (64, 32, 128, 3, 2),
                  (96, 20, 96, 5), (64, 28, 64, 5)],
    # 1x1 stride 2 (--what strided): ResNet-18's three projections, then held-out shapes
    "strided": [(64, 56, 128, 1, 2), (128, 28, 256, 1, 2), (256, 14, 512, 1, 2)],
    "strided-heldout": [(32, 112, 64, 1, 2), (96, 40, 192, 1, 2), (160, 20, 320, 1, 2), (48, 30, 96, 1, 2),
                        (512, 14, 1024, 1, 2), (24, 80, 48, 1, 2), (384, 12, 768, 1, 2), (64, 33, 128, 1, 2)],
    "prime": [(96, 17, 96), (192, 13, 384)],
    "prime-heldout": [(128, 17, 128), (64, 11, 64), (256, 13, 256), (48, 23, 96), (160, 19, 160), (64, 13, 64, 5),
                      (32, 29, 64), (384, 11, 384)],
}
OLD = CStyleRenderer(dataclasses.replace(C_DIALECT, bcast8="", bcast_macro=""))


RULES = {  # --what -> (the rule in codegen.blocked, a stand-in for the default as it was before it)
    "taps": ("tap_chunk", lambda ext, kb: None),
    "strided": ("strided_rows", lambda task, ext: False),
}


@contextlib.contextmanager
def _without(what: str):
    """The default schedule as it was before the ``what`` rule (:data:`RULES`)."""
    rule, off = RULES[what]
    saved = getattr(blocked, rule)
    setattr(blocked, rule, off)
    try:
        yield
    finally:
        setattr(blocked, rule, saved)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="designed")
    ap.add_argument("--what", choices=("bcast", "padx", *RULES), default="bcast")
    ap.add_argument("--event", choices=("cycles", "instructions"), default=None,
                    help="count this per call (felixjax.cycles) instead of timing: A/B on a noisy host")
    args = ap.parse_args(argv)
    target, ratios = Target.cpu(), []
    for shape in SHAPES[args.shapes]:
        task = _conv(*shape)
        arrays = task.random_inputs(0)
        expected = task.reference(*arrays)
        space = Space(task, "conv_nchwc", target)
        plan = lower(space, default_config(space))
        if args.what == "padx":
            padded = Space(task, default_sketch(task, target), target)
            sources = (("old", plan, render(plan)), ("new", lower(padded, default_config(padded)), None))
        elif args.what in RULES:
            space = Space(task, default_sketch(task, target), target)
            with _without(args.what):
                before = lower(space, default_config(space))
            sources = (("old", before, None), ("new", lower(space, default_config(space)), None))
        else:
            sources = (("old", plan, OLD.render(plan)), ("new", plan, render(plan)))
        contenders = {}
        for name, plan, src in sources:
            b = build(src or render(plan))
            if b.status != "ok":
                raise RuntimeError(f"{task.name} ({name}) failed to build: {b.error}")
            contenders[name] = KernelContender(plan, b.lib_path, arrays, threads=args.threads, expected=expected,
                                               name=name)
        same = contenders["old"].lib_path == contenders["new"].lib_path  # the rule did not apply
        if args.what in RULES:
            twin = plain_twin(task)
            twin_arrays = twin.random_inputs(0)
            contenders["onnxruntime"] = ort_contender(twin, twin_arrays, threads=args.threads,
                                                      expected=twin.reference(*twin_arrays))
        for c in contenders.values():
            c.check()
        times = time_interleaved(contenders, rounds=args.rounds, event=args.event)
        for c in contenders.values():
            c.check(run=False)
        old, new = (float(np.median(times[n])) for n in ("old", "new"))
        ratios.append(old / new)
        if args.what == "padx":
            print(f"  exact {contenders['old'].plan.config.dumps()}\n  new   {contenders['new'].plan.config.dumps()}")
        # seconds -> ms and GFLOP/s; cycles -> millions and flop per cycle
        scale, unit, rate, per = (1e3, "ms", 1e9, "GF/s") if args.event is None else (1e-6, f"M{args.event[:3]}", 1, "flop/c")
        ort = float(np.median(times["onnxruntime"])) if "onnxruntime" in times else None
        peer = (f"   onnxruntime {ort * scale:7.3f} {unit}: old {ort / old:.2f}x new {ort / new:.2f}x" if ort else "")
        print(f"{task.name:50s} old {old * scale:7.3f} {unit} {task.flops / old / rate:5.1f} {per}   new {new * scale:7.3f} "
              f"{unit} {task.flops / new / rate:5.1f} {per}   new/old {old / new:.2f}x{'  (same source)' if same else ''}{peer}",
              flush=True)
    print(f"geomean new/old over {len(ratios)} ({args.shapes}, {args.threads} thread(s)): "
          f"{float(np.exp(np.mean(np.log(ratios)))):.2f}x  (min {min(ratios):.2f}x, max {max(ratios):.2f}x)")


if __name__ == "__main__":
    main()
