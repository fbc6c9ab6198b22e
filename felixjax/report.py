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
from pathlib import Path

from codegen.target import Target

from .database import Database


def latency_unit(seconds: float) -> tuple[str, float]:
    """The unit a latency of about ``seconds`` reads best in, and its scale: ``("ms", 1e3)`` for 0.0042 s."""
    return ("s", 1.0) if seconds >= 1 else ("ms", 1e3) if seconds >= 1e-3 else ("µs", 1e6)


def summary_rows(db: Database) -> list[dict]:
    """One row per (task, target, run): trials, statuses, best latency while tuning, its re-timing at the
    end of the run where there is one (``retimed_ms``), and GFLOP/s (of ``retimed_ms`` where there is one, the
    figure ``fj.tune`` reports, else of ``best_ms``). Aggregated in SQL
    (:meth:`Database.run_summaries`): a database of a million records is not decoded record by record."""
    runs = db.run_summaries()
    replayed = db.replayed_runs()
    simulated = any((r["target"] or {}).get("kind") == "cuda-sim" for r in runs)  # a GPU simulator's times
    several = len({r["target_key"] for r in runs}) > 1  # one task tuned at 1 and 2 threads (or replayed): tell them apart
    retimed = any(r["retimed_s"] is not None for r in runs)
    out = []
    for r in runs:
        best = r["best_s"]
        row = {"task": r["task"].name, "run": r["run"], "trials": r["trials"], "ok": r["ok"],
               "best_ms": best * 1e3}
        if retimed:  # the end-of-run re-timings (retime:<run>, the best configs timed again, interleaved): the
            # figure fj.tune reports, beside best_ms, the minimum over the noisy timings while tuning
            row["retimed_ms"] = None if r["retimed_s"] is None else r["retimed_s"] * 1e3
        fig = r["retimed_s"] if r["retimed_s"] is not None else best
        row.update(gflops=r["task"].flops / fig / 1e9 if math.isfinite(fig) and fig > 0 else 0.0,
                   sketch=r["sketch"], seconds=max(r["seconds"], 0.0),
                   failures=", ".join(f"{k}={v}" for k, v in sorted(r["statuses"].items())) or "-")
        if replayed or simulated:  # a replay measurer's synthetic latencies (under this CPU's key), or simulated
            row["latencies"] = ("replayed" if (r["task"].key, r["target_key"], r["run"]) in replayed else
                                "simulated" if (r["target"] or {}).get("kind") == "cuda-sim" else "measured")
        if several:
            row = {"task": row["task"], "target": target_label(r["target_key"], r["target"]), **row}
        out.append(row)
    return out


def target_label(target_key: str, target_json: dict | None) -> str:
    """A readable name of the target a record was filed under: ``cpu AMD EPYC, 1 thread``,
    ``cuda-sim a100``, ``replay: ...``; the key itself when the record's target JSON is unknown."""
    replay, _, key = target_key.rpartition(":") if target_key.startswith("replay:") else ("", "", target_key)
    if not target_json:
        return target_key
    try:
        target = Target.from_json(dict(target_json))
    except (TypeError, ValueError):
        return target_key
    label = f"{target.kind} {target.name}"
    if not target.is_gpu:  # records at another thread count than the machine's cores carry that count's key
        threads = next((n for n in range(1, max(target.cores, 1) + 1) if target.at_threads(n).key == key), None)
        label += f", {threads} thread{'s' if threads != 1 else ''}" if threads else f" ({key[:8]})"
    return (replay + ": " if replay else "") + label


#: At most this many columns of panels, and this many panels in one figure (the tasks with the most
#: trials; the figure's title says how many were left out): the PNG stays a readable, bounded size.
PLOT_MAX_COLUMNS = 4
PLOT_MAX_PANELS = 24


def plot_curves(db: Database, path: str) -> str:
    """Best-so-far latency against trials: small multiples, one panel per (task, target) on a grid of
    at most :data:`PLOT_MAX_COLUMNS` columns, one line per run (a colour per strategy, a line style per
    seed, one legend), latency on a log axis in a unit per panel (a failures-only panel says so and has
    none); the title names the machine, or that the data was replayed. Re-timing rows (``retime:<run>``) are not trials and
    are left out. The figure is at most ``PLOT_MAX_COLUMNS x PLOT_MAX_PANELS / PLOT_MAX_COLUMNS``
    panels of 3.6 x 2.6 inches at 100 dpi, whatever the database holds. Returns ``path``."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    series: dict[tuple[str, str], dict[str, list[float]]] = {}
    names: dict[tuple[str, str], str] = {}
    labels: dict[str, dict] = {}
    for task, target_key, target in db.task_targets():  # one decoded row per (task, target), in database order
        names[task.key, target_key] = task.name
        labels.setdefault(target_key, target)
    for task_key, target_key, run, lat in db.trial_latencies():  # the columns only, no record decoded
        s = series.setdefault((task_key, target_key), {}).setdefault(run, [])
        lat = lat if math.isfinite(lat) and lat > 0 else math.inf
        s.append(min(s[-1] if s else math.inf, lat))
    several_targets = len({k[1] for k in series}) > 1
    keys = [k for k in series if k in names]  # a task a tuner began after the names were read: the next report
    if len(keys) > PLOT_MAX_PANELS:  # the most-tuned tasks, kept in database order
        kept = set(sorted(keys, key=lambda k: -sum(len(v) for v in series[k].values()))[:PLOT_MAX_PANELS])
        keys = [k for k in keys if k in kept]
    run_names = sorted({r for k in keys for r in series[k]})
    shown_keys = set(keys)
    replayed_names = {k[2] for k in db.replayed_runs() if k[:2] in shown_keys}
    # a colour per strategy ("gradient:0" -> "gradient"), a line style per seed of it: seeds read as one family
    strategies = sorted({r.rpartition(":")[0] or r for r in run_names})
    colors = {r: f"C{strategies.index(r.rpartition(':')[0] or r) % 10}" for r in run_names}
    seeds = {st: sorted(r for r in run_names if (r.rpartition(":")[0] or r) == st) for st in strategies}
    styles = {r: ("-", "--", ":", "-.")[seeds[r.rpartition(":")[0] or r].index(r) % 4] for r in run_names}

    finite = sorted(s[-1] for k in keys for s in series[k].values() if math.isfinite(s[-1]))
    mid = finite[len(finite) // 2] if finite else 1e-3
    unit, scale = latency_unit(mid)

    n = max(1, len(keys))
    cols = min(PLOT_MAX_COLUMNS, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.6 * rows + 0.5), squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= len(keys):
            ax.set_visible(False)
            continue
        key = keys[i]
        mine = sorted(y for ys in series[key].values() for y in ys if math.isfinite(y))
        if mine:  # a unit per panel: a 0.2 us kernel beside 2 ms ones reads "0.2 us", not "0.0002 ms"
            mid = mine[len(mine) // 2]
            unit, scale = latency_unit(mid)
        for run, ys in sorted(series[key].items()):
            vs = [y * scale if math.isfinite(y) else math.nan for y in ys]
            ax.plot(range(1, len(vs) + 1), vs, drawstyle="steps-post", color=colors[run], linestyle=styles[run],
                    linewidth=1.3, label=run,
                    marker="o" if len(vs) <= 3 else None, ms=4)  # one trial: a dot, not nothing
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # trials are counted: no 1.25, 1.5
        if not any(math.isfinite(y) for ys in series[key].values() for y in ys):  # failures only: say so
            ax.text(0.5, 0.5, "no correct kernel measured", ha="center", va="center", fontsize=8,
                    transform=ax.transAxes)
            ax.set_xlim(0.5, max(len(ys) for ys in series[key].values()) + 0.5)  # over its failed trials
            ax.set_yticks([])
            ax.tick_params(labelsize=7)
            ax.set_title("\n".join(textwrap.wrap(names[key], 42)[:2]), fontsize=8)
            ax.set_xlabel("trials", fontsize=8)
            continue  # no latency: no log axis to draw
        title = names[key] + (f" @ {target_label(key[1], labels.get(key[1]))}" if several_targets else "")
        ax.set_title("\n".join(textwrap.wrap(title, 42)[:2]), fontsize=8)
        ax.set_yscale("log")
        seen = [v for ys in series[key].values() for v in ys if math.isfinite(v)]
        # enough digits that neighbouring ticks of a narrow range differ (".4g" printed 1.748 five times)
        digits = 4 if not seen or max(seen) == min(seen) else min(8, max(4, 2 + math.ceil(
            -math.log10((max(seen) - min(seen)) / max(seen)))))
        plain = FuncFormatter(lambda v, _, d=digits: f"{v:.{d}g}")
        ax.yaxis.set_major_formatter(plain)
        if seen and max(seen) == min(seen):  # one flat line: a narrow axis around it (not a decade of ticks)
            ax.set_ylim(min(seen) * scale / 1.3, min(seen) * scale * 1.3)
        if seen and max(seen) < 10 * min(seen):  # within a decade the minor ticks carry the only labels: 2, 3, 5
            ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 3.0, 5.0)))
            ax.yaxis.set_minor_formatter(plain)
        else:  # across decades labelled minor ticks (2, 3, ..., 9 of each) run into each other
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.tick_params(which="both", labelsize=7)
        ax.grid(True, which="both", alpha=0.25)
        ax.set_ylabel(f"best latency ({unit})", fontsize=8)
        if i >= len(keys) - cols:
            ax.set_xlabel("trials", fontsize=8)
    left_out = len(series) - len(keys)
    heading = "best-so-far latency per task" + (
        f" ({len(keys)} of {len(series)} tasks: the most-tuned; {left_out} left out)" if left_out else "")
    targets = {k[1] for k in keys}
    if len(targets) == 1:  # where it was measured (or that it was not: a replay's synthetic latencies)
        key = next(iter(targets))
        heading += f", {target_label(key, labels.get(key))}" + (" (replayed: synthetic latencies, not measured)"
                                                                 if key.startswith("replay:") else "")
    fig.suptitle(textwrap.fill(heading, int(12 * 3.6 * cols)), fontsize=10)
    handles = [plt.Line2D([], [], color=colors[r], linestyle=styles[r]) for r in run_names]
    drawn = {r for k in keys for r, ys in series[k].items() if any(math.isfinite(y) for y in ys)}
    # a run without one correct kernel draws no line: its legend entry says so
    shown = [(f"{r} (replayed)" if r in replayed_names else r) + ("" if r in drawn else " (no correct kernel)")
             for r in run_names]
    # legend columns that fit the figure's width (7-point text: ~0.06 inch a character, a 0.5 inch handle)
    ncol = max(1, min(len(run_names), cols * 2, int(3.6 * cols / (0.5 + 0.06 * max(map(len, shown or [""]))))))
    if handles:
        fig.legend(handles, shown, loc="lower center", ncol=ncol, fontsize=7, frameon=False)
    legend_rows = math.ceil(len(run_names) / ncol)
    height = 2.6 * rows + 0.5
    fig.tight_layout(rect=(0, min(0.3, (0.1 + 0.2 * legend_rows) / height) if handles else 0, 1, 1))
    if not Path(path).suffix:  # matplotlib appends its default format's suffix: say where the file really is
        path = f"{path}.png"
    fig.savefig(path, dpi=100)
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
        return "-" if math.isinf(v) else (f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}")  # inf: no clean timing
    return str(v)


def report(path: str, *, plot: str | None = None) -> str:
    """The ``felixjax report`` text (and optionally a PNG of the tuning curves)."""
    if plot is not None and not str(plot).strip():  # `--plot ""` (an unset variable): it wrote nothing, silently
        raise ValueError("the plot path is empty; give a file name, e.g. curves.png")
    with Database(path, readonly=True) as db:
        rows = summary_rows(db)
        if not rows:
            what = f"(no tuning history: {len(db)} re-timing rows only)" if len(db) else "(empty database)"
            return what + (f"; no plot written to {plot}" if plot else "")
        trials = sum(r["trials"] for r in rows)  # the table's; end-of-run re-timings are counted apart
        again = len(db) - trials
        text = (f"{path}: {trials} measurements" + (f" (and {again} re-timings of bests)" if again else "")
                + f", {len({r['task'] for r in rows})} task(s)\n\n" + text_table(rows))
        if plot:
            text += f"\n\ntuning curves: {plot_curves(db, plot)}"
    return text
