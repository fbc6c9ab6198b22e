"""How large is each op's schedule space? (issue 15: does the gradient search lead where spaces are large?)

For every op of the named suites (or ``--ops`` specs), on this host's target: the sketches that apply, the
unconstrained product of knob domains summed over them (``Space.size``, an upper bound), and an estimate of
the valid configs in it (that bound times the share of ``--draws`` uniform draws per sketch that validate).
No kernel is built or timed; it runs in seconds.

Usage:
    python benchmarks/space_size.py --suite ops,fresh,dw_gemv
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from codegen.ops import parse_spec
from codegen.space import Space, sketches_for
from codegen.target import Target
from felixjax.suites import suite


def space_size(task, target: Target, draws: int = 2000, seed: int = 0) -> dict:
    """Sketch count, log10 of the product bound and log10 of the estimated valid configs of one task."""
    bound, valid = 0, 0.0
    sketches = sketches_for(task, target)
    for sk in sketches:
        sp = Space(task, sk, target)
        rng = np.random.default_rng(seed)
        # uniform over the product of knob domains, as Space.sample draws before it rejects invalid configs
        ok = sum(sp.is_valid(sp._draw(rng)) for _ in range(draws))
        bound += sp.size()
        valid += sp.size() * ok / draws
    return {"task": task.name, "sketches": len(sketches), "log10_bound": math.log10(bound),
            "log10_valid": math.log10(valid) if valid > 0 else float("-inf")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="ops,fresh", help="comma-separated suites of felixjax.suites")
    ap.add_argument("--ops", default="", help="comma-separated op specs (';' inside a spec for its commas)")
    ap.add_argument("--draws", type=int, default=2000, help="uniform draws per sketch for the valid share")
    args = ap.parse_args(argv)
    tasks = [(name, t) for name in filter(None, args.suite.split(",")) for t in suite(name)]
    tasks += [("ops", parse_spec(s.replace(";", ","))) for s in filter(None, args.ops.split(","))]
    target = Target.cpu()
    print("| suite | op | sketches | log10 configs (product bound) | log10 valid (estimated) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, task in tasks:
        r = space_size(task, target, args.draws)
        print(f"| {name} | {r['task']} | {r['sketches']} | {r['log10_bound']:.2f} | {r['log10_valid']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
