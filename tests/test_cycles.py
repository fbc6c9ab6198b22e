"""felixjax.cycles: user-mode performance counters of the process's threads, and time_interleaved's
``event`` option built on them (counts, not timings: instructions of a fixed workload barely move)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from felixjax import cycles
from felixjax.baselines import time_interleaved

needs_counters = pytest.mark.skipif(not cycles.available("instructions"),
                                    reason="no user-mode perf counters here (perf_event_paranoid > 2 or no PMU)")


def _work(n: int) -> int:
    return sum(i * i for i in range(n))


def test_unknown_event_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown event"):
        cycles.ThreadCounters("cache-misses")


def _fake_counters(monkeypatch, counts: dict[int, int] | None):
    """``perf_event_open`` replaced: each thread's counter a pipe holding its count (``None``: EACCES)."""
    import os
    import struct

    def fake_open(event, tid):
        if counts is None:
            raise PermissionError(13, "perf_event_open: Permission denied")
        r, w = os.pipe()
        os.write(w, struct.pack("q", counts.get(tid, 7)))
        os.close(w)
        return r

    monkeypatch.setattr(cycles, "_open", fake_open)
    monkeypatch.setattr(cycles.fcntl, "ioctl", lambda *a: 0)


def test_counts_are_summed_over_the_threads_and_available_says_so(monkeypatch):
    # the counters' own logic, on any machine (the tests below need a PMU and skip without one)
    tids = cycles._threads()
    _fake_counters(monkeypatch, {t: 1000 * (i + 1) for i, t in enumerate(tids)})
    with cycles.ThreadCounters("instructions") as c:
        pass
    assert c.read() == 1000 * len(tids) * (len(tids) + 1) // 2 and c._fds == []
    assert cycles.available("instructions")
    _fake_counters(monkeypatch, {t: 0 for t in tids})
    assert not cycles.available("instructions")  # a PMU that counts nothing is no PMU
    _fake_counters(monkeypatch, None)
    assert not cycles.available("instructions")
    with pytest.raises(PermissionError):
        cycles.ThreadCounters("instructions").__enter__()


@needs_counters
def test_instructions_scale_with_the_work():
    counts = []
    for n in (100_000, 200_000):
        with cycles.ThreadCounters("instructions") as c:
            _work(n)
        counts.append(c.read())
    assert counts[0] > 100_000
    assert 1.7 < counts[1] / counts[0] < 2.3


@needs_counters
def test_threads_running_during_the_block_are_counted():
    go, done = threading.Event(), threading.Event()

    def worker():
        go.wait()
        _work(300_000)
        done.set()

    t = threading.Thread(target=worker)
    t.start()  # exists before the block: counted
    with cycles.ThreadCounters("instructions") as c:
        go.set()
        done.wait()
    t.join()
    with cycles.ThreadCounters("instructions") as alone:
        _work(300_000)
    assert c.read() > 0.8 * alone.read()


@needs_counters
def test_time_interleaved_counts_per_call():
    out = time_interleaved({"one": lambda: _work(20_000), "two": lambda: _work(40_000)}, rounds=3,
                           min_time_s=1e-3, pause_s=0.0, settle=0, event="instructions")
    one, two = min(out["one"]), min(out["two"])
    assert one > 20_000 and 1.7 < two / one < 2.3


@pytest.mark.skipif(not cycles.available("l1d-misses"), reason="no L1D cache events here")
def test_streaming_32_mb_misses_the_l1_on_a_good_share_of_its_lines():
    big = np.ones(8 << 20, np.float32)  # 32 MB: 512 Ki cache lines, far beyond L1 / L2
    with cycles.ThreadCounters("l1d-misses") as misses:
        big.sum()
    with cycles.ThreadCounters("l1d-loads") as loads:
        big.sum()
    assert (8 << 20) // 16 // 5 < misses.read() < loads.read()
