"""Command-line glue of the whole-network commands (``felixjax tune model.onnx``, ``felixjax build``)."""
from __future__ import annotations

import hashlib
import json
import shlex
import sys
from pathlib import Path
from typing import Any


from codegen.target import Target

from .onnx_import import load_onnx
from .network_tune import _round_progress
from .pipeline import build_model, choose_layout, tune_model
from .ort_compare import compare_onnxruntime


def _load(args: Any, target: Target):
    """The model of a tune / build command, in its ``--layout`` (``auto``: :func:`choose_layout` measures
    NCHW, NCHW8c and a per-conv mix with default schedules and says which it keeps; ``tune`` stores the
    choice in its database, and a later ``--layout auto`` with that database builds in it again rather
    than choosing anew by timing, which could pick a layout whose tasks were never tuned)."""
    options = {"input_shapes": dict(getattr(args, "input_shape", None) or []) or None,
               "input_values": dict(getattr(args, "input_value", None) or []) or None}
    layout = getattr(args, "layout", "nchw")
    if layout == "auto":
        key, db = _layout_key(args.model, options), getattr(args, "db", None)
        stored = _stored_layout(db, key)
        if stored is not None:
            layout = stored
            print(f"layout: {_describe(layout)} (chosen when {db} was tuned with --layout auto)")
        else:
            layout, times = choose_layout(args.model, target, threads=getattr(args, "threads", None),
                                          winograd=not getattr(args, "no_winograd", False), **options)
            if times:
                print("layout: " + ", ".join(f"{k} {1e3 * v:.4g} ms" for k, v in times.items())
                      + f" (default schedules): {_describe(layout)}")
            if getattr(args, "cmd", None) == "tune" and db:
                from .database import Database

                with Database(db) as d:
                    d.set_meta(key, json.dumps(layout, sort_keys=True))
    return load_onnx(args.model, layout=layout, **options)


def _describe(layout: str | dict) -> str:
    return layout if isinstance(layout, str) else (
        f"per conv ({sum(v == 'nchw' for v in layout.values())} NCHW: "
        f"{', '.join(sorted(k for k, v in layout.items() if v == 'nchw'))}; every other conv NCHW8c)")


def _layout_key(model: str, options: dict) -> str:
    """The database key of a model's ``--layout auto`` choice: its bytes and import options."""
    digest = hashlib.sha256(Path(model).read_bytes())
    digest.update(json.dumps(options, sort_keys=True, default=str).encode())
    return "layout:" + digest.hexdigest()[:24]


def _stored_layout(db: str | None, key: str) -> str | dict | None:
    if not db or not Path(db).exists():
        return None
    from .database import Database

    with Database(db, readonly=True) as d:
        value = d.get_meta(key)
    return None if value is None else json.loads(value)


def tune_model_cli(args: Any, target: Target) -> int:
    """``felixjax tune model.onnx --trials N --db runs.db``: tune, print the summary table, build the
    model and (unless ``--no-compare``) check and time it against onnxruntime."""
    from .strategies.base import cost_model_options

    model = _load(args, target)
    if not model.tasks:
        print(f"{model.name}: no op maps to a tunable task (Conv, and Gemm / MatMul with constant weights in the "
              f"forms the importer fuses); its ops run as generic kernels, so nothing was tuned and no database "
              f"written: build it with `felixjax build {args.model} -o DIR` (no --db)")
        return 0
    quiet = getattr(args, "quiet", False)
    if not quiet:
        print(f"{model.name}: {len(model.tasks)} tasks, {sum(w for _, w in model.tasks)} anchor ops; budget "
              f"{args.trials} trials ({args.strategy})", file=sys.stderr, flush=True)
    res = tune_model(model, target, trials=args.trials, db=args.db, strategy=args.strategy, seed=args.seed,
                     seconds=args.seconds, threads=args.threads, progress=False if quiet else _round_progress,
                     strategy_options=cost_model_options(args.strategy, getattr(args, "cost_model", None)),
                     runner=getattr(args, "runner", None), cost_aware=getattr(args, "cost_aware", None),
                     in_network=getattr(args, "in_network", 3), winograd=not getattr(args, "no_winograd", False))
    print(res.table())
    if res.selection is not None:
        print("\nschedules chosen inside the network:\n" + res.selection.table())
    print(f"\n{res.trials} trials in the run (earlier calls' included), {res.wall_s:.0f} s in this call; "
          f"records in {args.db}")
    if target.is_gpu:  # a simulated GPU has no network build to run: the tuned records are the result
        return 0
    exe = res.build(threads=args.threads)
    if getattr(args, "show_source", False):
        print(exe.source)
    if getattr(args, "input_value", None) and not getattr(args, "no_compare", False):
        print("(onnxruntime comparison skipped: --input-value inputs are constants here, onnxruntime would need "
              "them fed)")
    elif not getattr(args, "no_compare", False):
        cmp = compare_onnxruntime(exe, args.model, threads=args.threads or target.cores)
        n = cmp["threads"]
        print(f"end to end ({n} thread{'s' if n != 1 else ''}): felixjax {cmp['felixjax_ms']:.4g} ms, onnxruntime "
              f"{cmp['onnxruntime_ms']:.4g} ms (x{cmp['speedup']:.2f}); outputs agree to "
              f"{cmp['max_rel_err']:.1e}")
    return 0


def build_model_cli(args: Any, target: Target) -> int:
    """``felixjax build model.onnx --db runs.db -o out/``: build from the database's best records, check
    the library against the numpy reference on a random input, export the standalone folder."""
    model = _load(args, target)
    if getattr(args, "db_found", False):
        print("using runs.db (felixjax tune's default database; --db none: default schedules only)",
              file=sys.stderr)
    exe = build_model(model, target, db=args.db, threads=args.threads,
                      winograd=not getattr(args, "no_winograd", False))
    if not args.no_check:
        exe.check()  # random inputs against the numpy reference
    out = exe.export(args.output, prefix=getattr(args, "prefix", "fj_model_"))
    print(exe.summary())
    if getattr(args, "report", False):
        print(exe.layer_report())
    print(f"wrote {out}/ (model.c, model.h, main.c, Makefile, weights.bin, README.txt); build it with `make -C {shlex.quote(str(out))}`")
    return 0
