"""Generate the pretraining dataset shipped as package data (issue 15, cold start): measured configs
of CIFAR-size layers whose shapes are disjoint from both evaluation suites (``ops`` and ``fresh``).

Every shape of ``SHAPES`` (ResNet / MobileNet layers at 32x32, 16x16 and 8x8, their dense heads,
small matmuls) is tuned by the ``random`` strategy (uniform valid configs, plus every sketch's
default first) at 1 thread, each kernel built, checked against numpy and timed like any tuning
run. The correct measurements go into one gzipped JSON-lines file, ``felixjax/data/pretrain_cpu.jsonl.gz``
(at most 5 MB; the script stops adding shapes before that): the first line is the provenance (command,
commit, date, machine: CPU model, cores, SIMD width, caches, compiler; timing protocol), every other
line a :class:`felixjax.TuningRecord` (task, config, latencies). Features are computed when the data
are loaded (:func:`felixjax.pretrain.packaged_database`), so the file outlives feature changes.

On another CPU the pretrained model is only a warm start: the tuner's online model compares the MLP
with the roofline prior on held-out measurements after every update and ranks with the prior where
the MLP ranks worse.

The shipped cost model, ``felixjax/data/pretrain_cpu.npz`` (``cost_model="packaged"``), is the tuner's MLP
pretrained on that file (``--model-only`` retrains it from the file in seconds, e.g. after a feature change:
seed 0, every task; a report with whole tasks held out is written next to it as ``pretrain_cpu.npz.json``),
and ``pretrain_cpu_ens.npz`` an ensemble of 4 smaller MLPs trained on it, whose disagreement marks configs
the data do not cover (the gradient strategy's ``pessimism`` option).
Generating the data also trains the model.

The same shapes measured on a second machine (``--out felixjax/data/pretrain_cpu_b.jsonl.gz``, session 36: a
Zen 5 EPYC, the first file a Zen 4) train ``pretrain_cpu_judge.npz``, a model whose errors are its own: the
learned strategies' ``judge="judge"`` re-scores with it what their first model chose.

Never run in CI, and only on a quiet machine (hours at the default settings): timings taken while
other jobs share the cores teach the model noise. ``--quick`` (2 shapes, 8 trials, to a temporary
file) is the smoke test.

Usage:
    python benchmarks/make_pretrain_dataset.py                 # the package data (hours; a quiet machine)
    python benchmarks/make_pretrain_dataset.py --model-only                    # retrain the shipped models (seconds)
    python benchmarks/make_pretrain_dataset.py --out felixjax/data/pretrain_cpu_b.jsonl.gz   # another machine's data
    python benchmarks/make_pretrain_dataset.py --quick --out /tmp/pretrain_smoke.jsonl.gz
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import felixjax as fj  # noqa: E402
from codegen.measure import TimingProtocol  # noqa: E402
from codegen.ops import parse_spec  # noqa: E402
from felixjax.suites import SUITES, suite  # noqa: E402

OUT = ROOT / "felixjax" / "data" / "pretrain_cpu.jsonl.gz"
MODEL_OUT = ROOT / "felixjax" / "data" / "pretrain_cpu.npz"
ENSEMBLE_OUT = ROOT / "felixjax" / "data" / "pretrain_cpu_ens.npz"
#: the second machine's dataset (the same shapes and protocol, measured on another CPU: session 36's Zen 5) and
#: the MLP pretrained on it alone, the learned strategies' ``judge="judge"`` (errors independent of the first's)
JUDGE_DATA = ROOT / "felixjax" / "data" / "pretrain_cpu_b.jsonl.gz"
JUDGE_OUT = ROOT / "felixjax" / "data" / "pretrain_cpu_judge.npz"
#: the shipped ensemble: 4 narrower MLPs (seeds 0-3, bootstrap resamples): their disagreement, not their
#: mean, is what the gradient strategy's ``pessimism`` uses, so they are smaller than the tuner's model
ENSEMBLE = {"members": 4, "hidden": 64}
MAX_BYTES = 5 * 1024 * 1024
# CIFAR-size layers (ResNet-20/56-style stages at 32/16/8, MobileNet-style depthwise + pointwise,
# dense heads, small matmuls). Checked disjoint from the evaluation suites at start-up.
SHAPES = (
    "conv2d:n=1,c=3,h=32,w=32,k=16,r=3,pad=1",
    "conv2d:n=1,c=16,h=32,w=32,k=16,r=3,pad=1",
    "conv2d:n=1,c=16,h=32,w=32,k=32,r=3,stride=2,pad=1",
    "conv2d:n=1,c=32,h=16,w=16,k=32,r=3,pad=1",
    "conv2d:n=1,c=32,h=16,w=16,k=64,r=3,stride=2,pad=1",
    "conv2d:n=1,c=64,h=8,w=8,k=64,r=3,pad=1",
    "conv2d:n=1,c=16,h=32,w=32,k=32,r=1,stride=2",
    "conv2d:n=1,c=32,h=16,w=16,k=64,r=1,stride=2",
    "conv2d:n=1,c=64,h=32,w=32,k=64,r=3,pad=1",
    "conv2d:n=1,c=128,h=16,w=16,k=128,r=3,pad=1",
    "conv2d:n=1,c=256,h=8,w=8,k=256,r=3,pad=1",
    "conv2d:n=1,c=32,h=32,w=32,k=96,r=1",
    "conv2d:n=1,c=96,h=16,w=16,k=24,r=1",
    "conv2d:n=1,c=144,h=8,w=8,k=32,r=1",
    "depthwise_conv2d:n=1,c=32,h=32,w=32,r=3,pad=1",
    "depthwise_conv2d:n=1,c=96,h=32,w=32,r=3,stride=2,pad=1",
    "depthwise_conv2d:n=1,c=144,h=16,w=16,r=3,pad=1",
    "depthwise_conv2d:n=1,c=192,h=8,w=8,r=3,pad=1",
    "dense:n=1,in=64,out=10",
    "dense:n=1,in=256,out=100",
    "dense:n=1,in=512,out=10",
    "dense:n=1,in=1024,out=100",
    "matmul:m=64,n=64,k=64",
    "matmul:m=128,n=256,k=64",
    "matmul:m=64,n=192,k=48",
)


#: the evaluation suites no pretraining shape may come from
HELD_OUT = ("ops", "fresh", "dw_gemv")


def check_disjoint(tasks) -> None:
    """Refuse to generate data on any shape of an evaluation suite."""
    held = {t.key for name in HELD_OUT for t in suite(name)}
    clash = [t.name for t in tasks if t.key in held]
    if clash:
        raise SystemExit(f"shapes in an evaluation suite ({', '.join(sorted(SUITES))}): {', '.join(clash)}")


def provenance(argv, target, protocol, threads: int, trials: int) -> dict:
    from benchmarks.kernels import machine_lines

    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True,
                                    text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", True
    return {"provenance": {
        "command": "python benchmarks/make_pretrain_dataset.py " + " ".join(argv),
        "commit": commit + (" (with uncommitted changes)" if dirty else ""),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine_lines(target), "target_key": target.key,
        "load_average_1min_at_start": os.getloadavg()[0],
        "threads": threads, "trials_per_shape": trials, "strategy": "random (defaults first)",
        "protocol": str(protocol), "disjoint_from": ["ops", "fresh"],
    }}


def train_model(data: Path, out: Path, **kw) -> dict:
    """Pretrain the tuner's MLP (``kw``: ``members``, ``hidden`` for the ensemble) on a dataset file and
    save it to ``out``; the report (written as ``out.json``) also holds a transfer check: the same
    training with a fifth of the tasks held out whole, their within-task pairwise accuracy next to the
    roofline prior's."""
    from felixjax.pretrain import packaged_database, pretrain

    tmp = Path(tempfile.mkdtemp())
    db, prov = packaged_database(data, tmp / "data.db")
    held = pretrain([db], tmp / "heldout.npz", holdout=0.2, seed=0, **kw)
    report = pretrain([db], out, holdout=0.0, seed=0, **kw)
    report.update({"data": str(data.relative_to(ROOT)) if data.is_relative_to(ROOT) else str(data),
                   "data_provenance": prov, "databases": [], "checkpoint": out.name,
                   "transfer_check": {k: held[k] for k in ("train_tasks", "heldout_tasks", "heldout_mlp_pairwise",
                                                           "heldout_prior_pairwise", "heldout")}})
    Path(str(out) + ".json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(f"[pretrain data] wrote {out} ({out.stat().st_size / 1024:.0f} KiB): {report['train_rows']} configs of "
          f"{len(report['train_tasks'])} tasks; held-out tasks' pairwise accuracy MLP "
          f"{held['heldout_mlp_pairwise']:.3f} vs prior {held['heldout_prior_pairwise']:.3f}", file=sys.stderr)
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("Usage:")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=None, help="measured configs per shape (default 192; quick 8)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help=f"default {OUT.relative_to(ROOT)} (quick: required)")
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 shapes, 8 trials")
    ap.add_argument("--model-only", action="store_true",
                    help=f"no measuring: retrain {MODEL_OUT.relative_to(ROOT)} from the dataset file (seconds)")
    args = ap.parse_args(argv)
    if args.model_only:
        train_model(args.out or OUT, MODEL_OUT)
        train_model(args.out or OUT, ENSEMBLE_OUT, **ENSEMBLE)
        if args.out is None and JUDGE_DATA.exists():
            train_model(JUDGE_DATA, JUDGE_OUT)
        return 0
    if args.quick and args.out is None:
        ap.error("--quick writes a throwaway file: give --out")
    trials = args.trials or (8 if args.quick else 192)
    out = args.out or OUT
    tasks = [parse_spec(s) for s in (SHAPES[:2] if args.quick else SHAPES)]
    check_disjoint(tasks)
    target = fj.Target.cpu()
    protocol = TimingProtocol.quick() if args.quick else TimingProtocol(warmup=1, min_repeat_ms=10, repeats=3)
    head = provenance(argv, target, protocol, args.threads, trials)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp()) / "data.db"
    lines = [json.dumps(head, sort_keys=True)]
    size = 0
    for i, task in enumerate(tasks):
        fj.tune(task, strategy="random", trials=trials, db=str(tmp), seed=i, threads=args.threads, protocol=protocol,
                progress=False, retime=0)
        recs = [r for r in fj.Database(str(tmp)).records(task=task) if r.ok]
        new = [json.dumps(r.to_json(), sort_keys=True) for r in recs]
        size += len(gzip.compress("\n".join(new).encode()))
        if size > MAX_BYTES:
            print(f"[pretrain data] stopping before {task.name}: the file would pass 5 MB", file=sys.stderr)
            break
        lines += new
        print(f"[pretrain data] {task.name}: {len(recs)} correct measurements", file=sys.stderr, flush=True)
    with gzip.open(out, "wt") as f:
        f.write("\n".join(lines) + "\n")
    print(f"[pretrain data] wrote {out} ({out.stat().st_size / 1024:.0f} KiB, {len(lines) - 1} records)",
          file=sys.stderr)
    if out == OUT:
        train_model(out, MODEL_OUT)
        train_model(out, ENSEMBLE_OUT, **ENSEMBLE)
    elif out.resolve() == JUDGE_DATA:
        train_model(out, JUDGE_OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
