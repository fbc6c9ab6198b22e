"""Winograd F(4x4, 3x3) next to F(2x2, 3x3) and onnxruntime (issue 14: algorithm choice).

F(2x2, 3x3) does 16 multiplies per 2x2 output tile (4 per output, direct: 9); F(4x4, 3x3) does 36 per
4x4 tile (2.25 per output), with larger transforms, 2.25x the transformed weights of F(2x2) (36 / 16)
and a larger float32 error. This script measures both on the same convs: the untuned default schedule
of each variant (``Space(task, "conv_winograd" | "conv_winograd4").default()``) and the sketch
``default_sketch`` picks (:func:`codegen.winograd.default_variant`), interleaved in one process with
onnxruntime at its default session options, each checked against numpy before and after timing; and
the error of each variant against a float64 direct convolution (max |error| / max |output|).

The shapes: ResNet-18's stride-1 3x3 convs at 224 (the rule was set on these and on the first held-out
run), and convs from other networks not looked at while setting it.

``--networks resnet18:imagenet,vgg16:cifar10,...`` also builds whole zoo models with every task's default
schedule under the F(2x2)-only rule (``MAX_F4_WASTE = 0``) and under the F(4x4) rule, each in NCHW and in
the mixed layout (:func:`felixjax.pipeline.mixed_layout`, chosen per rule from its own builds), plus the
all-NCHW8c build (no Winograd), checks each against onnxruntime and times them interleaved with it.

Run: ``python benchmarks/winograd_f4.py [--threads 1,2] [--rounds 5] [--shapes resnet|heldout|all|none]
[--networks resnet18:imagenet]`` (about 1 minute per thread count and shape set; 2-4 minutes per network
at 224, VGG-16 224 about 8).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from codegen import winograd as wg
from codegen.ops import conv2d
from codegen.space import Space, default_sketch
from codegen.target import Target
from felixjax.baselines import kernel_contender, ort_contender, time_interleaved


def _conv(c: int, h: int, k: int | None = None):
    return conv2d(1, c, h, h, out_channels=k or c, kernel=3, padding=1)


RESNET = {f"{c}x{h}x{h}": _conv(c, h) for c, h in ((64, 56), (128, 28), (256, 14), (512, 7))}
HELDOUT = {f"{c}x{h}x{h}" + (f" k{k}" if k else ""): _conv(c, h, k) for c, h, k in (
    (128, 17, None), (96, 24, None), (32, 112, None), (64, 32, None), (128, 16, None), (256, 8, None),
    (256, 20, None), (48, 40, None), (64, 112, 64), (160, 10, None), (192, 28, 128), (384, 13, 256))}


def rel_error(out: np.ndarray, arrays: list[np.ndarray]) -> float:
    """max |out - conv| / max |conv| against a float64 direct convolution (3x3, padding 1)."""
    x, w = (np.asarray(a, np.float64) for a in arrays[:2])
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))  # n c h w 3 3
    ref = np.einsum("nchwij,kcij->nkhw", win, w)
    return float(np.abs(out - ref).max() / np.abs(ref).max())


def probe(name: str, task, threads: int, rounds: int, target: Target) -> dict:
    arrays = task.random_inputs(0)
    expected = task.reference(*arrays)
    contenders, errors = {}, {}
    for v in (wg.F2, wg.F4) if wg.applies4(task) else (wg.F2,):
        cfg = Space(task, v.sketch, target).default()
        c = kernel_contender(task, cfg, arrays, threads=threads, target=target, expected=expected)
        c.check()
        contenders[f"F({v.m}x{v.m})"] = c
        c()
        errors[f"F({v.m}x{v.m})"] = rel_error(c.output(), arrays)
    contenders["onnxruntime"] = ort_contender(task, arrays, threads=threads)
    times = time_interleaved(contenders, rounds=rounds)
    for c in contenders.values():
        c.check()
    med = {k: float(np.median(t)) for k, t in times.items()}
    pick = default_sketch(task, target).name
    return {"name": name, "med": med, "errors": errors, "pick": pick}


def network_times(model: str, dataset: str, threads: int, rounds: int, target: Target) -> dict[str, float]:
    """Median ms of the default builds under each rule (``f2-*``, ``f4-*``), the NCHW8c build and onnxruntime."""
    import felixjax as fj
    from benchmarks.networks import _mixed_plan
    from felixjax.ort_compare import _ort_session
    from felixjax.ort_compare import time_interleaved as time_blocks
    from felixjax.pipeline import build_model
    from felixjax.zoo import make_model

    proto = make_model(model, dataset=dataset)
    builds, saved = {}, wg.MAX_F4_WASTE
    try:
        for rule, waste in (("f2", 0.0), ("f4", saved)):
            wg.MAX_F4_WASTE = waste
            for layout in ("nchw", "nchwc", "mixed"):  # mixed: the plan networks.py --layout mixed builds
                lay = _mixed_plan(proto, target, threads, None) if layout == "mixed" else layout
                key = "nchwc" if layout == "nchwc" else f"{rule}-{layout}"  # NCHW8c has no Winograd: one build
                builds[key] = build_model(fj.load_onnx(proto, layout=lay), target, threads=threads)
    finally:
        wg.MAX_F4_WASTE = saved
    sess = _ort_session(proto, threads)
    x = np.random.default_rng(0).standard_normal(builds["nchwc"].net.input_shapes[0]).astype(np.float32)
    name = sess.get_inputs()[0].name
    ref = sess.run(None, {name: x})[0]
    timers = {}
    for key, b in builds.items():
        b.set_threads(threads)
        err = float(np.abs(b.run([x])[0] - ref).max() / np.abs(ref).max())
        if not err < 1e-3:
            raise AssertionError(f"{model} {key}: differs from onnxruntime ({err:.2e})")
        ins, outs = b._inputs([x]), b.library.new_outputs()
        timers[key] = (lambda n, b=b, ins=ins, outs=outs: b.library.timeit(ins, outs, n))

    def ort_block(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            sess.run(None, {name: x})
        return time.perf_counter() - t0

    timers["onnxruntime"] = ort_block
    times = time_blocks(timers, rounds=rounds, min_time_s=0.3)
    for key, b in builds.items():  # after timing too
        if not float(np.abs(b.run([x])[0] - ref).max() / np.abs(ref).max()) < 1e-3:
            raise AssertionError(f"{model} {key}: differs from onnxruntime after timing")
    return {k: 1e3 * statistics.median(t) for k, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1", help="comma-separated thread counts (default 1)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", choices=("resnet", "heldout", "all", "none"), default="all")
    ap.add_argument("--networks", default="", help="comma-separated zoo model:dataset pairs, e.g. resnet18:imagenet")
    args = ap.parse_args()
    target = Target.cpu()
    shapes = {**(RESNET if args.shapes in ("resnet", "all") else {}),
              **(HELDOUT if args.shapes in ("heldout", "all") else {})}
    print(f"{platform.processor() or platform.machine()}, {target.cores} cores; medians of {args.rounds} "
          f"interleaved rounds; untuned defaults; onnxruntime at its default session options")
    for threads in (int(t) for t in args.threads.split(",")):
        print(f"\n### {threads} thread(s)\n")
        print("| conv (C x H x W, 3x3, pad 1) | F(2x2) ms | F(4x4) ms | onnxruntime ms | F(4x4) / F(2x2) speed "
              "| default / onnxruntime | default | F(2x2) error | F(4x4) error |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
        ratios = []
        for name, task in shapes.items():
            r = probe(name, task, threads, args.rounds, target)
            m, e = r["med"], r["errors"]
            f2, f4, ort = m.get("F(2x2)"), m.get("F(4x4)"), m["onnxruntime"]
            chosen = {wg.WG_SKETCH: f2, wg.WG4_SKETCH: f4}.get(r["pick"])
            ratio = ort / chosen if chosen else None
            if ratio:
                ratios.append(ratio)
            def ms(x: float | None) -> str:
                return f"{x * 1e3:.3f}" if x else "—"

            speedup = f"{f2 / f4:.2f}x" if f4 else "—"
            print(f"| {name} | {ms(f2)} | {ms(f4)} | {ms(ort)} | {speedup} | "
                  f"{f'{ratio:.2f}x' if ratio else 'not Winograd'} | {r['pick']} | {e['F(2x2)']:.1e} | "
                  f"{e.get('F(4x4)', float('nan')):.1e} |", flush=True)
        if ratios:
            print(f"\ngeomean default / onnxruntime over the {len(ratios)} Winograd defaults: "
                  f"{float(np.exp(np.mean(np.log(ratios)))):.2f}x")
        nets = [n.split(":") for n in args.networks.split(",") if n]
        if nets:
            print("\n| network (default builds) | F(2x2) NCHW | F(2x2) mixed | F(4x4) NCHW | F(4x4) mixed | NCHW8c "
                  "| onnxruntime ms |")
            print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for model, dataset in nets:
            t = network_times(model, dataset, threads, max(args.rounds, 7), target)
            cells = " | ".join(f"{t[k]:.2f} ms ({t['onnxruntime'] / t[k]:.2f}x)"
                               for k in ("f2-nchw", "f2-mixed", "f4-nchw", "f4-mixed", "nchwc"))
            print(f"| {model} {dataset} | {cells} | {t['onnxruntime']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
