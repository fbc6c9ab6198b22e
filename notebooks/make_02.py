"""Writes notebooks/02_gradient_tuning.ipynb (nbformat v4, no outputs): `python notebooks/make_02.py`.

The notebook is generated so its source stays reviewable as plain Python; CI executes it
(tests/test_notebooks.py). Edit the cells here, then rerun this script.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared generator helper
from nbgen import IMPORT_FELIXJAX, build_notebook, write_notebook  # noqa: E402

NOTEBOOK = Path(__file__).with_name("02_gradient_tuning.ipynb")

CELLS = [
    ("md", """# 02 · Gradient tuning: the relaxed landscape, descent, rounding, a real tuning run

felixjax does not search schedules combinatorially. It relaxes the integer knobs of a schedule into
continuous variables `x`, computes differentiable program features of `x` in closed form, scores them
with a cost model (predicted −log latency), and runs Adam from many starting points. The iterates are
rounded back to valid integer schedules, ranked by the model, and the best ones are built and timed.

This notebook opens that loop up for one operator, a 256×256×256 matmul:

1. the relaxed space (`x` ↔ `Config`);
2. the landscape the descent sees: predicted score over a 2-D slice of two tile exponents, in the
   **soft** mode used for descent and the exact **hard** mode;
3. a few descent trajectories of the real, jitted, vmapped descent of `strategies/gradient.py`;
4. rounding of the final points to valid configs;
5. a short real tuning run (`fj.tune(strategy="gradient")`, 16 trials, 1 thread), next to random search.

It runs in well under a minute (most of it is one-off JAX compilation, cached on disk afterwards)."""),
    ("code", """import io
import sys
import time
from pathlib import Path

""" + IMPORT_FELIXJAX + """
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from IPython.display import Image, display

from felixjax.features import batch_features
from felixjax.model import CostModelScorer
from felixjax.relax import FREE_LEVELS, MAX_PRIMES, constraints
from felixjax.smooth import Smooth


def show(fig):
    \"\"\"Display a figure as an inline PNG (works headless, under the Agg backend).\"\"\"
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    display(Image(buf.getvalue()))


t_start = time.perf_counter()
task = fj.ops.matmul(256, 256, 256)
target = fj.Target.cpu()
spaces = {sk.name: fj.Space(task, sk, target) for sk in fj.sketches_for(task)}
scorer = CostModelScorer(spaces, target, seed=0)  # a task's view of a cost model (a session shares one model)
sketch = "gemm_packed"  # a matmul has one sketch: packed weight panels, register-blocked
rel, inputs = scorer.relaxations[sketch], scorer.inputs[sketch]
space = rel.space
model = scorer.differentiable  # the active model, differentiable: the roofline prior here (no checkpoint given)
print(task.name, f"{task.flops / 1e6:.1f} MFLOP;", target.name, f"{target.cores} cores, {target.simd_lanes} fp32 lanes")
print("axes:", [(a.name, a.extent, "reduce" if a.reduce else "spatial") for a in space.axes])
print("active model:", scorer.active)"""),
    ("md", """## 1 · The relaxed space

Every tile size is Π_p p^{x_p} over the prime factors of its axis's extent (256 = 2⁸, so one exponent
per tile level here). Spatial axes have free levels S1, S2, S3 (S0 is the quotient), reduction axes R1
(R0 is the quotient), so divisibility becomes the linear constraint Σ_levels x ≤ 8 per axis. Unroll and
vector width are 2^x; the parallel fuse depth is a plain number. `to_x` / `from_x` are exact inverses
on integer points."""),
    ("code", """def idx(axis: int, level: int, prime: int = 0) -> int:
    \"\"\"Position in x of the exponent of prime slot `prime` in free tile level `level` of `axis`.\"\"\"
    return (axis * FREE_LEVELS + level) * MAX_PRIMES + prime


default = space.default()
x_default = rel.to_x(default)
print("default config:", default.dumps())
for a, axis in enumerate(space.axes):
    levels = ("R1",) if axis.reduce else ("S1", "S2", "S3")
    ex = {lv: float(x_default[idx(a, j)]) for j, lv in enumerate(levels)}
    print(f"  {axis.name} (extent {axis.extent}): tiles {default.tiles[a]}  exponents of 2 {ex}")
print("round trip exact:", rel.from_x(x_default) == default)"""),
    ("md", """## 2 · The landscape

A 2-D slice through `x`: the S3 (register-block) tile exponents of the two spatial axes `m` and `n`
vary over [0, 8]; every other coordinate stays at the default config's value (with `m`'s and `n`'s
S1/S2 tiles set to 1, so the whole square is inside the divisibility polytope). The colour is the
model's predicted score (−log latency: higher is faster).

* **soft** (what the descent differentiates): floors, ceilings and comparisons replaced by smooth
  surrogates at temperature 1;
* **hard** (what ranking uses): exact integer arithmetic; fractional exponents give non-integer
  tiles, which hard mode rounds, hence the steps.

White lines are the hardware constraints of the relaxation (squared-hinge penalties during descent,
repaired by rounding): dashed, the vector width (16 at the default) must divide the `n` register tile;
solid, the register block `m₃·n₃ / vec` must fit the accumulator budget. This scorer was made without a
checkpoint, so its model is the analytic roofline prior, which likes big register blocks; the constraints
are what stop it. (`fj.tune`'s default, `cost_model="auto"`, starts from the MLP shipped with felixjax
instead: section 5.)"""),
    ("code", """I, J = idx(1, 2), idx(2, 2)  # S3 exponents of m and n
base = x_default.copy()
for lv in range(FREE_LEVELS):
    base[idx(1, lv)] = base[idx(2, lv)] = 0.0
G = 32  # 32 x 32 = 1024 points: the batch size the scorer's exact features compile for anyway
grid = np.linspace(0.0, 8.0, G)
A, B = np.meshgrid(grid, grid, indexing="ij")
X = np.repeat(base[None], G * G, axis=0)
X[:, I], X[:, J] = A.ravel(), B.ravel()
X = jnp.asarray(X, jnp.float32)


def predict(points, smooth):
    \"\"\"Model score of relaxed points [B, N_X] (features in the given smoothing mode).\"\"\"
    return np.asarray(model.apply(model.params, batch_features(inputs, points, smooth)))


land = {"soft": predict(X, Smooth.soft(1.0)).reshape(G, G), "hard": predict(X, Smooth.hard_mode()).reshape(G, G)}
g = np.asarray(jax.jit(jax.vmap(lambda x: constraints(rel.arrays, x)))(X)).reshape(G, G, -1)

fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
lo, hi = min(v.min() for v in land.values()), max(v.max() for v in land.values())
for ax, (mode, Z) in zip(axes, land.items()):
    cs = ax.contourf(grid, grid, Z.T, levels=np.linspace(lo, hi, 25), cmap="viridis")
    for k, style in ((0, "--"), (1, "-")):  # vec | n3, register block
        ax.contour(grid, grid, g[..., k].T, levels=[0.0], colors="white", linestyles=style, linewidths=1.2)
    ax.set_title(f"{mode} features: predicted score", fontsize=10)
    ax.set_xlabel("log2 S3 tile of m")
axes[0].set_ylabel("log2 S3 tile of n")
fig.colorbar(cs, ax=axes, label="predicted −log latency")
show(fig)
diff = np.abs(land["soft"] - land["hard"])
print(f"|soft - hard|: max {diff.max():.3f}, mean {diff.mean():.3f} (score units: log latency)")"""),
    ("md", """## 3 · Descent

The jitted descent of `felixjax.strategies.gradient`: Adam (lr 0.5, ×0.2 after 30% of the steps) on
−score(soft features) plus the constraint penalty, its gradient rescaled against the objective's, each
step projected back onto the polytope; all starts run at once (vmapped) in one `lax.scan`. It moves
**every** coordinate of `x`; the trajectories below are drawn in the two sliced coordinates over the
soft slice, which is exact only at the start (the other coordinates move too). Eight of the 64 starts
are drawn (start ○, end ×); they start on the slice, the other 56 uniformly in the polytope.

The right panel is the predicted score alone. Starts beyond the solid line (a register block larger
than the accumulator budget) are infeasible: the penalty pushes them back inside and their score
*drops* to the best feasible value nearby; feasible starts climb."""),
    ("code", """from felixjax.strategies.gradient import ANCHORS, RESIDUAL_ROWS, _descent_for
from felixjax.strategies.residual import empty_arrays

STARTS, STEPS = 64, 32  # the tuning run below uses the same sizes, so the descent compiles once
rng = np.random.default_rng(0)
x0 = np.array(rel.sample_x(jax.random.PRNGKey(0), STARTS), np.float32)
shown = 8
x0[:shown] = base
x0[:shown, I], x0[:shown, J] = rng.uniform(0.0, 8.0, shown), rng.uniform(0.0, 8.0, shown)
# run(params, inputs, relaxed space, x0, lr, trust-region anchors, their mask, (weight, radius), the score's
#     weight, the residual GP) -> [steps, starts, N_X]
descent = _descent_for(scorer.soft_score(1.0), rel, STEPS)
no_trust = (jnp.zeros((ANCHORS, x0.shape[1])), jnp.zeros(ANCHORS), jnp.zeros(2),  # the trust region is off,
            jnp.float32(1.0), empty_arrays(x0.shape[1], RESIDUAL_ROWS))  # the model alone (no residual GP)
t = time.perf_counter()
traj = np.asarray(descent(model.params, inputs, rel.arrays, jnp.asarray(x0, jnp.float32), 0.5, *no_trust))
print(f"descent: {STARTS} starts x {STEPS} steps in {time.perf_counter() - t:.2f} s (compilation included)")
t = time.perf_counter()
np.asarray(descent(model.params, inputs, rel.arrays, jnp.asarray(x0, jnp.float32), 0.5, *no_trust))
print(f"again, compiled: {time.perf_counter() - t:.3f} s")

# the full (soft) objective along the drawn trajectories, in one batch of the landscape's size
path = np.concatenate([x0[None, :shown], traj[:, :shown]])  # [steps + 1, shown, N_X]
flat = np.zeros((G * G, path.shape[-1]), np.float32)
flat[: path.shape[0] * shown] = path.reshape(-1, path.shape[-1])
along = predict(jnp.asarray(flat), Smooth.soft(1.0))[: path.shape[0] * shown].reshape(path.shape[0], shown)

fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [1.2, 1]})
ax.contourf(grid, grid, land["soft"].T, levels=25, cmap="viridis")
for k, style in ((0, "--"), (1, "-")):
    ax.contour(grid, grid, g[..., k].T, levels=[0.0], colors="white", linestyles=style, linewidths=1.0)
colors = plt.cm.autumn(np.linspace(0, 1, shown))
for s in range(shown):
    ax.plot(path[:, s, I], path[:, s, J], "-", color=colors[s], lw=1.2)
    ax.plot(path[0, s, I], path[0, s, J], "o", mfc="none", color=colors[s])
    ax.plot(path[-1, s, I], path[-1, s, J], "x", color=colors[s], ms=8)
    ax2.plot(np.arange(path.shape[0]), along[:, s], color=colors[s])
ax.set_xlim(0, 8), ax.set_ylim(0, 8)
ax.set_xlabel("log2 S3 tile of m"), ax.set_ylabel("log2 S3 tile of n")
ax.set_title("trajectories (projected on the slice)", fontsize=10)
ax2.set_xlabel("Adam step"), ax2.set_ylabel("predicted score (soft, full x)")
ax2.set_title("objective along each trajectory", fontsize=10)
fig.tight_layout()
show(fig)"""),
    ("md", """## 4 · Rounding

Plain rounding of exponents is wrong: two levels at 0.6 of a budget of 1 both round up, and the tiles
no longer divide the extent. `round_x` projects onto the polytope, rounds each (axis, prime) budget
with largest remainders (so exponents sum exactly to the extent's), rounds unroll / vector width /
parallel depth, then repairs the hardware constraints with ±1 moves (a narrower vector, register-block
factors moved out to S2). Every point yields a valid config; none is dropped. The strategy harvests
every iterate, not just the last, and deduplicates."""),
    ("code", """final = traj[-1, :shown]
configs = rel.round_x(final)
scores = scorer.score(configs)  # exact (hard-mode) features -> model
print(" start (m3, n3) -> end (m3, n3)  | rounded config: tiles of m, n, k; parallel, vec, unroll  | valid | score")
for s, (cfg, sc) in enumerate(zip(configs, scores)):
    print(f"({path[0, s, I]:4.2f}, {path[0, s, J]:4.2f}) -> ({final[s, I]:4.2f}, {final[s, J]:4.2f})  | "
          f"{cfg.tiles[1:]} par={cfg.parallel} vec={cfg.vec} unroll={cfg.unroll}  | {space.is_valid(cfg)} | {sc:.2f}")

iterates = np.concatenate([x0[None], traj]).reshape(-1, traj.shape[-1])
unique, index = rel.round_unique(iterates)
naive_bad = 0
for x in iterates:
    try:
        naive_bad += not space.is_valid(rel.from_x(x))  # from_x: nearest integer exponents, no repair
    except ValueError:
        naive_bad += 1
print(f"\\n{len(iterates)} iterates -> {len(unique)} distinct valid configs "
      f"(all valid: {all(space.is_valid(c) for c in unique)}); plain rounding would give "
      f"{naive_bad} invalid ones ({100 * naive_bad / len(iterates):.0f}%)")"""),
    ("md", """## 5 · A real tuning run

`fj.tune` with the gradient strategy: rounds of propose (the descent above from 64 starts, harvest,
round, dedupe, rank by the model, plus a 5% random share) → build (gcc, in worker processes) →
measure (one kernel at a time in a separate process, output checked against numpy before and after
timing) → record → update the model. 16 trials at one thread, with a quick timing protocol; random
search with the same budget next to it. The curves are the runs' timings while tuning; each run's `best`
(in its repr) is its best kernels timed again, interleaved, at the end of the run (`retime=3`), so the two
can differ by the timing noise of a busy machine. (The descent's cost model starts from the MLP shipped with
felixjax, `cost_model="auto"`, pretrained on other layers, and is fine-tuned on these measurements; the roofline
prior takes over wherever the MLP ranks the task's held-out measurements worse.)"""),
    ("code", """from codegen.measure import TimingProtocol
from felixjax.strategies.gradient import GradientSearch

quick = TimingProtocol.quick()
runs = {}
for name in ("gradient", "random"):
    strategy = GradientSearch(starts=STARTS, steps=STEPS, batch_size=8) if name == "gradient" else name
    runs[name] = fj.tune(task, target, strategy, trials=16, threads=1, protocol=quick, seed=0, batch=8,
                         progress=False)
for name, res in runs.items():
    s = res.stats
    outside = s["propose_s"] + s["update_s"]
    print(f"{name:8s} {res!r}\\n         best while tuning {res.best_while_tuning.gflops:.1f} GFLOP/s (the "
          f"curve's end); statuses {res.status_counts()}; wall {s['wall_s']:.1f} s, "
          f"build+measure {s['build_measure_s']:.1f} s, propose+update {outside:.1f} s")
print("best gradient config:", runs["gradient"].best.config.dumps())

fig, ax = plt.subplots(figsize=(6, 3.2))
for name, res in runs.items():
    trials, best = res.curve()
    ax.step(trials, task.flops / best / 1e9, where="post", label=name)
ax.set_xlabel("trial"), ax.set_ylabel("best so far (GFLOP/s, 1 thread)")
ax.set_title(task.name, fontsize=9)
ax.legend()
fig.tight_layout()
show(fig)
print(f"notebook time so far: {time.perf_counter() - t_start:.0f} s")"""),
    ("md", """16 trials say little about which strategy is better; the point here is the loop itself. The
measured comparisons live in `benchmarks/compare.py` (gradient vs genetic at gradient's batch and at
Ansor's 64, random on request; 3 seeds and 256 trials by default, real timing or `--replay` on the
synthetic oracle; `fj.compare` and `felixjax compare` run the same protocol from Python and the shell) and `benchmarks/tune_ops.py` (256
gradient trials per operator, then the best kernels against onnxruntime, numpy and jax.jit), both
writing their tables into `docs/BENCHMARKS.md`."""),
]


def build() -> nbformat.NotebookNode:
    return build_notebook(CELLS)


if __name__ == "__main__":
    write_notebook(build(), NOTEBOOK)
