"""The ledger's seed-paired levers again, split by the round that settles an op (issue 15, session 69).

Each lever of issue 15's ablation ledger since session 49 was measured seed-paired against the gradient search's
defaults (``gradient_pre_b32_spread4_flat``) on ``fresh`` and op-suite ops, and its per-trial CSVs are under
``docs/data/``. This script reads them again (nothing is measured) and prints, per lever arm, trials to 95%
lever on / off (geomean over ops of per-op medians, a 90% seed-paired bootstrap interval; below 1: the lever
needed fewer trials) over all ops, over the ops the first round settles and over the others
(:func:`benchmarks.ratio_intervals.settled_first` on the lever's and the default's runs: at least half of them
within 95% in their first 32 trials). Levers that act after the first round can only show on the last split, and
``lever_bounds.py --sooner`` says how large a gain there the targets would need.

The seconds of these runs are not shown: before session 64 the arms shared a memoizing measurer (each distinct config
timed once for all arms), so an arm's clock says more about the arm run before it than about the lever.

    python benchmarks/ledger_split.py                      # every lever (~5 s)
    python benchmarks/ledger_split.py --levers b8_now,lr15 --out results/split.md
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.ratio_intervals import point_ratios, pooled, settled_first, settled_part
from felixjax.compare import bootstrap_ratios

ROOT = Path(__file__).resolve().parent.parent
REF = "gradient_pre_b32_spread4_flat"


def _both(folder: str, *seeds: str) -> list[str]:
    """The ``fresh`` and op-suite files of one ablation folder for these seed ranges (``"0-2"``, ...)."""
    return [f"{folder}/{suite}_seeds{x}" for suite in ("fresh", "ops") for x in seeds]


#: lever arm (after ``gradient_pre_``) -> (the ledger's row, session, the CSVs under docs/data/ that hold it).
LEVERS = {
    "deep": ("descent depth: starts=128, steps=64", 49,
             ["ablation_deep_s49/fresh_seeds0-2", "ablation_deep_s49/ops_seeds0-2",
              "ablation_deep_s49/ops_seeds3-5"]),
    "short": ("fewer steps: steps=16", 49,
              ["ablation_deep_s49/fresh_short_seeds0-2", "ablation_deep_s49/ops_seeds0-2"]),
    "prune": ("a sketch left behind held to a trickle: prune=1.5", 51,
              ["prune_s51/paired_seeds0-2", "prune_s51/paired_seeds3-5"]),
    "local_now": ("measured-neighbour moves (DGD): local_share=0.5", 51, ["round2_s51/fresh_seeds0-2"]),
    "res_now": ("residual GP: residual=True", 51, ["round2_s51/fresh_seeds0-2", "round2_s51/ops_res_seeds0-2"]),
    "b16_now": ("16 per round", 52, _both("batch_s52", "0-2")),
    "b8_now": ("8 per round", 52, _both("batch_s52", "0-2")),
    "open": ("first rounds on the packaged model: opening='packaged'", 53,
             ["open_s53/fresh_seeds0-2", "open_s53/fresh_seeds3-5", "open_s53/ops_seeds0-2"]),
    "flat1": ("the neighbourhood's mean alone: flat=1", 54,
              ["flat_s54/fresh_seeds0-2", "flat_s54/fresh_seeds3-5", "flat_s54/ops_seeds0-2"]),
    "eps0": ("no random pick: eps_greedy=0", 54, _both("eps_s54", "0-2")),
    "pert0": ("descents from random starts: perturbed_share=0", 55, _both("pert_s55", "0-2", "3-5")),
    "pert90": ("descents around the bests: perturbed_share=0.9", 55, _both("pert_s55", "0-2", "3-5")),
    "warm1": ("one first-round descent pass: warmup_passes=1", 55, _both("warm_s55", "0-2", "3-5")),
    "warm4": ("four first-round descent passes: warmup_passes=4", 55, _both("warm_s55", "0-2", "3-5")),
    "spread2": ("the batch's spread: spread=2", 56, _both("spread_s56", "0-2", "3-5")),
    "spread8": ("the batch's spread: spread=8", 56, _both("spread_s56", "0-2", "3-5")),
    "nb0": ("no repair after rounding: neighbours_of=0", 57, _both("nb_s57", "0-2", "3-5")),
    "nb32": ("a wider repair: neighbours_of=32", 57, _both("nb_s57", "0-2", "3-5")),
    "temp025": ("a sharper descent: temperature=0.25", 57, _both("temp_s57", "0-2", "3-5")),
    "lr015": ("a smaller step: lr=0.15", 58, _both("lr_s58", "0-2", "3-5")),
    "lr15": ("a larger step: lr=1.5", 58, _both("lr_s58", "0-2", "3-5", "6-8")),
    "hv1": ("every iterate a candidate: harvest_every=1", 59, _both("hv_s59", "0-2", "3-5")),
    "hv4": ("every fourth iterate: harvest_every=4", 59, _both("hv_s59", "0-2", "3-5", "6-8")),
    "breed": ("half the first round bred: breed_share=0.5", 61,
              ["breed_s61/fresh_seeds15-17", "breed_s61/fresh_seeds18-20", "breed_s61/ops_seeds12-14",
               "breed_s61/ops_seeds15-17"]),
    "breed1": ("the first round bred: breed_share=1", 61,
               ["breed_s61/breed1_fresh_seeds15-17", "breed_s61/breed1_ops_seeds12-14", "breed_s61/fresh_seeds18-20",
                "breed_s61/ops_seeds15-17"]),
    "pess_now": ("pessimism against extrapolation: pessimism=1", 62,
                 ["pess_s62/fresh_seeds21-23", "pess_s62/fresh_seeds24-26", "pess_s62/ops_seeds18-20",
                  "pess_s62/ops_seeds21-23"]),
}


def lever_rows(lever: str, *, data: Path = ROOT / "docs" / "data", batch: int = 32, n: int = 2000) -> list[dict]:
    """Per split ('all', 'first', 'later'): ``ops``, ``runs`` (per op and arm) and ``trials`` as
    (point, low, high) of the lever arm over :data:`REF`."""
    arm = f"gradient_pre_{lever}"
    paths = [data / f"{name}.csv.gz" for name in LEVERS[lever][2]]
    runs = pooled(paths, keep={arm, REF})
    first = settled_first(runs, batch)
    out = []
    for split in ("all", "first", "later"):
        part = settled_part(runs, first, split)
        if not part:
            out.append({"split": split, "ops": 0})
            continue
        point = point_ratios(part, REF)[arm]
        span = bootstrap_ratios(part, REF, n=n, paired=True)[arm]["trials95"]
        out.append({"split": split, "ops": point["ops"], "runs": len(next(iter(part.values()))["trials95"]),
                    "trials": (point["trials95"], *span)})
    return out


def table(levers: list[str], n: int = 2000) -> str:
    out = [("| lever (arm `gradient_pre_<name>`) | session | runs per op | trials to 95%, on / off: all ops | "
            "ops settled in round 1 | ops settled later |"),
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for lever in levers:
        what, session, _ = LEVERS[lever]
        rows = {r["split"]: r for r in lever_rows(lever, n=n)}
        cells = [f"{r['trials'][0]:.2f}x [{r['trials'][1]:.2f}, {r['trials'][2]:.2f}] ({r['ops']})"
                 if r["ops"] else "—" for r in (rows["all"], rows["first"], rows["later"])]
        out.append(f"| {what} (`{lever}`) | {session} | {rows['all']['runs']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levers", default=",".join(LEVERS), help="comma-separated lever names (default: all): "
                    + ", ".join(LEVERS))
    ap.add_argument("--n", type=int, default=2000, help="bootstrap resamples (default 2000)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    args = ap.parse_args(argv)
    levers = [x.strip() for x in args.levers.split(",") if x.strip()]
    unknown = [x for x in levers if x not in LEVERS]
    if unknown or not levers:
        ap.error(f"--levers: unknown {unknown or args.levers!r}; one of {', '.join(LEVERS)}")
    text = (f"Trials to 95%, lever on / off ({REF}), geomean over ops of per-op medians [90% seed-paired bootstrap, "
            f"{args.n} resamples] (ops); below 1: the lever needed fewer trials. Split: ops at least half of whose "
            f"runs (both arms) reached 95% in their first 32 trials, and the others.\n\n" + table(levers, args.n))
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
