"""The records of :func:`felixjax.approx.search.approximate`: what each layer became, each measured point,
the result (its table, its Pareto front, its held-out check)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..network_build import CompiledModel
from . import formats as fm
from .formats import Format
from .quality import binomial_ci


@dataclass(frozen=True)
class LayerDecision:
    """What one conv / dense layer became: its task before and after, output channels, precision, sparsity."""

    name: str
    before: str
    after: str
    channels: tuple[int, int]
    precision: str = "float32"
    sparsity: float = 0.0


@dataclass(frozen=True)
class ParetoPoint:
    """One measured network: its latency (seconds, C build), quality and loss against the baseline."""

    method: str
    latency_s: float
    quality: float
    quality_loss: float
    keep: tuple[tuple[int, int], ...]
    note: str = ""
    #: the float32 baseline timed interleaved with this point (same load, same minute): the speedup's
    #: denominator; NaN for the baseline itself
    baseline_s: float = float("nan")
    #: the layers built at int8 (the others float32)
    int8: tuple[str, ...] = ()
    #: every layer not in the reference format: ``((layer, precision, sparsity), ...)`` (int8, float16,
    #: sparse float32; :func:`felixjax.approx.formats.key`)
    formats: tuple[tuple[str, str, float], ...] = ()

    @property
    def speedup(self) -> float:
        return (self.baseline_s if math.isfinite(self.baseline_s) else self.latency_s) / self.latency_s

    @property
    def chosen(self) -> dict[str, Format]:
        """``{layer: (precision, sparsity)}`` of the layers not in the reference format."""
        return fm.of_key(self.formats)


@dataclass(frozen=True)
class ApproxResult:
    """What :func:`approximate` returns; every number in it is measured on the built networks."""

    baseline: CompiledModel
    executable: CompiledModel
    metric: str
    baseline_latency_s: float
    latency_s: float
    baseline_quality: float
    quality: float
    quality_budget: float
    layers: tuple[LayerDecision, ...]
    pareto: tuple[ParetoPoint, ...]
    quality_evals: int
    excluded: tuple[str, ...] = ()
    trace: tuple[dict, ...] = field(default=(), repr=False)

    chosen: ParetoPoint | None = None
    #: configurations scored on the given data in JAX (hard masks, no build) by the front search
    search_evals: int = 0
    #: ``(chosen network s, baseline s)`` timed again, interleaved, after the choice (the point's own timing
    #: is the one that won among several noisy ones, biased up); ``None`` where the baseline was kept
    retimed: tuple[float, float] | None = None
    #: samples of the data the search chose on, as its metric counts them (labels: B per input of a graph pinned
    #: to batch B) (``quality`` is in-sample: measured on them)
    samples: int = 0
    #: the held-out check (``approximate(holdout=...)``): the metric of the baseline and of the chosen network on
    #: samples the search never saw; NaN and 0 without one
    heldout_baseline_quality: float = float("nan")
    heldout_quality: float = float("nan")
    heldout_samples: int = 0

    @property
    def speedup(self) -> float:
        """Measured: the chosen network against the float32 build timed interleaved with it (again after the
        choice: :attr:`retimed`)."""
        if self.retimed is not None:
            return self.retimed[1] / self.retimed[0]
        return self.chosen.speedup if self.chosen is not None else self.baseline_latency_s / self.latency_s

    @property
    def quality_loss(self) -> float:
        """The metric's drop on the data the search chose on (in-sample: optimistic where many points were
        compared; :attr:`heldout_loss` is the check on other data)."""
        return self.baseline_quality - self.quality

    @property
    def heldout_loss(self) -> float:
        """The metric's drop on the held-out samples (NaN without ``holdout=``)."""
        return self.heldout_baseline_quality - self.heldout_quality

    @property
    def front(self) -> tuple[ParetoPoint, ...]:
        """The measured points no other measured point beats: none has a speedup (interleaved with the
        float32 build) >= and a quality >= with one of them strictly better. Sorted by speedup."""
        return pareto_front(self.pareto)

    def export(self, directory: str | os.PathLike) -> Path:
        """The approximated network as a standalone C folder (``CompiledModel.export``)."""
        return self.executable.export(directory)

    def table(self, *, holdout_hint: str = "holdout=") -> str:
        """The measured points and the chosen layers, as text (``holdout_hint``: how the in-sample note names the
        held-out check, ``--holdout NPZ`` on the command line)."""
        lines = [f"baseline (tuned float32): {self.baseline_latency_s * 1e3:.4g} ms, {self.metric} "
                 f"{self.baseline_quality:.4f}",
                 f"{'method':<12} {'ms':>8} {'base ms':>8} {'speedup':>8} {self.metric:>9} {'loss':>8}  channels kept"]
        for p in self.pareto:  # base ms: the baseline timed beside the point (the speedup's denominator)
            base = f"{p.baseline_s * 1e3:>8.4g}" if math.isfinite(p.baseline_s) else f"{'-':>8}"
            lines.append(f"{p.method:<12} {p.latency_s * 1e3:>8.4g} {base} {p.speedup:>7.2f}x "
                         f"{p.quality:>9.4f} {p.quality_loss:>8.4f}  {' '.join(str(n) for _, n in p.keep)}  {p.note}"
                         + (f" ({fm.describe(p.chosen)})" if p.formats else ""))
        again = (f" (timed again beside the baseline after the choice; {self.chosen.speedup:.2f}x when chosen)"
                 if self.retimed is not None and self.chosen is not None else "")
        lines.append(f"chosen: {self.latency_s * 1e3:.4g} ms, {self.speedup:.2f}x{again}, loss {self.quality_loss:.4f} "
                     f"(budget {self.quality_budget}); {self.quality_evals} quality evaluations of built networks, "
                     f"{self.search_evals} of configurations in JAX")
        lines.append(self._quality_note(holdout_hint))
        kept = next((t["kept_baseline"] for t in self.trace if "kept_baseline" in t), None)
        if kept is not None:  # the fastest point within budget was not faster when timed again
            a, b = kept["retimed_s"]
            lines.append(f"note: the point chosen ({kept['chosen']}) timed again beside the baseline ran "
                         f"{a * 1e3:.4g} ms against {b * 1e3:.4g} ms: not faster, so the exact float32 network is kept")
        lines += [f"  {d.name}: {d.before} -> {d.after} ({d.precision}" + (f", sparsity {d.sparsity:g})" if d.sparsity
                  else ")") for d in self.layers if d.before != d.after] + [f"  excluded: {e}" for e in self.excluded]
        paired = [p.baseline_s for p in self.pareto if math.isfinite(p.baseline_s)]
        busy = [b / self.baseline_latency_s for b in paired if b > 2 * self.baseline_latency_s]
        if busy:  # a loaded machine: ms of different rows do not compare, the paired speedups do
            lines.append(f"note: {len(busy)} point(s) were timed on a busy machine (the baseline beside them read up "
                         f"to {max(busy):.1f}x its own figure): compare rows by speedup")
        if paired and self.baseline_latency_s > 2 * min(paired):  # the baseline's own figure is the outlier
            own, beside = self.baseline_latency_s * 1e3, min(paired) * 1e3
            lines.append(f"note: the baseline's own figure ({own:.4g} ms; {beside:.4g} ms beside a point) was timed on "
                         f"a busy machine: figures built on it are not to be trusted")
        return "\n".join(lines)


    def _quality_note(self, holdout_hint: str) -> str:
        n = self.samples
        if self.heldout_samples:
            h, hq = self.heldout_samples, self.heldout_quality
            ci = binomial_ci(hq, h) if self.metric == "accuracy" else None
            return (f"held out ({h} samples the search never saw): {self.metric} "
                    f"{self.heldout_baseline_quality:.4f} -> {hq:.4f}, loss {self.heldout_loss:+.4f} "
                    f"({'within' if self.heldout_loss <= self.quality_budget + 1e-9 else 'OVER'} budget)"
                    + (f"; 95% interval of its accuracy [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else ""))
        one = f"; one sample is {1 / n:.4f} of accuracy" if n and self.metric == "accuracy" else ""
        return (f"note: {self.metric} and loss are in-sample: measured on the {f'{n} ' if n else ''}samples that "
                f"chose the network{one}; pass {holdout_hint} for a check on data it never saw")


def pareto_front(points: tuple[ParetoPoint, ...] | list[ParetoPoint]) -> tuple[ParetoPoint, ...]:
    """The non-dominated points of ``points`` by (speedup up, quality up); ties keep the first.

    Example:
        >>> a, b, c = (ParetoPoint("x", 1.0, q, 0.0, (), baseline_s=s) for q, s in ((0.9, 2.0), (0.8, 1.5), (0.95, 1.2)))
        >>> [p.quality for p in pareto_front([a, b, c])]
        [0.95, 0.9]
    """
    pts = list(points)
    out = []
    for i, p in enumerate(pts):
        beaten = any((q.speedup >= p.speedup and q.quality >= p.quality
                      and (q.speedup > p.speedup or q.quality > p.quality or j < i))
                     for j, q in enumerate(pts) if j != i)
        if not beaten:
            out.append(p)
    return tuple(sorted(out, key=lambda p: p.speedup))
