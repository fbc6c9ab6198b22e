"""Malformed-ONNX fuzzing (issue 12): >= 500 seeded mutated models in one process, each under a watchdog;
every one loads or raises a clear felixjax error -- no other exception, no hang. The corpus and the
runner live in benchmarks/fuzz_onnx.py (which runs longer campaigns: ``python benchmarks/fuzz_onnx.py
--cases 20000``)."""
from __future__ import annotations

import time
from collections import Counter

import pytest

pytest.importorskip("onnx")

from benchmarks import fuzz_onnx  # noqa: E402

CASES = 1000
BUDGET_S = 10.0  # per case: what counts as a hang (cases take milliseconds; a busy machine must not make one)
TOTAL_S = 600.0  # a hang guard for the whole run (~20 s here)


def test_fuzz_cases_are_deterministic_and_varied():
    a = [fuzz_onnx.make_case(i) for i in range(40)]
    b = [fuzz_onnx.make_case(i) for i in range(40)]
    assert [c.data for c in a] == [c.data for c in b]
    kinds = Counter(c.kind for c in fuzz_onnx.cases(CASES))
    assert kinds["bytes"] > 150 and kinds["semantic"] > 250
    mutations = {c.mutation for c in fuzz_onnx.cases(CASES)}
    assert len(mutations) >= 25  # every byte and semantic mutation is drawn
    for name in fuzz_onnx.SEEDS:  # every seed model is valid and loads
        out = fuzz_onnx.run_case(fuzz_onnx.Case(-1, name, "seed", "none", "", fuzz_onnx._seed_bytes(name)), 10.0)
        assert out.status == "loaded", (name, out.error_type, out.message, out.trace)


def test_malformed_onnx_gives_clear_errors_never_tracebacks_or_hangs():
    t0 = time.perf_counter()
    outs = fuzz_onnx.fuzz(CASES, base_seed=0, budget_s=BUDGET_S)
    elapsed = time.perf_counter() - t0
    bad = [o for o in outs if o.status in ("traceback", "hang")]
    report = "\n".join(f"#{o.case.index} {o.status} at {o.stage} ({o.case.mutation}: {o.case.description}): "
                       f"{o.error_type}: {o.message}\n{o.trace}" for o in bad[:10])
    assert not bad, f"{len(bad)} of {len(outs)} cases failed:\n{report}"
    counts = Counter(o.status for o in outs)
    assert len(outs) == CASES >= 500
    assert counts["refused"] > 0 and counts["loaded"] > 0
    assert elapsed < TOTAL_S, f"{CASES} cases took {elapsed:.1f} s"


def test_watchdog_turns_a_hang_into_a_hang_outcome(monkeypatch):
    import felixjax

    def slow(*args, **kwargs):
        while True:
            time.sleep(0.01)

    monkeypatch.setattr(felixjax, "load_onnx", slow)
    t0 = time.perf_counter()
    out = fuzz_onnx.run_case(fuzz_onnx.make_case(0), budget_s=0.2)
    assert out.status == "hang" and time.perf_counter() - t0 < 30.0  # the watchdog ended it (0.2 s budget)


def test_internal_errors_behind_a_clear_type_still_count_as_tracebacks(monkeypatch):
    import felixjax
    from felixjax.errors import ModelFormatError

    def wrapped(*args, **kwargs):
        try:
            {}["missing"]
        except KeyError as e:
            raise ModelFormatError("cannot import this model") from e

    monkeypatch.setattr(felixjax, "load_onnx", wrapped)
    assert fuzz_onnx.run_case(fuzz_onnx.make_case(0)).status == "traceback"
