"""A search's own work in threads (session 66): the helper runs its jobs side by side and keeps their
order, and the gradient search proposes the same configs whatever the number of threads."""
import threading

import pytest

import felixjax as fj
from felixjax.session import TuningSession
from felixjax.strategies.gradient import GradientSearch
from felixjax.testing import ReplayRunner
from felixjax.threads import in_threads, usable_cores


def test_in_threads_runs_jobs_side_by_side_and_keeps_their_order():
    meet = threading.Barrier(2, timeout=20)  # broken unless both jobs are running at once

    def job(i):
        meet.wait()
        return i, threading.get_ident()

    out = in_threads([lambda i=i: job(i) for i in range(2)], workers=2)
    assert [i for i, _ in out] == [0, 1] and out[0][1] != out[1][1]
    here = threading.get_ident()
    assert in_threads([lambda i=i: (i, threading.get_ident()) for i in range(3)], workers=1) == [(i, here) for i in range(3)]
    assert in_threads([], workers=4) == [] and usable_cores() >= 1


def _history(workers: int) -> list:
    """Two rounds of the gradient search on a conv with four sketches or more (replay oracle): its configs in order."""
    task = fj.ops.conv2d(1, 16, 10, 10, out_channels=16, kernel=3, padding=1)
    g = GradientSearch(batch_size=16, starts=16, steps=8, workers=workers)
    with TuningSession(fj.Target.cpu(), measurer=lambda t, tg: ReplayRunner.from_oracle(t), progress=False,
                       defaults=False) as s:
        run = s.add(task, g, seed=3, trials=32)
        while s.step(run):
            pass
        assert len(g._ends) == len(run.ctx.spaces) >= 4 and g.last_round["harvested"] > 0  # (5 with a padded one)
        return [r.config for r in run.ctx.history]


def test_gradient_picks_do_not_depend_on_the_threads():
    serial = _history(1)
    assert len(serial) == 32 and len(set(serial)) == 32
    assert _history(2) == serial
    with pytest.raises(ValueError, match="workers"):
        GradientSearch(workers=0)

