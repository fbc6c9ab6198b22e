"""What one descent step costs, and why a batch-of-one axis made it slower (session 65).

The gradient search's descent takes, per step, the gradient of the cost model's score of each start's soft
features. This script times that gradient on many points of one op's sketch (jitted, vmapped, best of 5 after a
warm-up), the features handed to the model two ways: as they are (``[A, F]``, what ``felixjax.model`` does
since session 65) and as a batch of one (``[1, A, F]`` then ``[0]``, what it did before), for the whole
objective and for the MLP alone on precomputed features, with the forward pass beside each; and one whole
descent (64 starts x 32 steps) as the search runs it. The values of both ways are compared too (equal up to
float rounding).

    python benchmarks/descent_grad.py                        # matmul 257x96x384, 2048 points
    python benchmarks/descent_grad.py --op 'depthwise_conv2d:n=1;c=96;h=112;w=112;r=3;stride=2;pad=1'
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import felixjax as fj
from codegen.ops import parse_spec
from codegen.space import Space, sketches_for
from costmodels import Features
from felixjax.features import features
from felixjax.model import CostModelScorer
from felixjax.smooth import Smooth
from felixjax.strategies.gradient import _descent_for
from felixjax.strategies.residual import empty_arrays


def best_of(fn, *args, repeats: int = 5) -> float:
    """Seconds of the fastest of ``repeats`` calls, after one untimed call (compilation)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="matmul:m=257;n=96;k=384", help="op spec (';' between its fields)")
    ap.add_argument("--points", type=int, default=2048, help="points per gradient call (default 2048)")
    args = ap.parse_args(argv)
    task = parse_spec(args.op.replace(";", ","))
    target = fj.Target.cpu()
    spaces = {s.name: Space(task, s, target) for s in sketches_for(task, target)}
    scorer = CostModelScorer(spaces, target, seed=0)
    name = min(spaces)
    rel, inputs, model = scorer.relaxations[name], scorer.inputs[name], scorer.differentiable
    params, soft = model.params, Smooth.soft(1.0)
    xs = jnp.asarray(rel.sample_x(jax.random.PRNGKey(0), args.points))

    def as_they_are(p, x):
        return model.apply(p, features(inputs, x, soft))

    def batch_of_one(p, x):
        f = features(inputs, x, soft)
        return model.apply(p, Features(f.access[None], f.mask[None], f.glob[None]))[0]

    feats = jax.jit(jax.vmap(lambda x: features(inputs, x, soft)))(xs)
    mlp, mp = scorer.mlp, params["mlp"]

    def mlp_as_they_are(p, a, m, g):
        return mlp.apply(p, Features(a, m, g))

    def mlp_batch_of_one(p, a, m, g):
        return mlp.apply(p, Features(a[None], m[None], g[None]))[0]

    objective = (jax.vmap(jax.grad(as_they_are, argnums=1), in_axes=(None, 0)), jax.vmap(as_they_are, in_axes=(None, 0)),
                 jax.vmap(jax.grad(batch_of_one, argnums=1), in_axes=(None, 0)), jax.vmap(batch_of_one, in_axes=(None, 0)))
    alone = tuple(jax.vmap(f, in_axes=(None, 0, 0, 0)) for f in (
        jax.grad(mlp_as_they_are, argnums=(1, 2, 3)), mlp_as_they_are,
        jax.grad(mlp_batch_of_one, argnums=(1, 2, 3)), mlp_batch_of_one))
    rows = []  # (what, way, gradient s, forward s, values)
    for label, fns, args_ in (("objective (features + model)", objective, (params, xs)),
                              ("MLP alone", alone, (mp, feats.access, feats.mask, feats.glob))):
        for way, (grad, value) in (("as they are", fns[:2]), ("batch of one", fns[2:])):
            grad, value = jax.jit(grad), jax.jit(value)
            rows.append((label, way, best_of(grad, *args_), best_of(value, *args_), np.asarray(value(*args_))))
    run = _descent_for(scorer.soft_score(1.0), rel, 32)
    x0 = xs[:64]
    anchors, mask = jnp.zeros((16, x0.shape[1])), jnp.zeros(16)
    descent = best_of(run, params, inputs, getattr(rel, "descent_arrays", rel.arrays), x0, 0.5, anchors, mask,
                      jnp.zeros(2), jnp.float32(1.0), empty_arrays(x0.shape[1], 0))
    print(f"{task.name}, sketch {name}, {args.points} points (best of 5, seconds)\n")
    print("| what | features handed over | gradient | forward |")
    print("| --- | --- | ---: | ---: |")
    for label, way, g, v, _ in rows:
        print(f"| {label} | {way} | {g:.4f} | {v:.4f} |")
    for i in (0, 2):
        diff = float(np.max(np.abs(rows[i][4] - rows[i + 1][4])))
        print(f"\n{rows[i][0]}: largest difference between the two ways' values {diff:.2g}")
    print(f"\none descent as the search runs it (64 starts x 32 steps, features as they are): {descent:.4f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
