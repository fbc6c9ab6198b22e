"""`felixjax report --plot`: small multiples (one panel per task, at most 4 columns, log latency axis)
in a figure of bounded size, never one long strip."""
from __future__ import annotations

import numpy as np
import pytest

import felixjax as fj
import felixjax.testing
from felixjax import report as report_mod

pytest.importorskip("matplotlib")

SPECS = ["matmul:m=32,n=32,k=32", "matmul:m=48,n=64,k=32", "matmul:m=64,n=64,k=64",
         "matmul:m=16,n=128,k=64", "matmul:m=96,n=32,k=48", "matmul:m=128,n=16,k=16"]


def _tune(path, specs, run=None):
    for spec in specs:
        fj.tune(spec, measurer=lambda t, tg: felixjax.testing.ReplayRunner.from_oracle(t, tg), progress=False,
                retime=0, strategy="random", trials=8, db=path, **({"run": run} if run else {}))


@pytest.fixture(scope="module")
def six_task_db(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("plot") / "runs.db")
    _tune(path, SPECS)
    return path


def _panels(monkeypatch, legends: list | None = None):
    """Calls plot_curves for real and returns the figure's visible axes (captured before closing); the
    figure legends' texts go to ``legends``."""
    import matplotlib.pyplot as plt

    seen = []
    real_close = plt.close

    def close(fig=None):
        if fig is not None and hasattr(fig, "axes"):
            seen.append([ax for ax in fig.axes if ax.get_visible()])
            if legends is not None:
                legends.append([t.get_text() for leg in fig.legends for t in leg.get_texts()])
        return real_close(fig)

    monkeypatch.setattr(plt, "close", close)
    return seen


def test_plot_is_small_multiples_of_bounded_size(six_task_db, tmp_path, monkeypatch):
    import matplotlib.image

    seen = _panels(monkeypatch)
    png = tmp_path / "curves.png"
    text = report_mod.report(six_task_db, plot=str(png))
    assert str(png) in text
    h, w = matplotlib.image.imread(png).shape[:2]
    assert w <= 4 * 3.6 * 100 + 1 and h <= 2000, (w, h)   # 4 columns x 2 rows, not a 6-panel strip
    assert w < 3 * h, (w, h)
    (axes,) = seen
    assert len(axes) == 6                                   # one panel per task
    with fj.Database(six_task_db, readonly=True) as db:
        names = sorted(t.name for t, _ in db.tasks())
    assert sorted(ax.get_title() for ax in axes) == names  # titled with the task name
    assert all(ax.get_yscale() == "log" for ax in axes)
    assert all(len(ax.get_lines()) == 1 for ax in axes)     # one best-so-far line per run
    for ax in axes:
        ys = list(ax.get_lines()[0].get_ydata())
        assert ys == sorted(ys, reverse=True)               # best so far never goes up


def test_plot_stays_bounded_with_many_tasks(tmp_path, monkeypatch):
    import matplotlib.image

    monkeypatch.setattr(report_mod, "PLOT_MAX_PANELS", 4)
    seen = _panels(monkeypatch)
    path = str(tmp_path / "runs.db")
    _tune(path, SPECS)
    _tune(path, SPECS[:2], run="second")
    png = tmp_path / "curves.png"
    report_mod.report(path, plot=str(png))
    (axes,) = seen
    assert len(axes) == 4                                   # capped; the title says how many were left out
    assert max(len(ax.get_lines()) for ax in axes) == 2     # two runs on the tasks tuned twice
    h, w = matplotlib.image.imread(png).shape[:2]
    assert w <= 4 * 3.6 * 100 + 1 and h <= 2000, (w, h)


def test_plot_path_without_suffix_is_reported_where_it_is_written(six_task_db, tmp_path, monkeypatch):
    """Session 72: ``--plot curves`` wrote ``curves.png`` (matplotlib adds its format's suffix) but the report said
    ``curves``. And minor ticks are labelled only on panels that span less than a decade (else the labels ran into
    each other)."""
    from matplotlib.ticker import NullFormatter

    seen = _panels(monkeypatch)
    text = report_mod.report(six_task_db, plot=str(tmp_path / "curves"))
    assert f"tuning curves: {tmp_path / 'curves.png'}" in text and (tmp_path / "curves.png").stat().st_size > 1000
    assert not (tmp_path / "curves").exists()
    (axes,) = seen
    for ax in axes:
        ys = [y for line in ax.get_lines() for y in line.get_ydata()]
        wide = max(ys) >= 10 * min(ys)
        assert isinstance(ax.yaxis.get_minor_formatter(), NullFormatter) == wide


def test_report_rows_of_several_targets_say_which(tmp_path):
    """Session 72: one task tuned at 1 and at 2 threads gave two identical-looking rows."""
    path = str(tmp_path / "two.db")
    target = fj.Target.cpu(cores=2)
    for threads in (1, 2):
        fj.tune("matmul:m=32,n=32,k=32", target, progress=False, retime=0, strategy="random", trials=2,
                threads=threads, db=path,
                measurer=lambda t, tg: felixjax.testing.ReplayRunner.from_oracle(t, tg))
    with fj.Database(path, readonly=True) as db:
        rows = report_mod.summary_rows(db)
    # session 73: named readably (they showed the key's hash), threads included
    assert sorted(r["target"] for r in rows) == [f"cpu {target.name}, 1 thread",
                                                f"cpu {target.name}, 2 threads"]
    gpu = fj.Target.cuda_sim("a100")
    assert report_mod.target_label(gpu.key, gpu.to_json()) == "cuda-sim a100"
    assert report_mod.target_label("replay:" + target.key, target.to_json()) == f"replay: cpu {target.name}, 2 threads"
    assert report_mod.target_label("0123456789abcdef", None) == "0123456789abcdef"  # no JSON: the key
    single = str(tmp_path / "one.db")
    _tune(single, SPECS[:1])
    with fj.Database(single, readonly=True) as db:
        assert "target" not in report_mod.summary_rows(db)[0]  # one target: no column


def test_report_counts_trials_and_retimings_apart(tmp_path):
    # session 73: the header counted the end-of-run re-timing rows as measurements ("52" over 46 trials)
    path = str(tmp_path / "r.db")
    fj.tune("matmul:m=32,n=32,k=32", fj.Target.cpu(), progress=False, retime=2, strategy="random", trials=6,
            db=path, measurer=lambda t, tg: felixjax.testing.ReplayRunner.from_oracle(t, tg))
    with fj.Database(path, readonly=True) as db:
        again = len(db) - 6
    assert again > 0
    assert f": 6 measurements (and {again} re-timings of bests), 1 task(s)" in report_mod.report(path)
    # session 76: the table shows the re-timed best (what fj.tune reports) beside the minimum while tuning
    with fj.Database(path, readonly=True) as db:
        row = report_mod.summary_rows(db)[0]
        want = min(r.latency_s for r in db.records(retimes=True) if r.run == "retime:random:0") * 1e3
    assert list(row)[list(row).index("best_ms") + 1] == "retimed_ms" and row["retimed_ms"] == pytest.approx(want)
    # session 79 (a review of the reports): resumed, the report took the lowest of every re-timing the run ever had
    # (35% below what fj.tune reported), and its GFLOP/s came from the minimum while tuning
    res = fj.tune("matmul:m=32,n=32,k=32", fj.Target.cpu(), progress=False, retime=2, strategy="random", trials=10,
                  db=path, measurer=lambda t, tg: felixjax.testing.ReplayRunner.from_oracle(t, tg, noise=0.3))
    with fj.Database(path, readonly=True) as db:
        row = report_mod.summary_rows(db)[0]
    assert row["retimed_ms"] == pytest.approx(res.best.latency_s * 1e3)
    assert row["gflops"] == pytest.approx(res.best.gflops)
    assert row["run"] == "random:0" and row["latencies"] == "replayed"  # filed under this CPU's key: said


def test_a_task_with_failures_only_and_an_empty_database_say_so(tmp_path, monkeypatch):
    # session 74 (a user's review): a failures-only task drew an empty axis with a legend, and `report --plot` on an
    # empty database wrote no PNG without a word
    from codegen.measure import MeasureResult

    empty = tmp_path / "empty.db"
    fj.Database(str(empty)).close()
    assert "no plot written" in report_mod.report(str(empty), plot=str(tmp_path / "e.png"))
    path = str(tmp_path / "fail.db")
    fj.tune("matmul:m=32,n=32,k=32", strategy="random", trials=4, db=path, progress=False, retime=0,
            measurer=lambda t, tg: felixjax.testing.ReplayRunner(lambda c: MeasureResult("wrong_result")))
    legends = []
    seen = _panels(monkeypatch, legends)
    report_mod.report(path, plot=str(tmp_path / "f.png"))
    (axes,) = seen
    assert [t.get_text() for t in axes[0].texts] == ["no correct kernel measured"]
    assert legends == [["random:0 (replayed) (no correct kernel)"]]  # no line drawn: the legend says why


def test_report_aggregates_in_sql_what_the_records_say(tmp_path):
    # session 77 (a scalability review): report decoded every record twice in Python (120 s and 4.4 GB at a
    # million records); it now aggregates in SQL. Checked against the records, one by one: several runs,
    # two targets, failures of several kinds, re-timings, a network choice and a run without a correct kernel
    import dataclasses
    import math

    import numpy as np

    from codegen.measure import MeasureResult
    from felixjax.database import TuningRecord

    rng = np.random.default_rng(7)
    task, other = fj.ops.matmul(16, 16, 16), fj.ops.matmul(32, 16, 8)
    space = fj.Space(task, "gemm_packed", fj.Target.cpu())
    with fj.Database(str(tmp_path / "s.db")) as db:
        for k in range(120):
            t = (task, other)[k % 2]
            sp = space if t is task else fj.Space(other, "gemm_packed", fj.Target.cpu())
            tg = fj.Target.cpu(cores=1 + k % 3 // 2)
            run = ("random:0", "gradient:1", "retime:random:0", "retime:network:gradient:1", "dead:0")[k % 5]
            status = ("ok", "ok", "compile_error", "wrong_result", "ok")[k % 7 % 5] if run != "dead:0" else "timeout"
            lat = tuple(float(x) for x in rng.uniform(1e-5, 1e-3, 3)) if status == "ok" else ()
            rec = TuningRecord(t, tg.key, run, k, sp.sample(rng), MeasureResult(status, lat, "" if lat else "x"),
                               float(k), tg.to_json())
            db.add(rec)
        with pytest.raises(fj.errors.DatabaseError, match="Error binding parameter.*nothing is wrong with the file"):
            db.add(dataclasses.replace(rec, target_key=tg))  # session 77: a caller's Target was "corrupted database"
        rows = report_mod.summary_rows(db)
        recs = db.records(retimes=True)
    want: dict = {}
    for r in recs:
        if r.run.startswith("retime:"):
            continue
        w = want.setdefault((r.task.name, r.target_key, r.run), {"trials": 0, "ok": 0, "best": math.inf,
                                                                "fail": {}, "seconds": 0.0, "sketch": "-"})
        w["trials"] += 1
        w["seconds"] = max(w["seconds"], r.elapsed_s)
        if r.ok:
            w["ok"] += 1
            if r.latency_s < w["best"]:
                w["best"], w["sketch"] = r.latency_s, r.config.sketch
        else:
            w["fail"][r.status] = w["fail"].get(r.status, 0) + 1
    labels = {r.target_key: report_mod.target_label(r.target_key, r.target) for r in recs}
    assert len(rows) == len(want) and all("target" in row for row in rows)  # two targets: a column
    for row in rows:
        key = next(k for k in want if k[0] == row["task"] and labels[k[1]] == row["target"] and k[2] == row["run"])
        w = want[key]
        again = [r.latency_s for r in recs if r.ok and r.run == "retime:" + row["run"]
                 and (r.task.name, r.target_key) == key[:2]]
        assert (row["trials"], row["ok"], row["seconds"], row["sketch"]) == (w["trials"], w["ok"], w["seconds"],
                                                                             w["sketch"])
        assert row["best_ms"] == pytest.approx(w["best"] * 1e3) if w["ok"] else row["best_ms"] == math.inf
        assert row["failures"] == (", ".join(f"{k}={v}" for k, v in sorted(w["fail"].items())) or "-")
        assert row["retimed_ms"] == (pytest.approx(min(again) * 1e3) if again else None)
    assert {row["run"] for row in rows} == {"random:0", "gradient:1", "dead:0"}


def test_a_report_reads_one_state_of_a_database_being_written(tmp_path):
    # session 77 (a code review): the report's queries each saw the file as it was then, so a tuner starting a
    # task between two of them made the report fail with a KeyError; they now run in one read transaction
    import numpy as np

    from codegen.measure import MeasureResult
    from felixjax.database import TuningRecord

    tg, rng = fj.Target.cpu(), np.random.default_rng(0)
    a, b = fj.ops.matmul(16, 16, 16), fj.ops.matmul(32, 16, 8)

    def rec(t):
        return TuningRecord(t, tg.key, "random:0", 0, fj.Space(t, "gemm_packed", tg).sample(rng),
                            MeasureResult("ok", (1e-4,)), 0.0, tg.to_json())

    path = str(tmp_path / "busy.db")
    with fj.Database(path) as db, fj.Database(path) as writer:
        db.add(rec(a))
        conn, selects = db._conn, []

        class Between:  # the report's connection; another tuner adds a new task after its first read
            def __getattr__(self, name):
                return getattr(conn, name)

            def execute(self, sql, *args):
                out = conn.execute(sql, *args)
                if sql.lstrip().startswith("SELECT"):
                    selects.append(sql)
                    if len(selects) == 1:
                        writer.add(rec(b))
                return out

        db._conn = Between()
        try:
            rows = report_mod.summary_rows(db)
        finally:
            db._conn = conn
        assert len(selects) >= 2 and [r["task"] for r in rows] == [a.name]  # the state before b, whole
        assert [r["task"] for r in report_mod.summary_rows(db)] == [a.name, b.name]


def test_narrow_ranges_whole_trials_and_long_legends_are_readable(tmp_path, monkeypatch):
    """Session 82, a review (looked at the PNGs): a narrow latency range printed 1.749, 1.749, 1.748, 1.748 (".4g"),
    the trial axis 1.25, 1.5, ..., and two long legend entries in one panel's width were cut off at both sides."""
    import matplotlib.pyplot as plt

    from codegen.measure import MeasureResult
    from codegen.space import Space, default_sketch
    from felixjax.database import TuningRecord

    task, target = fj.ops.matmul(32, 8, 8), fj.Target.cpu()
    space = Space(task, default_sketch(task, target), target)
    configs = list(dict.fromkeys(space.sample(np.random.default_rng(s)) for s in range(40)))[:5]
    path = str(tmp_path / "narrow.db")
    with fj.Database(path) as db:
        for run in ("random:0-with-a-long-name-of-its-own", "random:1-with-a-long-name-of-its-own"):
            for i, (cfg, lat) in enumerate(zip(configs, (1.7490e-6, 1.7476e-6, 1.7476e-6, 1.7476e-6, 1.7476e-6))):
                db.add(TuningRecord(task, target.key, run, i, cfg, MeasureResult("ok", (lat,)), float(i),
                                    target.to_json()))
    seen = []
    real_close = plt.close

    def close(fig=None):
        if fig is not None and hasattr(fig, "axes"):
            renderer = fig.canvas.get_renderer()
            seen.append((fig.axes[0], [leg.get_window_extent(renderer) for leg in fig.legends], fig.bbox))
        return real_close(fig)

    monkeypatch.setattr(plt, "close", close)
    with fj.Database(path, readonly=True) as db:
        report_mod.plot_curves(db, str(tmp_path / "narrow.png"))
    ax, legends, box = seen[0]
    lo, hi = ax.get_ylim()
    labels = [t.get_text() for t in ax.get_yticklabels(which="both")
              if t.get_text() and lo <= t.get_position()[1] <= hi]
    assert len(labels) >= 2 and len(set(labels)) == len(labels), labels
    assert all(float(x).is_integer() for x in ax.get_xticks()), ax.get_xticks()
    assert legends and all(0 <= e.x0 and e.x1 <= box.x1 for e in legends), (legends, box)


def test_simulated_latencies_are_not_called_measured_and_an_empty_plot_path_is_refused(tmp_path):
    """Session 82, a review: beside a replayed run, a cuda-sim run's latencies read 'measured'; ``--plot ''``
    (an unset variable) wrote no plot and said nothing."""
    from codegen.measure import MeasureResult
    from codegen.space import Config
    from felixjax.database import TuningRecord

    path = str(tmp_path / "mixed.db")
    _tune(path, SPECS[:1])  # replayed
    gpu = fj.Target.cuda_sim("a100")
    task = fj.ops.matmul(8, 8, 8)
    cfg = Config("cuda_tiled", ((1, 1, 8, 1), (1, 1, 8, 1), (8, 1)), 0, 1, 1)
    with fj.Database(path) as db:
        db.add(TuningRecord(task, gpu.key, "random:0", 0, cfg, MeasureResult("ok", (4e-6,)), 0.1, gpu.to_json()))
        rows = report_mod.summary_rows(db)
    assert sorted(r["latencies"] for r in rows) == ["replayed", "simulated"]
    alone = str(tmp_path / "gpu.db")  # (a verification: without a replayed run there was no column to say it)
    with fj.Database(alone) as db:
        db.add(TuningRecord(task, gpu.key, "random:0", 0, cfg, MeasureResult("ok", (4e-6,)), 0.1, gpu.to_json()))
        assert [r["latencies"] for r in report_mod.summary_rows(db)] == ["simulated"]
    for empty in ("", "  "):
        with pytest.raises(ValueError, match="the plot path is empty"):
            report_mod.report(path, plot=empty)
