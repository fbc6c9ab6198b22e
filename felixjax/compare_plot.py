"""The figure of a strategy comparison (:meth:`felixjax.compare.Comparison.plot`): per task, the best
latency so far against trials (steps: it changes only when a trial finds a faster kernel) and against
seconds, one line per strategy (median over seeds; each seed thin beside it; a line style per strategy) with a
band from the best to the worst seed; a dotted
line at 95% of the best known (what "reached" means); a title saying what was run."""
from __future__ import annotations

import math
import os
import warnings

import numpy as np

from .report import latency_unit

STYLES = ("-", "--", "-.", (0, (6, 1.5, 1, 1.5, 1, 1.5)))  # per strategy: lines that coincide stay visible


def _unit(values: np.ndarray) -> tuple[str, float]:
    """A latency unit for one panel (seconds in, a readable unit out) from its finite values."""
    v = values[np.isfinite(values)]
    mid = float(np.median(v)) if len(v) else 1e-3
    return latency_unit(mid)


def _curves(cmp, task: str, strategy: str, grid_s: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Best latency so far (s) of every seed, by trial and on ``grid_s``: inf before a seed's first correct
    kernel, its final best after it ended (a median over the seeds still running rose where one stopped)."""
    runs = [r for r in (cmp.histories.get((task, strategy, seed), []) for seed in cmp.seeds) if r]
    if not runs:
        return None
    length = max(len(r) for r in runs)
    by_trial = np.full((len(runs), length), np.inf)
    by_time = np.full((len(runs), len(grid_s)), np.inf)
    for i, recs in enumerate(runs):
        best = np.minimum.accumulate([r.latency_s if r.ok else math.inf for r in recs])
        by_trial[i, : len(best)] = best
        by_trial[i, len(best):] = best[-1]
        pos = np.searchsorted([r.elapsed_s for r in recs], grid_s, side="right") - 1
        by_time[i] = np.where(pos >= 0, best[np.maximum(pos, 0)], np.inf)
    return by_trial, by_time


def plot_comparison(cmp, path: str | os.PathLike) -> str:
    """Write ``cmp``'s curves to the PNG ``path`` (``.png`` added without a suffix); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    n = max(1, len(cmp.tasks))
    fig, axes = plt.subplots(n, 2, figsize=(10, 3.2 * n + 0.9), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    failed, handles = set(cmp.failed()), {}
    for row, task in zip(axes, cmp.tasks):
        known = cmp.best_known(task.name)
        ends = [recs[-1].elapsed_s for (t, _, _), recs in cmp.histories.items() if t == task.name and recs]
        grid_s = np.linspace(0.0, max(ends, default=1.0), 200)
        curves = {s: _curves(cmp, task.name, s, grid_s) for s in cmp.strategies}
        finite = np.concatenate([c[0].ravel() for c in curves.values() if c is not None] + [np.array([known])])
        unit, scale = _unit(finite)
        length = max((c[0].shape[1] for c in curves.values() if c is not None), default=1)
        for k, s in enumerate(cmp.strategies):
            if curves[s] is None:
                continue
            color, style = colors[k % len(colors)], STYLES[k % len(STYLES)]
            for ax, x, y, step in ((row[0], np.arange(1, length + 1), curves[s][0], True),
                                   (row[1], grid_s, curves[s][1], False)):
                y = np.pad(y, ((0, 0), (0, len(x) - y.shape[1])), mode="edge") if y.shape[1] < len(x) else y
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    med, lo, hi = (np.where(np.isfinite(v), v * scale, np.nan)  # inf: not drawn
                                   for v in (np.median(y, 0), np.min(y, 0), np.max(y, 0)))
                kw = {"drawstyle": "steps-post"} if step else {}
                # each seed thin: a seed without a kernel yet leaves the median (and the band) undrawn (a review:
                # a seed that reached 95% at 3 s was invisible until the other's first kernel at 34 s)
                for seed_y in (y if y.shape[0] > 1 else ()):
                    ax.plot(x, np.where(np.isfinite(seed_y), seed_y * scale, np.nan), color=color, lw=0.6, alpha=0.45,
                            ls=style, **kw)
                (line,) = ax.plot(x, med, color=color, lw=1.4, ls=style, marker="o" if len(x) <= 3 else None, ms=4,
                                  **kw)
                ax.fill_between(x, lo, hi, color=color, alpha=0.2, lw=0, step="post" if step else None)
                handles.setdefault(s, line)
        tag = " (no correct kernel: left out of the ratios)" if task.name in failed else (
            " (the opening reaches 95%: apart)" if cmp.opening_reaches(task.name) else "")
        for ax, xlabel in zip(row, ("trials", "seconds of the run's clock" + (
                " (simulated trial cost + search time)" if cmp.replay else ""))):
            if math.isfinite(known):
                ax.axhline(known / cmp.reach_frac * scale, color="grey", ls=":", lw=1)
            if any(np.isfinite(line.get_ydata()).any() for line in ax.get_lines()):
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
                lo, hi = ax.get_ylim()  # over a decade, only the minor ticks at 2x and 5x a power of ten are
                wide = hi > 10 * lo  # labelled (every one piled up); within one, every one (else none might be)
                ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _, wide=wide: f"{v:.3g}" if not wide or (
                    v > 0 and round(v / 10 ** math.floor(math.log10(v))) in (2, 5)) else ""))
                ax.tick_params(axis="y", which="both", labelsize=7)
            else:
                noisy = any(r.status == "noisy" for (t, _, _), recs in cmp.histories.items() if t == task.name
                            for r in recs)
                ax.text(0.5, 0.5, "correct kernels, but only disturbed timings (noisy)" if noisy else
                        "no correct kernel measured", ha="center", va="center", transform=ax.transAxes)
                ax.set_yticks([])
            if xlabel == "trials":
                ax.set_xlim(0.5, max(length, 1) + 0.5)
            else:
                ax.set_xlim(0.0, max(float(grid_s[-1]), 1e-3))
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"best latency so far ({unit})")
            ax.set_title(task.name + tag, fontsize=8)
    budget = f"{cmp.trials} trial{'s' if cmp.trials != 1 else ''}" + (f" / {cmp.seconds:g} s" if cmp.seconds else "")
    mode = "replayed (synthetic latencies)" if cmp.replay else "measured on this machine"
    thin = "thin: each seed; " if len(cmp.seeds) > 1 else ""
    fig.suptitle(f"{budget} per run, seeds {', '.join(map(str, cmp.seeds))}, {mode}.\nLines: median over seeds; "
                 f"{thin}bands: best to worst seed; dotted grey: {cmp.reach_frac:.0%} of the best known", fontsize=9)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(len(handles), 6), fontsize=8,
                   frameon=False)
    fig.tight_layout(rect=(0, 0.05 if handles else 0, 1, 0.93))  # (a two-line title: one line was cut off)
    path = os.fspath(path)
    path = path if os.path.splitext(path)[1] else path + ".png"  # what matplotlib writes without a suffix
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
