"""Statistics of a strategy comparison: geomeans of per-task ratios and their bootstrap intervals
over each task's seeds (used by :class:`felixjax.compare.Comparison` and the benchmark scripts)."""
from __future__ import annotations

import math

import numpy as np


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


#: the per-run outcomes :func:`bootstrap_ratios` resamples
METRICS = ("trials95", "seconds95", "final")


def bootstrap_ratios(runs: dict[tuple[str, str], dict[str, list[float]]], ref: str, *, n: int = 2000,
                     level: float = 0.9, seed: int = 0, paired: bool = False) -> dict[str, dict[str, tuple[float, float]]]:
    """Percentile bootstrap intervals of the geomean over tasks of ``strategy / ref`` medians.

    ``runs[(task, strategy)]`` holds one value per seed (run) of each of :data:`METRICS` (a censored run
    enters as the budget it spent, as in :meth:`Comparison.ratios`, so an interval over censored tasks is
    a bound of the same kind). Each resample draws every (task, strategy)'s runs with replacement,
    independently (the seeds of two strategies are different runs), takes the medians, their ratio per
    task and the geomean over the tasks (kept fixed: the targets are geomeans over a named suite). Returns
    ``{strategy: {metric: (low, high)}}`` at the central ``level``; the spread is what the few seeds per
    op leave open, not the host's drift between sessions. ``paired``: the runs of a task are seed-paired
    (the same seeds in the same order for every strategy, as an ablation's arms are under common random
    numbers), so one draw of seed indices serves the strategy and ``ref`` alike.

    Example:
        >>> runs = {("t", "a"): {"trials95": [10, 12, 14], "seconds95": [1, 1, 1], "final": [1, 1, 1]},
        ...         ("t", "b"): {"trials95": [20, 24, 28], "seconds95": [2, 2, 2], "final": [1, 1, 1]}}
        >>> lo, hi = bootstrap_ratios(runs, "a")["b"]["trials95"]
        >>> 20 / 14 <= lo <= 2.0 <= hi <= 28 / 10
        True
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1) (got {level})")
    rng = np.random.default_rng(seed)
    tasks = sorted({t for t, _ in runs})
    strategies = sorted({s for _, s in runs} - {ref})
    tail = 100.0 * (1.0 - level) / 2.0

    def medians(values: list[float], idx: np.ndarray | None = None) -> np.ndarray:
        v = np.asarray(values, np.float64)
        return np.median(v[rng.integers(len(v), size=(n, len(v))) if idx is None else idx], axis=1)

    out: dict[str, dict[str, tuple[float, float]]] = {}
    for s in strategies:
        both = [t for t in tasks if runs.get((t, s)) and runs.get((t, ref))]
        if not both:
            continue
        out[s] = {}
        for m in METRICS:
            logs = np.zeros(n)
            for t in both:
                a, b = runs[(t, s)][m], runs[(t, ref)][m]
                if paired and len(a) != len(b):
                    raise ValueError(f"paired runs of {t!r}: {s!r} has {len(a)} seeds, {ref!r} {len(b)}")
                idx = rng.integers(len(a), size=(n, len(a))) if paired else None
                logs += np.log(np.maximum(medians(a, idx), 1e-12) / np.maximum(medians(b, idx), 1e-12))
            g = np.exp(logs / len(both))
            out[s][m] = (float(np.percentile(g, tail)), float(np.percentile(g, 100.0 - tail)))
    return out
