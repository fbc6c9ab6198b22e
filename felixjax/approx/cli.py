"""``felixjax approx``: the command-line face of :func:`felixjax.approx.search.approximate`.

Example:
    felixjax approx model.onnx --data data.npz --budget 0.01 --trials 200 -o out/
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

EXAMPLE = """example:
  felixjax approx model.onnx --data data.npz --budget 0.01 --trials 200 -o out/
  felixjax approx model.onnx --data data.npz --int8 --sparsity 0.5,0.9 -o out/
  (data.npz holds x: samples of the model's input shape, and y: integer labels; without y use
   --metric fidelity)"""


def sparsity_levels(text: str) -> tuple[float, ...]:
    """``"0.5,0.9"`` -> ``(0.5, 0.9)`` (``--sparsity``); anything else is one clear argparse error.

    Example:
        >>> sparsity_levels("0.9, 0.5")
        (0.5, 0.9)
    """
    from .formats import check_sparsities

    try:
        return check_sparsities([float(v) for v in text.split(",") if v.strip()])
    except ValueError as e:
        why = str(e) if "fraction" in str(e) else "not a comma-separated list of fractions in (0, 1)"
        raise argparse.ArgumentTypeError(f"{text!r}: {why}") from None


def add_parser(add: Callable[[str, str], argparse.ArgumentParser],
               model_inputs: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """Register the ``approx`` subcommand (``add`` is cli.py's subparser factory, ``model_inputs`` adds its
    ``--input-shape`` / ``--input-value`` options)."""
    a = add("approx", "prune each conv / dense layer's channels (and pick its precision / sparsity) under "
                      "a quality budget, in one objective with the schedules; every reported figure is measured "
                      "on the C build")
    a.add_argument("model", help="the ONNX model (one input)")
    a.add_argument("--data", required=True, metavar="NPZ", help="x (inputs) and, for accuracy, y (labels)")
    if model_inputs is not None:
        model_inputs(a)
    a.add_argument("--budget", type=float, default=0.01, help="allowed absolute drop of the metric (default 0.01)")
    a.add_argument("--holdout", default=None, metavar="NPZ",
                   help="data the search never sees (as --data): the chosen network is checked on it at the end "
                        "(without it every quality figure is in-sample)")
    a.add_argument("--metric", default="accuracy", help="accuracy | fidelity (default accuracy)")
    a.add_argument("--output-name", default=None, help="the model output the metric reads (default: the first)")
    a.add_argument("--trials", type=int, default=200, help="tuning budget over the whole run (default 200; 0: the default schedules, no tuning)")
    a.add_argument("--rounds", type=int, default=4, help="measured rounds (quality evaluations) (default 4)")
    a.add_argument("--finetune", type=int, default=0, metavar="STEPS",
                   help="fine-tune the pruned weights in JAX for this many steps (default 0: off)")
    a.add_argument("--search", default="front", choices=("front", "descent"),
                   help="front (default): descent rounds, then the Pareto-front search from uniform seeds; descent: rounds only")
    a.add_argument("--measure", type=int, default=6, help="front search: local-search points built and measured (default 6)")
    a.add_argument("--int8", action="store_true",
                   help="layers may also run at int8 (precisions float32 and int8; tunes each layer's int8 twin too)")
    a.add_argument("--float16", action="store_true",
                   help="layers may also run at float16 (storage float16, float32 accumulation; on CPUs without "
                        "float16 arithmetic usually slower: the measured ratios decide)")
    a.add_argument("--sparsity", type=sparsity_levels, default=(), metavar="S[,S...]",
                   help="layers may also run sparse at these levels, e.g. 0.5,0.9: that fraction of a layer's "
                        "weights (smallest magnitudes) zeroed, a sparse float32 kernel (default: none)")
    a.add_argument("--multiple", type=int, default=None, metavar="N",
                   help="pruned channel counts are multiples of N (default: the SIMD width in floats, 16 on AVX-512); "
                        "a layer of N channels or fewer has nothing to prune")
    a.add_argument("--strategy", default=None, help="tuning strategy: gradient | genetic | random")
    a.add_argument("--db", default=None, help="tuning database (default: in memory)")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--threads", type=int, default=None, help="threads per kernel (default: all cores)")
    a.add_argument("-o", "--output", required=True, metavar="DIR", help="folder for the standalone C build, approx.json and approx.png")
    a.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _load_npz(path: str, metric: str, user_error: type[Exception]) -> tuple:
    """``(x, y)`` or ``(x,)`` of an ``.npz`` file (never a pickle)."""
    import numpy as np

    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"PK\x03\x04":  # np.savez writes a zip; anything else (an .npy, a pickle, a model) is refused here
        raise user_error(f"{path}: not an .npz file (write one with np.savez(path, x=inputs, y=labels))")
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise user_error(f"{path}: not a readable .npz file ({e})") from None
    if "x" not in npz.files:
        raise user_error(f"{path} has no array 'x' (it has {npz.files})")
    if "y" not in npz.files and metric == "accuracy":
        raise user_error(f"{path} has no labels 'y' for --metric accuracy (it has {npz.files}); add y to the "
                         "file, or use --metric fidelity (agreement with the float32 model's outputs)")
    return (npz["x"], npz["y"]) if "y" in npz.files else (npz["x"],)


def run(args: argparse.Namespace, user_error: type[Exception]) -> int:
    """Run ``felixjax approx``; bad input raises ``user_error`` (one line, exit code 2)."""
    from codegen.target import Target

    from .search import approximate

    holdout = getattr(args, "holdout", None)
    for path in (args.model, args.data) + ((holdout,) if holdout else ()):
        if not os.path.exists(path):
            raise user_error(f"{path}: no such file")
    data = _load_npz(args.data, args.metric, user_error)
    held = _load_npz(holdout, args.metric, user_error) if holdout else None
    if args.budget < 0:
        raise user_error(f"--budget must be >= 0 (got {args.budget})")
    if args.multiple is not None and args.multiple < 1:
        raise user_error(f"--multiple must be >= 1 (got {args.multiple})")
    target = Target.cpu(cores=args.threads) if args.threads else Target.cpu()
    model: Any = args.model
    shapes, values = dict(getattr(args, "input_shape", None) or []), dict(getattr(args, "input_value", None) or [])
    if shapes or values:  # a model with dynamic dimensions, pinned as tune / build pin them
        from ..onnx_import import load_onnx

        model = load_onnx(args.model, input_shapes=shapes or None, input_values=values or None)
    res = approximate(model, target, data=data, quality_budget=args.budget, metric=args.metric,
                      output=args.output_name, trials=args.trials, db=args.db, seed=args.seed, rounds=args.rounds,
                      strategy=args.strategy, finetune_steps=args.finetune, progress=not args.quiet,
                      search=args.search, measure=args.measure, multiple=args.multiple,
                      precisions=precisions_of(args), sparsities=args.sparsity, holdout=held)
    out = res.export(args.output)
    summary = {"speedup": res.speedup, "quality_loss": res.quality_loss, "baseline_latency_s": res.baseline_latency_s,
               "latency_s": res.latency_s, "baseline_quality": res.baseline_quality, "quality": res.quality,
               "quality_evals": res.quality_evals, "search_evals": res.search_evals, "samples": res.samples,
               "retimed": res.retimed, "heldout_samples": res.heldout_samples,
               "heldout_baseline_quality": res.heldout_baseline_quality, "heldout_quality": res.heldout_quality,
               "heldout_loss": res.heldout_loss,
               "front": [{"keep": list(p.keep), "formats": list(p.formats), "speedup": p.speedup, "quality": p.quality}
                         for p in res.front], "excluded": list(res.excluded),  # (channels alone repeated)
               "pareto": [p.__dict__ | {"keep": list(p.keep)} for p in res.pareto],
               "layers": [d.__dict__ for d in res.layers]}
    with open(os.path.join(out, "approx.json"), "w") as f:
        json.dump(_finite(summary), f, indent=1, default=str)  # strict JSON: NaN / inf as null
    print(res.table(holdout_hint="--holdout NPZ"))
    if len(res.pareto) <= 1 and args.budget == 0:
        print("note: --budget 0 keeps the exact float32 network (nothing is searched)")
    elif len(res.pareto) <= 1:
        print(f"note: only the float32 baseline was built: with channel counts rounded to multiples of "
              f"{args.multiple or int(target.simd_lanes)} (--multiple) and no other format asked for (--int8, "
              "--float16, --sparsity), no layer had anything to approximate")
    print(f"standalone C build: {out}; the points: {plot_points(res, os.path.join(out, 'approx.png'))}",
          file=sys.stderr)
    return 0


def plot_points(res: Any, path: str) -> str:
    """PNG: every measured network (speedup over the float32 build timed beside it, quality loss), the front
    and the quality budget marked, the chosen one circled. Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    front = set(map(id, res.front))
    for k, method in enumerate(sorted({p.method for p in res.pareto})):
        pts = [p for p in res.pareto if p.method == method]
        ax.scatter([p.speedup for p in pts], [p.quality_loss for p in pts], s=[36 if id(p) in front else 14 for p in pts],
                   color=f"C{k}", label=method, alpha=0.85, zorder=3)
    if res.front:
        ax.plot([p.speedup for p in res.front], [p.quality_loss for p in res.front], color="grey", lw=0.8, zorder=2,
                marker="D", ms=9, mfc="none", label="front (no point beats them)")
    ax.axhline(res.quality_budget, color="red", ls=":", lw=1, label=f"budget ({res.quality_budget:g})")
    chosen = res.chosen if res.chosen is not None else next((p for p in res.pareto if p.method == "float32"), None)
    if chosen is not None:  # no point within the budget beat the float32 build: it is the choice
        ax.scatter([chosen.speedup], [chosen.quality_loss], s=140, facecolors="none", edgecolors="black",
                   zorder=4, label=f"chosen ({chosen.speedup:.2f}x)")
    ax.set_xlabel("speedup over the float32 build (timed beside each point)")
    ax.set_ylabel(f"{res.metric} loss (lower is better)")
    ax.set_title(f"measured networks: {len(res.pareto)}; baseline {res.baseline_latency_s * 1e3:.4g} ms, "
                 f"{res.metric} {res.baseline_quality:.4g}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _finite(v: Any) -> Any:
    """``v`` with every non-finite float (a point whose time was not measured) as None (strict JSON)."""
    # imported here, not with the module: the CLI's parser loads this module on every command
    from ..database import finite_json

    return finite_json(v)


def precisions_of(args: Any) -> tuple[str, ...]:
    """The ``precisions=`` of ``--int8`` / ``--float16`` (float32 always)."""
    return ("float32",) + (("int8",) if args.int8 else ()) + (("float16",) if getattr(args, "float16", False) else ())
