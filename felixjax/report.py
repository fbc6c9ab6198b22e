"""Summaries of a tuning database: a table per (task, run) and tuning-curve plots.

Example:
    >>> from felixjax.report import report
    >>> import tempfile, os, felixjax as fj
    >>> p = os.path.join(tempfile.mkdtemp(), "r.db"); fj.Database(p).close()
    >>> print(report(p))
    (empty database)
"""
from __future__ import annotations

import math

from .database import Database


def summary_rows(db: Database) -> list[dict]:
    """One row per (task, target, run): trials, statuses, best latency and GFLOP/s."""
    rows: dict[tuple, dict] = {}
    for rec in db.records():
        key = (rec.task.key, rec.target_key, rec.run)
        row = rows.setdefault(key, {"task": rec.task.name, "run": rec.run, "trials": 0, "ok": 0, "failed": 0,
                                    "best_ms": math.inf, "gflops": 0.0, "sketch": "-", "seconds": 0.0})
        row["trials"] += 1
        row["seconds"] = max(row["seconds"], rec.elapsed_s)
        if rec.ok:
            row["ok"] += 1
            if rec.latency_s * 1e3 < row["best_ms"]:
                row["best_ms"], row["gflops"], row["sketch"] = rec.latency_s * 1e3, rec.gflops, rec.config.sketch
        else:
            row["failed"] += 1
            row.setdefault("statuses", {}).setdefault(rec.status, 0)
            row["statuses"][rec.status] += 1
    out = []
    for row in rows.values():
        st = row.pop("statuses", {})
        row["failures"] = ", ".join(f"{k}={v}" for k, v in sorted(st.items())) or "-"
        del row["failed"]
        out.append(row)
    return out


def plot_curves(db: Database, path: str) -> str:
    """Best-so-far latency against trials, one line per (task, run), one panel per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, dict[str, list[float]]] = {}
    for rec in db.records():
        s = series.setdefault(rec.task.name, {}).setdefault(rec.run, [])
        s.append(min(s[-1] if s else math.inf, rec.latency_s))
    n = max(1, len(series))
    fig, axes = plt.subplots(1, n, figsize=(4.5 * n, 3.4), squeeze=False)
    for ax, (task, runs) in zip(axes[0], series.items()):
        for run, ys in sorted(runs.items()):
            ax.plot(range(1, len(ys) + 1), [y * 1e3 for y in ys], label=run)
        ax.set_title(task, fontsize=8)
        ax.set_xlabel("trials")
        ax.set_ylabel("best latency (ms)")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def text_table(rows: list[dict]) -> str:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[_fmt_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def _fmt_cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "inf" if math.isinf(v) else (f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}")
    return str(v)


def report(path: str, *, plot: str | None = None) -> str:
    """The ``felixjax report`` text (and optionally a PNG of the tuning curves)."""
    with Database(path, readonly=True) as db:
        rows = summary_rows(db)
        if not rows:
            return "(empty database)"
        text = f"{path}: {len(db)} measurements, {len({r['task'] for r in rows})} task(s)\n\n" + text_table(rows)
        if plot:
            text += f"\n\ntuning curves: {plot_curves(db, plot)}"
    return text
