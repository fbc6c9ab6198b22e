"""The ``felixjax`` command line: tune, compare, build, zoo, report, pretrain, approx, cache.

Errors in user input are one clear line on stderr and exit code 2, never a traceback.

Example:
    felixjax tune --op "conv2d:n=1,c=64,h=56,w=56,k=64,r=3,stride=1,pad=1" --trials 256 --db runs.db
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import select
import signal
import sys
import threading
import warnings
from typing import Any

EXAMPLES = {
    "tune": """examples:
  felixjax tune --op "matmul:m=512,n=512,k=512" --trials 64 --db runs.db
  felixjax tune --op "conv2d:n=1,c=64,h=56,w=56,k=64,r=3,stride=1,pad=1" --trials 256 --db runs.db
  felixjax tune model.onnx --trials 2000 --db runs.db""",
    "report": """example:
  felixjax report runs.db --plot curve.png""",
    "compare": """example:
  felixjax compare --suite ops --seeds 3 --trials 256 --threads 1 --reference --run-caches --out results/""",
    "pretrain": """example:
  felixjax pretrain runs.db other.db -o cost_model.npz --exclude matmul_512x512x512
  felixjax tune --op "matmul:m=512,n=512,k=512" --cost-model cost_model.npz""",
    "build": """example:
  felixjax build model.onnx --db runs.db -o out/""",
    "approx": """example:
  felixjax approx model.onnx --data data.npz --budget 0.01 --trials 200 -o out/""",
    "zoo": """example:
  felixjax zoo resnet18 --dataset cifar10 -o resnet18.onnx""",
}


class UserError(Exception):
    """A mistake in the command line or its inputs: reported in one line, exit code 2."""


class _Version(argparse.Action):
    """``--version``: the installed version, looked up only when asked (importlib.metadata costs ~50 ms)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the installed version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        from . import __version__

        print(f"felixjax {__version__}")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="felixjax", description="JAX-native tensor program optimizer: gradient "
                                "descent over relaxed schedules of real, measured C kernels.")
    p.add_argument("--version", action=_Version)
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (repeatable; found on the Python path or in the current folder): a "
                        "module that registers a strategy makes its name usable here, e.g. "
                        "`felixjax --plugin mystrat compare --strategies mine,genetic ...`")
    sub = p.add_subparsers(dest="cmd", required=True)

    def add(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, epilog=EXAMPLES.get(name),
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    t = add("tune", "tune operators (--op SPEC) or every task of an ONNX model")
    t.add_argument("model", nargs="?", help="an ONNX model to tune (instead of --op)")
    _model_input_args(t)
    t.add_argument("--layout", choices=("nchw", "nchwc", "auto"), default="nchw",
                   help="the convolutions' layout: nchw (default), nchwc (channel-blocked NCHW8c from one conv "
                        "to the next) or auto (both, and each conv in the layout it ran faster in, built with default "
                        "schedules and timed, the fastest kept); "
                        "tune and build with the same")
    t.add_argument("--op", action="append", default=[], metavar="SPEC",
                   help='operator spec KIND:key=value,... e.g. "matmul:m=512,n=512,k=512" (repeatable)')
    t.add_argument("--trials", type=int, default=256,
                   help="measurement budget per operator, or in total over a model's tasks (default 256; "
                        "a model with 0: only re-time its best records beside the current default schedules)")
    t.add_argument("--seconds", type=float, default=None,
                   help="wall-clock budget per operator, or in total over a model's tasks (whichever of --trials and "
                        "--seconds ends first)")
    t.add_argument("--strategy", default=None, help="gradient | genetic | random (default gradient)")
    t.add_argument("--db", default="runs.db", help="SQLite database of measurements (default runs.db)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=None, help="threads per kernel (default: all cores)")
    from codegen.cuda.specs import SPECS

    t.add_argument("--target", default="cpu", metavar="cpu|cuda-sim:GPU",
                   help=f"this CPU (default) or a simulated GPU (timed by felixjax's model, no GPU runs): "
                        f"cuda-sim:{', '.join(SPECS)}")
    t.add_argument("--no-compare", action="store_true", help="skip timing onnxruntime next to the best kernel")
    t.add_argument("--show-source", action="store_true", help="print the best kernel's C source")
    t.add_argument("--cost-model", default=None, metavar="NPZ",
                   help="start the search's cost model from this pretrained checkpoint (felixjax pretrain); "
                        "'packaged': the one shipped with felixjax (the default on CPU targets, 'auto'); 'none': "
                        "none, the roofline prior first")
    t.add_argument("--quiet", action="store_true", help="no progress lines on stderr (for scripts)")
    t.add_argument("--dask", default=None, metavar="local|ADDRESS", help=_DASK_HELP)
    t.add_argument("--early-stop", default=None, metavar="calibrated|T",
                   help="cost-aware early stop (off by default): 'calibrated' (the plateau rule picked on held-out "
                        "tasks: never before half the budget, then at the first round whose last 64 trials did not "
                        "improve), or an expected gain per trial T (-log latency; the ensemble rule)")
    t.add_argument("--filter-p", type=float, default=None, metavar="P",
                   help="cost-aware filtering (off by default): skip candidates less likely than P to beat the best")
    t.add_argument("--in-network", type=int, default=3, metavar="K",
                   help="a model's tasks: after tuning, build the network with each task's best config of its K "
                        "fastest sketch families and keep, per task, the one whose layers ran fastest inside the "
                        "network (default 3; 0: off)")
    t.add_argument("--no-winograd", action="store_true",
                   help="a model's tasks: tune and build no Winograd convolution (its sketches are left out of the "
                        "search): Winograd's error follows the largest input of its tile")

    r = add("report", "summarize a tuning database: tasks, trials, statuses, each run's best while tuning (best_ms, "
                      "a minimum over noisy timings) and re-timed at its end (retimed_ms, what fj.tune reports)")
    r.add_argument("db", help="the tuning database (an SQLite file written by felixjax tune / compare)")
    r.add_argument("--plot", default=None, help="write the tuning curves to this PNG (.png added when the name has "
                                                 "no suffix)")

    c = add("compare", "compare search strategies on operators: same budgets, interleaved, several seeds")
    from .suites import SUITES

    c.add_argument("--suite", default=None, help=f"a named operator suite: {', '.join(sorted(SUITES))} "
                                                  "(see felixjax/suites.py)")
    c.add_argument("--op", action="append", default=[], metavar="SPEC", help="operator spec (repeatable)")
    c.add_argument("--strategies", default=None,
                   help="comma-separated strategy names (default: gradient,genetic@32,genetic,random: genetic at the "
                        "gradient search's batch and at Ansor's 64, those registered); NAME@N runs that strategy at N "
                        "candidates per round")
    c.add_argument("--seeds", type=int, default=3, help="seeds per strategy and operator (default 3)")
    c.add_argument("--trials", type=int, default=512, help="trial budget of every run (default 512)")
    c.add_argument("--seconds", type=float, default=None, help="seconds budget of every run (whichever ends first)")
    c.add_argument("--out", required=True, metavar="DIR", help="folder for cmp.csv, table.md, curves.png, cmp.db")
    c.add_argument("--replay", action="store_true",
                   help="no hardware: replay each operator's synthetic latency oracle (search logic only)")
    c.add_argument("--threads", type=int, default=None, help="threads per kernel (default: all cores)")
    c.add_argument("--cost-model", default=None, metavar="NPZ",
                   help="pretrained cost model (felixjax pretrain) for every strategy that has one (gradient, "
                        "genetic): both start from the same model")
    c.add_argument("--warmup", type=int, default=None, metavar="N",
                   help="trials per strategy of a throwaway replayed run on the first operator (min(N, 32) on each other) "
                        "before the runs, so that no run's clock pays the one-off JAX compilations (default: 64, "
                        "--replay too: a replayed run's seconds are its simulated trials plus its real search time; "
                        "0: off)")
    c.add_argument("--reference", action="store_true",
                   help="judge '95%% of best' against reference runs of every strategy x seed at 2x the budget "
                        "(under reserved run names no compared run sees; triples the time) instead of the compared "
                        "runs' own best")
    c.add_argument("--run-caches", action="store_true",
                   help="every run compiles into its own build cache (OUT/caches/): no run gets a kernel another "
                        "run compiled for free, so seconds to 95%% compare fairly (default: one shared cache; not used with "
                        "--replay)")
    c.add_argument("--quiet", action="store_true", help="no progress lines on stderr (for scripts)")
    c.add_argument("--dask", default=None, metavar="local|ADDRESS", help=_DASK_HELP)

    pt = add("pretrain", "pretrain the MLP cost model on the measurements of tuning databases (other tasks), "
                         "holding whole tasks out to measure transfer")
    pt.add_argument("db", nargs="+", help="tuning databases to learn from (or .jsonl.gz datasets such as the packaged "
                                          "felixjax/data/pretrain_cpu.jsonl.gz)")
    pt.add_argument("-o", "--output", required=True, metavar="NPZ", help="checkpoint to write (and NPZ.json report)")
    pt.add_argument("--exclude", action="append", default=[], metavar="TASK",
                    help="task name to leave out, e.g. one a comparison will tune (repeatable)")
    pt.add_argument("--holdout", type=float, default=0.2, help="share of whole tasks held out (default 0.2)")
    pt.add_argument("--seed", type=int, default=0)
    pt.add_argument("--min-records", type=int, default=16, metavar="N",
                    help="leave out tasks with fewer than N distinct correctly measured configs (default 16; "
                         "the ones left out are listed)")

    b = add("build", "compile an ONNX model into one C library from its best tuned schedules and export a "
                     "standalone folder (C source, header, Makefile, weights) that builds with make")
    b.add_argument("model", help="the ONNX model")
    _model_input_args(b)
    b.add_argument("--layout", choices=("nchw", "nchwc", "auto"), default="nchw",
                   help="the convolutions' layout: nchw (default), nchwc (channel-blocked NCHW8c from one conv "
                        "to the next) or auto (both, and each conv in the layout it ran faster in, built with default "
                        "schedules and timed, the fastest kept); "
                        "tune and build with the same")
    b.add_argument("--db", default=None, help="tuning database (default: runs.db when it exists, as felixjax tune "
                                             "writes it; 'none': every task gets its default schedule)")
    b.add_argument("-o", "--output", required=True, metavar="DIR", help="folder to write the build into")
    b.add_argument("--threads", type=int, default=None, help="OpenMP threads of the build (default: all cores)")
    b.add_argument("--no-check", action="store_true", help="skip checking the build against the numpy reference")
    b.add_argument("--no-winograd", action="store_true",
                   help="no Winograd convolution (each takes its best other tuned schedule, else the direct "
                        "default): Winograd's error follows the largest input of its tile, so inputs with "
                        "outliers lose accuracy")
    b.add_argument("--prefix", default="fj_model_", metavar="NAME_",
                   help="prefix of the exported C symbols, a C identifier not starting with '_' (default fj_model_; "
                        "another lets two networks link into one program)")
    b.add_argument("--quiet", action="store_true", help="no progress lines on stderr (for scripts)")
    b.add_argument("--report", action="store_true",
                   help="print per layer whether it runs tuned, default or generic and its share of the time")

    from .approx import cli as approx_cli

    approx_cli.add_parser(add, _model_input_args)
    from . import cache_cli

    cache_cli.add_parser(add)

    z = add("zoo", "write a zoo model (seeded random weights) as ONNX")
    z.add_argument("name", help="resnet18 | mobilenet_v2 | vgg16 | transformer_block")
    z.add_argument("--dataset", default=None, help="the CNNs' input size and classes: cifar10 (32x32, the default) | "
                                                   "imagenet (224x224)")
    z.add_argument("--batch", type=int, default=1, help="the model's batch (default 1)")
    for opt, default in (("seq", 128), ("dim", 256), ("heads", 4)):
        z.add_argument(f"--{opt}", type=int, default=None, help=f"transformer_block only: {opt} (default {default})")
    z.add_argument("--seed", type=int, default=0)
    z.add_argument("-o", "--output", required=True, help="output .onnx path")

    return p


_DASK_HELP = ("build and measure on a Dask cluster: 'local' (a LocalCluster of worker processes) or a "
              "scheduler address such as tcp://host:8786 (workers: dask worker ADDRESS --nthreads 1 "
              "--resources device=1)")


@contextlib.contextmanager
def _runner(args: argparse.Namespace):
    """The runner of --dask (None: the local runner); a lost scheduler is a one-line error."""
    if not getattr(args, "dask", None):
        yield None
        return
    from .dask_runner import ClusterError, connect

    try:
        with connect(args.dask) as runner:
            yield runner
    except (ClusterError, ImportError) as e:
        raise UserError(str(e)) from None


def _cmd_zoo(args: argparse.Namespace) -> int:
    from . import zoo

    if args.name not in zoo.MODELS:
        raise UserError(f"unknown zoo model {args.name!r}; available: {', '.join(zoo.MODELS)}")
    options = {k: getattr(args, k) for k in ("seq", "dim", "heads") if getattr(args, k) is not None}
    if args.name == "transformer_block" and args.dataset is not None:
        raise UserError("--dataset sets the CNNs' input size; transformer_block takes --seq, --dim and --heads")
    if args.name != "transformer_block" and options:
        raise UserError(f"--{', --'.join(options)}: transformer_block options; {args.name} takes --dataset")
    if args.batch < 1 or any(v < 1 for v in options.values()):
        raise UserError("--batch, --seq, --dim and --heads must be >= 1")
    try:
        path = zoo.save(args.name, args.output, dataset=args.dataset or "cifar10", seed=args.seed, batch=args.batch,
                        **options)
    except ValueError as e:
        raise UserError(str(e)) from None
    print(f"wrote {path}")
    return 0


def _target(threads: int | None, name: str = "cpu"):
    from codegen.target import Target

    try:
        return Target.parse(name)
    except ValueError as e:
        raise UserError(str(e).replace("unknown target", "unknown --target")) from None


def _cmd_tune(args: argparse.Namespace) -> int:
    import felixjax as fj
    from felixjax.database import UPPER_BOUND

    if args.model and args.op:
        raise UserError("give either a model file or --op specs, not both")
    if not args.model and not args.op:
        raise UserError("nothing to tune: give --op SPEC or a model.onnx (see felixjax tune --help)")
    if args.op and getattr(args, "no_winograd", False):
        raise UserError("--no-winograd applies to a model's tasks (their search and build); an --op is tuned over "
                        "every sketch")
    if args.strategy is None:
        args.strategy = "gradient" if "gradient" in fj.strategies() else "random"
    if args.strategy not in fj.strategies():
        raise UserError(f"unknown strategy {args.strategy!r}; registered: {', '.join(fj.strategies())}")
    target = _target(args.threads, args.target)
    args.cost_aware = _cost_aware(args.early_stop, args.filter_p)
    ca = args.cost_aware
    if ca is not None and ca.early_stop is not None and args.op and args.trials <= ca.warmup:
        print(f"felixjax tune: note: --early-stop waits for {ca.warmup} correct trials: with --trials {args.trials} "
              f"it cannot stop a run early", file=sys.stderr)
    args.no_compare = args.no_compare or target.is_gpu  # onnxruntime runs on this CPU, not the simulated GPU
    if target.is_gpu and args.dask:  # the GPU simulator builds, checks and simulates in this process
        print(f"felixjax tune: note: --dask is not used for {args.target} (the GPU simulator runs in this process)",
              file=sys.stderr)
        args.dask = None
    if args.model:
        with _runner(args) as args.runner:
            return _tune_model(args, target)
    try:
        tasks = [fj.ops.parse_spec(s) for s in args.op]
    except ValueError as e:
        raise UserError(str(e)) from None
    rows = []
    options = _cost_model_options(args.strategy, args.cost_model)
    with _runner(args) as runner, warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*no correct kernel timed cleanly", RuntimeWarning)  # said below, per task
        results = [fj.tune(task, target, args.strategy, trials=args.trials, seconds=args.seconds, db=args.db,
                           seed=args.seed, threads=args.threads, strategy_options=options, progress=not args.quiet,
                           runner=runner, cost_aware=args.cost_aware) for task in tasks]
    for task, res in zip(tasks, results):
        if res.stop_reason == "early_stop":
            print(f"{task.name}: stopped early (cost-aware) after {len(res.history)} of {args.trials} trials")
        noisy = sum(r.status == "noisy" for r in res.history)
        if noisy:  # the machine was busy: those timings are upper bounds, the search saw a distorted landscape
            print(f"{task.name}: note: {noisy} of {len(res.history)} timings were disturbed (`noisy`: another "
                  f"process used the CPU while they ran; load average {os.getloadavg()[0]:.2f}); tune on a quiet "
                  f"machine for a result to trust")
        best = res.best
        if best is None:
            print(f"{task.name}: no correct kernel among {len(res.history)} trials ({res.status_counts()})")
            continue
        during = res.best_while_tuning
        bound = best.result.error == UPPER_BOUND  # every timing of it disturbed (Database.as_bound)
        retimed = best is not during and during is not None and target.kind != "cuda-sim" and not bound
        print(f"\n{task.name}: best of {len(res.history)} trials ({args.strategy}): "
              f"{'<= ' if bound else ''}{_ms(best.latency_s)}, {'>= ' if bound else ''}{best.gflops:.1f} GFLOP/s"
              + (" (every timing of it was disturbed: an upper bound)" if bound else "")
              + (f" (timed again at the end of the run; {_ms(during.latency_s)} while tuning, the minimum over "
                 "noisy timings that `felixjax report` lists)" if retimed else "")
              + (f" (simulated: felixjax's model of the {target.spec.full_name}, no GPU ran)"
                 if target.kind == "cuda-sim" else ""))
        print(f"  config: {best.config.dumps()}")
        print(_time_split(res.stats))
        if args.show_source:
            print(res.source)
        row = {"task": task.name, "felixjax_ms": best.latency_s * 1e3, "gflops": best.gflops}
        if not args.no_compare:
            row.update(_against_onnxruntime(res, args.threads or target.cores))
        rows.append(row)
    if rows:
        from .report import text_table

        print("\n" + text_table(rows))
        if any("felixjax_median_ms" in r for r in rows):
            print("felixjax_ms: the best kernel's time above; felixjax_median_ms and onnxruntime_ms: medians of the "
                  "two timed side by side just now (same threads, interleaved)")
    return 0


def _time_split(st: dict) -> str:
    """Where a tuning call's seconds went (``fj.tune``'s ``res.stats``), as one line."""
    parts = {"building and measuring": st.get("build_measure_s", 0.0), "proposing": st.get("propose_s", 0.0),
             "learning": st.get("update_s", 0.0), "re-timing the best": st.get("retime_s", 0.0)}
    rest = max(0.0, st.get("call_s", 0.0) - sum(parts.values()))
    return (f"  time: {st.get('call_s', 0.0):.1f} s in this call: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in parts.items()) + f", other {rest:.1f} s; of all that, JAX "
            f"compilations {st.get('jax_compile_s', 0.0):.1f} s (once per process, then from the disk cache)")


def _ms(seconds: float) -> str:
    """A latency in ms with 4 significant digits (tiny kernels are not '0.0000 ms')."""
    return f"{seconds * 1e3:.4g} ms"


def _cost_aware(early_stop: str | None, filter_p: float | None):
    """``--early-stop`` / ``--filter-p`` as :class:`~felixjax.cost_aware.CostAware` options (None: off)."""
    from .cost_aware import CostAware

    if early_stop is None and filter_p is None:
        return None
    try:
        if early_stop == "calibrated":
            return CostAware.calibrated(filter_p=filter_p)
        try:
            threshold = float(early_stop) if early_stop is not None else None
        except ValueError:
            raise UserError(f"--early-stop takes 'calibrated' or a number (got {early_stop!r})") from None
        return CostAware(filter_p=filter_p, early_stop=threshold)
    except ValueError as e:  # in the command line's names
        raise UserError(str(e).replace("early_stop", "--early-stop").replace("filter_p", "--filter-p")
                        .replace(" or None", "")) from None


def _against_onnxruntime(res, threads: int) -> dict:
    """Time the best kernel and onnxruntime interleaved, same thread count."""
    try:
        from . import baselines
    except ImportError:  # pragma: no cover
        return {}
    try:
        cmp = baselines.compare_best(res, threads=threads)
    except Exception as e:  # a missing peer must not lose the tuning result
        print(f"  (onnxruntime comparison skipped: {e})", file=sys.stderr)
        return {}
    return cmp


def _tune_model(args: argparse.Namespace, target) -> int:
    try:
        from .network import tune_model_cli
    except ImportError:
        raise UserError("tuning ONNX models is not available in this build") from None
    return tune_model_cli(args, target)


def _cost_model_options(strategy: str, cost_model: str | None) -> dict | None:
    from .strategies.base import cost_model_options

    if cost_model not in (None, "packaged", "auto", "none") and not os.path.exists(cost_model):
        raise UserError(f"{cost_model}: no such cost-model checkpoint (make one with felixjax pretrain, or use "
                        "'packaged': the model shipped with felixjax)")
    try:
        return cost_model_options(strategy, cost_model)
    except ValueError as e:
        raise UserError(str(e)) from None


def _cmd_pretrain(args: argparse.Namespace) -> int:
    from .pretrain import pretrain

    for db in args.db:
        if not os.path.exists(db):
            raise UserError(f"{db}: no such database")
    if not 0 <= args.holdout < 1:
        raise UserError(f"--holdout must be in [0, 1) (got {args.holdout})")
    if args.min_records < 1:
        raise UserError(f"--min-records must be at least 1 (got {args.min_records})")
    rep = pretrain(args.db, args.output, exclude=args.exclude, holdout=args.holdout, seed=args.seed, progress=True,
                   min_records=args.min_records)
    print(f"trained on {len(rep['train_tasks'])} task(s), {rep['train_rows']} configs, in {rep['seconds']:.0f} s; "
          f"wrote {args.output} and {args.output}.json")
    if rep["skipped"]:
        print(f"left out {len(rep['skipped'])} task(s) (fewer than {args.min_records} correctly measured configs, "
              f"--min-records, unless said otherwise): " + ", ".join(f"{x['task']} ({x['configs']} configs)"
                                                                     for x in rep["skipped"]))
    if rep["heldout_tasks"]:
        print(f"held-out tasks ({len(rep['heldout_tasks'])}): within-task pairwise accuracy, MLP "
              f"{rep['heldout_mlp_pairwise']:.3f} vs roofline prior {rep['heldout_prior_pairwise']:.3f}")
        for name, v in sorted(rep["heldout"].items()):
            print(f"  {name}: {v['configs']} configs, MLP {v['mlp_pairwise']:.3f}, prior {v['prior_pairwise']:.3f}")
    return 0


def _cmd_build(args: argparse.Namespace) -> int:
    from .network import build_model_cli

    if not os.path.exists(args.model):
        raise UserError(f"{args.model}: no such file")
    if args.db not in (None, "none") and not os.path.exists(args.db):
        raise UserError(f"{args.db}: no such database")
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        raise UserError(f"-o {args.output}: a file is there; give a folder to write the build into")
    from codegen.netbuild.standalone import C_IDENTIFIER

    if not C_IDENTIFIER.fullmatch(args.prefix) or args.prefix.startswith("_"):
        raise UserError(f"--prefix must be a C identifier not starting with '_', such as det_ (got {args.prefix!r})")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be >= 1 (got {args.threads})")
    # no --db: runs.db when it is here, as `felixjax tune` writes it (said once the model has loaded)
    args.db_found = args.db is None and os.path.exists("runs.db")
    args.db = "runs.db" if args.db_found else None if args.db == "none" else args.db
    return build_model_cli(args, _target(args.threads))


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import report

    if not os.path.exists(args.db):
        raise UserError(f"{args.db}: no such database")
    print(report(args.db, plot=args.plot))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    import felixjax as fj

    from .compare import WARMUP_TRIALS, split_name
    from .suites import SUITES

    if args.suite and args.op:
        raise UserError("give either --suite or --op specs, not both")
    if not args.suite and not args.op:
        raise UserError("nothing to compare: give --suite ops or --op SPEC (see felixjax compare --help)")
    if args.suite and args.suite not in SUITES:
        raise UserError(f"unknown suite {args.suite!r}; available: {', '.join(sorted(SUITES))}")
    if args.trials < 1 or args.seeds < 1:
        raise UserError(f"--trials and --seeds must be >= 1 (got {args.trials}, {args.seeds})")
    if args.warmup is not None and args.warmup < 0:
        raise UserError(f"--warmup must be >= 0 (got {args.warmup})")
    names = [s.strip() for s in args.strategies.split(",") if s.strip()] if args.strategies is not None else None
    if names is not None and not names:
        raise UserError(f"--strategies {args.strategies!r}: no strategy named (comma-separated, e.g. gradient,genetic)")
    if names is not None and len(set(names)) < len(names):
        raise UserError(f"--strategies {args.strategies!r}: a strategy is named twice")
    for name in names or []:  # "genetic@32": a registered strategy at 32 candidates per round
        try:
            base, _ = split_name(name)
        except ValueError as e:
            raise UserError(str(e)) from None
        if base not in fj.strategies():
            raise UserError(f"unknown strategy {base!r}; registered: {', '.join(fj.strategies())}")
    try:
        tasks = [args.suite] if args.suite else [fj.ops.parse_spec(s) for s in args.op]
    except ValueError as e:
        raise UserError(str(e)) from None
    options = None
    if args.cost_model is not None:
        from .strategies.base import COST_MODEL_STRATEGIES

        options = {n: _cost_model_options(n, args.cost_model)
                   for n in {split_name(n)[0] for n in names or fj.strategies()} if n in COST_MODEL_STRATEGIES}
        if not options:  # as `tune` says it: the flag would be ignored
            raise UserError(f"--cost-model needs a strategy with a cost model ({', '.join(COST_MODEL_STRATEGIES)}) "
                            "among --strategies")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UserError(f"--out {args.out}: is a file, not a folder (compare writes several files into it)")
    os.makedirs(args.out, exist_ok=True)
    if args.replay and args.dask:  # a replay times nothing: no cluster to start
        print("felixjax compare: note: --dask is not used with --replay (the synthetic oracle runs in this process)",
              file=sys.stderr)
        args.dask = None
    with _runner(args) as runner:
        cmp = fj.compare(tasks, names, trials=args.trials, seconds=args.seconds, seeds=args.seeds,
                         db=os.path.join(args.out, "cmp.db"), threads=args.threads, out=args.out,
                         replay=True if args.replay else None, strategy_options=options, progress=not args.quiet,
                         runner=runner, warmup=args.warmup if args.warmup is not None else WARMUP_TRIALS,
                         reference=args.reference,
                         run_caches=os.path.join(args.out, "caches") if args.run_caches and not args.replay else None)
    print(cmp.table())
    print(f"\nwrote {', '.join(os.path.join(args.out, f) for f in ('cmp.csv', 'table.md', 'curves.png', 'cmp.db'))}")
    return 0


def _check_budgets(args: argparse.Namespace) -> None:
    """Budgets and thread counts that would run nothing, or forever, are user errors."""
    for name in ("trials", "seeds", "threads"):
        v = getattr(args, name, None)
        model = name == "trials" and args.cmd in ("tune", "approx") and getattr(args, "model", None)
        if model and v == 0:
            continue  # a model's re-timing only: tune_model(trials=0); approx on the default schedules
        if v is not None and v < 1:
            raise UserError(f"--{name} must be >= {0 if model else 1} (got {v})")
    from . import db_files

    dbs = getattr(args, "db", None)
    for d in dbs if isinstance(dbs, list) else [dbs]:
        if isinstance(d, str):
            db_files.checked_path(d)  # (an empty one: an unset variable; every command, before it reads the path)
    if getattr(args, "in_network", 0) < 0:
        raise UserError(f"--in-network must be >= 0 (got {args.in_network}; 0: off)")
    v = getattr(args, "seconds", None)
    if v is not None and not (v > 0 and math.isfinite(v)):
        raise UserError(f"--seconds must be a positive number of seconds (got {v:g})")
    for flag in ("input_shape", "input_value"):  # NAME=... pairs: a name given twice would keep the last silently
        names = [name for name, _ in getattr(args, flag, None) or []]
        if len(set(names)) < len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise UserError(f"--{flag.replace('_', '-')} names {', '.join(twice)} more than once")
    threads, cores = getattr(args, "threads", None), os.cpu_count() or 1
    if threads is not None and threads > cores:  # allowed (a target's own count), but timings here will suffer
        print(f"felixjax {args.cmd}: warning: --threads {threads} is more than this machine's {cores} cores; kernels "
              "will share cores and their timings say little", file=sys.stderr)


COMMANDS = {"tune": _cmd_tune, "report": _cmd_report, "compare": _cmd_compare, "zoo": _cmd_zoo, "build": _cmd_build,
            "pretrain": _cmd_pretrain, "approx": lambda args: _cmd_approx(args),
            "cache": lambda args: _cmd_cache(args)}


def _cmd_cache(args: argparse.Namespace) -> int:
    from . import cache_cli

    return cache_cli.run(args, UserError)


def _cmd_approx(args: argparse.Namespace) -> int:
    from .approx import cli as approx_cli

    return approx_cli.run(args, UserError)


def _model_input_args(p: argparse.ArgumentParser) -> None:
    """``--input-shape`` / ``--input-value`` of the commands that load an ONNX model."""
    p.add_argument("--input-shape", action="append", default=[], type=_input_shape, metavar="NAME=DIMS",
                   help="pin a model input's dynamic shape, e.g. x=1x3x224x224 (repeatable)")
    p.add_argument("--input-value", action="append", default=[], type=_input_value, metavar="NAME=V,...",
                   help="give a non-float model input a constant value, e.g. im_shape=640,640 (repeatable)")


def _input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    from .onnx_shapes import parse_input_shape

    try:
        return parse_input_shape(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _input_value(text: str) -> tuple[str, list[float]]:
    from .onnx_shapes import parse_input_value

    try:
        return parse_input_value(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


@contextlib.contextmanager
def _ctrl_c():
    """Ctrl-C that is never lost: Python raises KeyboardInterrupt in whatever Python code runs when the
    signal is handled, and where that is a garbage-collector callback (jax registers one) or a finalizer,
    the exception is printed as "Exception ignored" and dropped, so a Ctrl-C while jax loads or collects
    went unheeded (session 73: every one sent 0.6-1.0 s after `felixjax tune` started). A KeyboardInterrupt
    dropped that way sends the signal again a moment later, to land in the command itself."""
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``felixjax`` command."""
    with _ctrl_c():
        try:
            args = _parser().parse_args(argv)  # the parser loads the suites (codegen): a moment to be interrupted in
            db = getattr(args, "db", None)  # a quoted "~/runs.db" (the shell leaves ~ alone inside quotes)
            if isinstance(db, str):
                args.db = os.path.expanduser(db)
            elif isinstance(db, list):
                args.db = [os.path.expanduser(d) for d in db]
            # (jax loads here, a second or more: a session-81 review's Ctrl-C in it was a traceback, or was lost)
            from . import session
        except KeyboardInterrupt:
            print("felixjax: interrupted", file=sys.stderr)
            return 130
        said, session.SAY_KEPT[0] = session.SAY_KEPT[0], False  # its own line says what an interrupt kept
        try:
            return _run(args)
        except BrokenPipeError:  # `felixjax report runs.db | head -1`: the reader is gone (no traceback)
            if not _stdout_gone():  # another pipe's (a measuring child's): a real error
                raise
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (the exit's flush would raise again)
            return 141
        finally:
            session.SAY_KEPT[0] = said


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has left (poll reports an error on its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no poll (Windows), stdout replaced or closed
        return False


def _import_plugins(modules: list[str]) -> None:
    import importlib

    for name in modules:
        if os.getcwd() not in sys.path:
            sys.path.append(os.getcwd())
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            raise UserError(f"--plugin {name}: no such module (on the Python path or in {os.getcwd()})") from None


def _printable(text: str) -> str:
    """An error message as the terminal should see it: a model's names may hold escape sequences (a window
    title, the clipboard, a rewritten line), shown escaped instead."""
    return "".join(c if c.isprintable() or c == "\n" else repr(c)[1:-1] for c in text)


def _run(args: argparse.Namespace) -> int:
    try:
        _import_plugins(args.plugin)
        _check_budgets(args)
        return COMMANDS[args.cmd](args)
    except UserError as e:
        print(f"felixjax {args.cmd}: error: {_printable(str(e))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # main's: stdout's reader is gone
        raise
    except (ValueError, OSError) as e:  # OSError: a file refused, a full disk, a read-only cache (not a traceback)
        msg = " ".join(_printable(str(e) or type(e).__name__).split())  # (a bare TimeoutError() has no text)
        msg = msg if len(msg) <= 400 else msg[:180] + " [...] " + msg[-180:]  # (shorten() dropped a long path)
        print(f"felixjax {args.cmd}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        kept = ("nothing was kept: without --db the measurements were in memory (--db runs.db keeps them)"
                if args.cmd == "approx" and getattr(args, "db", None) in (None, ":memory:")
                else "every measurement so far is in the database")
        print(f"felixjax {args.cmd}: interrupted; {kept}", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
