"""Integration: the tuning loop, the database, resumption after SIGKILL, planted kernels, the CLI."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import felixjax as fj
from codegen.measure import TimingProtocol
from codegen.render_c import render
from felixjax.cli import main as cli

pytestmark = pytest.mark.cc
QUICK = TimingProtocol.quick()


def test_short_random_tuning_run_checks_every_kernel(tmp_path, runner):
    t = fj.ops.conv2d(1, 8, 9, 9, out_channels=16, kernel=3, padding=1, bias=True, act="relu")
    res = fj.tune(t, strategy="random", trials=6, db=str(tmp_path / "r.db"), seed=1, runner=runner, threads=1,
                  progress=False)
    assert len(res.history) == 6 and [r.trial for r in res.history] == list(range(6))
    assert all(r.status == "ok" for r in res.history), res.status_counts()
    assert len({r.config for r in res.history}) == 6
    assert res.best_while_tuning.latency_s == min(r.latency_s for r in res.history)
    # res.best is the winner of the end-of-run re-timing of the top 3 (interleaved), one of the run's configs
    best = res.best
    assert best.run == "retime:random:1" and best.config in {r.config for r in res.history} and best.gflops > 0
    assert len(res.retimed) == 3
    # the best kernel as a callable, on fresh inputs
    arrays = t.random_inputs(seed=7)
    np.testing.assert_allclose(res.kernel(threads=1)(*arrays), t.reference(*arrays), rtol=1e-4, atol=1e-4)
    assert "fj_kernel" in res.source
    db = fj.Database(tmp_path / "r.db")
    assert db.best(t, fj.Target.cpu().at_threads(1), run="random:1").latency_s == res.best_while_tuning.latency_s
    # session 82, a review: tuned at 1 thread, res.kernel() ran on every core and res.target keyed no record
    assert res.target.cores == 1 and res.kernel()._threads == 1 and res.target.key == res.best.target_key
    assert db.best(t, res.target, run="random:1").latency_s == res.best_while_tuning.latency_s
    assert len(db.records(task=t)) == 6 and len(db.records(task=t, retimes=True)) == 6 + 3


def test_database_roundtrip_jsonl(tmp_path, runner):
    t = fj.ops.dense(2, 16, 8, bias=True)
    fj.tune(t, strategy="random", trials=3, db=str(tmp_path / "a.db"), runner=runner, threads=1, progress=False)
    a = fj.Database(tmp_path / "a.db")
    assert a.export_jsonl(tmp_path / "a.jsonl") == 3 + 3  # the run and its 3 re-timing rows
    b = fj.Database(tmp_path / "b.db")
    assert b.import_jsonl(tmp_path / "a.jsonl") == 6
    ra, rb = a.records(retimes=True), b.records(retimes=True)
    assert [(r.config, r.result.latencies, r.status) for r in ra] == [(r.config, r.result.latencies, r.status)
                                                                     for r in rb]
    for line in open(tmp_path / "a.jsonl"):
        json.loads(line)  # plain JSON, no pickle
    # session 75 (a user's review): a second import doubled the rows, and a resumed run counted the copies
    assert b.import_jsonl(tmp_path / "a.jsonl") == 0 and a.import_jsonl(tmp_path / "a.jsonl") == 0
    assert len(b.records(retimes=True)) == len(a.records(retimes=True)) == 6


def test_planted_kernels_are_recorded_and_tuning_continues(tmp_path, runner):
    """A segfault, a hang, an out-of-bounds write, an accumulating kernel and a compile error,
    planted among real kernels: each gets its status and the run completes."""
    t = fj.ops.matmul(16, 16, 16)
    plant = {
        1: ("runtime_error", "void fj_kernel(float* const* b) { volatile float* p = 0; *p = 1.0f; }"),
        2: ("timeout", "void fj_kernel(float* const* b) { volatile int x = 1; while (x) {} }"),
        3: ("runtime_error", "void fj_kernel(float* const* b) { for (int i = 0; i < 16*16 + 64; ++i) b[2][i] = 0; }"),
        4: ("wrong_result", None),  # accumulates into its output
        5: ("compile_error", "void fj_kernel(float* const* b) { this is not C; }"),
    }
    calls = {"n": 0}

    def renderer(plan):
        i = calls["n"]
        calls["n"] += 1
        if i not in plant:
            return render(plan)
        status, body = plant[i]
        if body is None:  # correct first call, wrong after repeated calls
            body = ("void fj_kernel(float* const* b) { for (int i = 0; i < 16; ++i) for (int j = 0; j < 16; ++j) {"
                    " float s = 0; for (int k = 0; k < 16; ++k) s += b[0][i*16+k] * b[1][k*16+j];"
                    " b[2][i*16+j] = (b[2][i*16+j] == b[2][i*16+j]) ? b[2][i*16+j] + s : s; } }")
        from codegen.measure import TIMING_HARNESS_C

        return body + TIMING_HARNESS_C

    from codegen.measure import LocalRunner

    with LocalRunner(protocol=QUICK, timeout_s=6.0) as r:  # the real kernels' first calls too, on a loaded machine
        res = fj.tune(t, strategy="random", trials=8, db=str(tmp_path / "p.db"), runner=r, threads=1,
                      progress=False, renderer=renderer, batch=8)
    statuses = [rec.status for rec in res.history]
    assert len(statuses) == 8
    for i, (want, _) in plant.items():
        assert statuses[i] == want, (i, statuses[i], res.history[i].result.error)
    assert statuses[0] == "ok" and statuses[6] == "ok" and statuses[7] == "ok"
    assert "SIGSEGV" in res.history[1].result.error
    assert "error" in res.history[5].result.error
    # the best is re-timed at the end of the run (its record's trial is its rank among the re-timed
    # configs, not its trial while tuning): it must be one of the real kernels' configs
    assert res.best.ok and res.best.config in {res.history[i].config for i in (0, 6, 7)}
    assert all(r.config not in {res.history[i].config for i in plant} for r in res.retimed if r.ok)


TUNE_SCRIPT = textwrap.dedent("""
    import sys
    import felixjax as fj
    from codegen.measure import TimingProtocol
    t = fj.ops.matmul(24, 32, 16)
    fj.tune(t, strategy="random", trials=int(sys.argv[2]), db=sys.argv[1], seed=3, threads=1, batch=2,
            protocol=TimingProtocol.quick(), progress=False)
""")


def test_sigkill_then_resume_loses_nothing_and_remeasures_nothing(tmp_path):
    db_path = str(tmp_path / "k.db")
    script = tmp_path / "tune.py"
    script.write_text(TUNE_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd()] + sys.path))
    proc = subprocess.Popen([sys.executable, str(script), db_path, "40"], env=env, start_new_session=True)
    t = fj.ops.matmul(24, 32, 16)
    deadline = time.time() + 120
    n = 0
    while time.time() < deadline:
        time.sleep(0.3)
        if os.path.exists(db_path):
            n = fj.Database(db_path).count(t, fj.Target.cpu().at_threads(1))
            if n >= 5:
                break
    os.killpg(proc.pid, signal.SIGKILL)  # the tuner and its measuring child, mid-run
    proc.wait()
    before = fj.Database(db_path).records(task=t)
    assert 5 <= len(before) < 40, len(before)
    # resume: same command; records committed before the kill are kept and never measured again
    budget = 12 if len(before) < 12 else len(before) + 4
    subprocess.run([sys.executable, str(script), db_path, str(budget)], env=env, check=True, timeout=300)
    after = fj.Database(db_path).records(task=t)
    assert [r.config for r in after[: len(before)]] == [r.config for r in before]
    assert len({r.config for r in after}) == len(after), "a config was measured twice"
    assert [r.trial for r in after] == list(range(len(after)))
    assert len(after) == budget


def test_cli_tune_and_report(tmp_path, capsys):
    db = str(tmp_path / "c.db")
    assert cli(["tune", "--op", "dense:n=1,in=32,out=16,bias=1,act=relu", "--trials", "2", "--strategy", "random",
                "--db", db, "--threads", "1", "--no-compare"]) == 0
    out = capsys.readouterr().out
    assert "dense_1x32_16_bias_relu" in out and "GFLOP/s" in out
    assert cli(["report", db, "--plot", str(tmp_path / "c.png")]) == 0
    out = capsys.readouterr().out
    assert "dense_1x32_16_bias_relu" in out and os.path.getsize(tmp_path / "c.png") > 1000


def test_cli_tune_says_when_timings_were_disturbed(tmp_path, capsys, monkeypatch):
    # session 74 (a user's review): on a busy machine most timings were `noisy` and the run ended without a word
    from codegen.measure import MeasureResult
    from felixjax.testing import ReplayRunner, SyntheticOracle

    real = fj.tune

    def busy(task, *a, **kw):  # every other timing disturbed, as on a machine shared with another job
        oracle = SyntheticOracle(fj.ops.parse_spec(task) if isinstance(task, str) else task)
        table = {"n": 0}

        def timing(cfg):
            table["n"] += 1
            t = oracle(cfg)
            return MeasureResult("noisy", (2 * t, 3 * t)) if table["n"] % 2 else t
        return real(task, *a, **{**kw, "measurer": lambda t, tg: ReplayRunner(timing)})

    monkeypatch.setattr(fj, "tune", busy)
    assert cli(["tune", "--op", "matmul:m=8,n=8,k=8", "--trials", "4", "--strategy", "random", "--db",
                str(tmp_path / "n.db"), "--threads", "1", "--no-compare"]) == 0
    out = capsys.readouterr().out
    assert "2 of 4 timings were disturbed (`noisy`" in out and "tune on a quiet machine" in out


@pytest.mark.parametrize("argv, msg", [
    (["tune", "--op", "conv2d:n=1,c=8", "--strategy", "random"], "needs h="),
    (["tune", "--op", "nonsense", "--strategy", "random"], "unknown op kind"),
    (["tune"], "nothing to tune"),
    (["tune", "--op", "matmul:m=4,n=4,k=4", "--strategy", "annealing"], "unknown strategy"),
    (["report", "/nonexistent/x.db"], "no such database"),
])
def test_cli_bad_input_is_one_line_exit_2(argv, msg, capsys):
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_a_run_without_a_correct_kernel_says_why_rather_than_return_a_silent_none():
    # session 78 (a packaging review): on a loaded machine every timing of a short run was `noisy` and
    # fj.tune(..., progress=False).best was None without a word; the README's next line failed on None
    from codegen.measure import MeasureResult
    from felixjax.testing import ReplayRunner

    busy = ReplayRunner(lambda cfg: MeasureResult("noisy", (1e-3,), "disturbed measurement"))
    with pytest.warns(RuntimeWarning, match=r"no correct kernel timed cleanly among 4 trials .*4 noisy: another "
                                            r"process used the CPU"):
        res = fj.tune("matmul:m=16,n=16,k=16", strategy="random", trials=4, progress=False, retime=0,
                      measurer=lambda t, tg: busy)
    assert res.best is None and len(res.history) == 4
