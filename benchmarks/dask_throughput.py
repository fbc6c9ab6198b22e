"""Tuning throughput (trials per minute) of three ways to build and measure, same task, strategy and seeds:

* ``local-1``: one local process, builds one at a time (``LocalProcessRunner(build_workers=1)``);
* ``local-par``: the local runner with parallel builds (``LocalProcessRunner(build_workers=2)``);
* ``dask``: a 2-worker ``LocalCluster`` of processes (one measuring worker ``device=1``, one build
  worker ``build=1``) through ``fj.DaskRunner``; on a host with ≤ 4 cores the measuring process is
  pinned to CPU 0 (kernels at 1 thread) and compiles to the others.

Every arm starts from an empty build cache (its own ``$FELIXJAX_CACHE``), uses the random strategy
(proposals do not depend on timings, so every arm builds and measures the same configs) and the same
kernel thread count, and reports trials/min over the whole ``fj.tune`` call (no re-timing).

    python benchmarks/dask_throughput.py --trials 64 --threads 1 --out results/dask_throughput.json

Not run in CI (it compiles and times real kernels for minutes).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time


def arm(name: str, task, trials: int, seed: int, threads: int, protocol) -> dict:
    import felixjax as fj
    from codegen.run import LocalProcessRunner
    from felixjax.dask_runner import DaskRunner, local_cluster

    cache = tempfile.mkdtemp(prefix=f"fj-throughput-{name}-")
    os.environ["FELIXJAX_CACHE"] = cache  # an empty build cache; dask workers started below inherit it
    cluster = client = None
    if name == "dask":
        from distributed import Client

        cluster = local_cluster(build_workers=1)
        client = Client(cluster)
        client.wait_for_workers(2)
        measure_cpus, build_cpus = cluster.felixjax_cpus
        runner = DaskRunner(client, protocol=protocol, measure_cpus=measure_cpus, build_cpus=build_cpus)
    else:
        runner = LocalProcessRunner(build_workers=1 if name == "local-1" else 2, protocol=protocol)
    try:
        t0 = time.perf_counter()
        res = fj.tune(task, strategy="random", trials=trials, seed=seed, runner=runner, threads=threads,
                      protocol=protocol, retime=0, progress=False)
        wall = time.perf_counter() - t0
    finally:
        runner.close()
        if client is not None:
            client.close()
            cluster.close()
    return {"arm": name, "task": task.name, "seed": seed, "trials": len(res.history), "wall_s": wall,
            "trials_per_min": 60.0 * len(res.history) / wall, "ok": sum(r.ok for r in res.history),
            "best_ms": res.best_while_tuning.latency_s * 1e3 if res.best_while_tuning else None}


def main() -> None:
    import felixjax as fj
    from codegen.measure import TimingProtocol

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", action="append", default=[], metavar="SPEC",
                   help="operator spec (repeatable; default matmul 128^3 and a 3x3 conv)")
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="kernel threads in every arm (1: comparable to dask's pin)")
    p.add_argument("--arms", default="local-1,local-par,dask")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args()
    specs = args.op or ["matmul:m=128,n=128,k=128", "conv2d:n=1,c=32,h=28,w=28,k=32,r=3,pad=1"]
    tasks = [fj.ops.parse_spec(s) for s in specs]
    protocol = TimingProtocol()
    rows = []
    for task in tasks:
        for seed in range(args.seeds):
            for name in args.arms.split(","):  # arms alternate per seed: drift in machine load hits all
                rows.append(arm(name, task, args.trials, seed, args.threads, protocol))
                r = rows[-1]
                print(f"{r['task']:28s} seed {seed} {name:10s} {r['trials']:4d} trials in {r['wall_s']:7.1f} s "
                      f"= {r['trials_per_min']:6.1f} trials/min (ok {r['ok']})", flush=True)
    print("\narm         mean trials/min")
    for name in args.arms.split(","):
        vals = [r["trials_per_min"] for r in rows if r["arm"] == name]
        print(f"{name:10s}  {sum(vals) / len(vals):8.1f}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
