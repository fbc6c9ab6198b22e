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

Run: ``python benchmarks/winograd_f4.py [--threads 1,2] [--rounds 5] [--shapes resnet|heldout|all]``
(about 1 minute per thread count and shape set).
"""
from __future__ import annotations

import argparse
import platform

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1", help="comma-separated thread counts (default 1)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", choices=("resnet", "heldout", "all"), default="all")
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


if __name__ == "__main__":
    main()
