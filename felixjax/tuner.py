"""``fj.tune``: tune one operator (kept as the historical home of :func:`tune`, :class:`TuneResult` and
:class:`Measurer`; the loop itself is :class:`felixjax.session.TuningSession`, the stages are in
:func:`felixjax.pipeline.tune_task`).

Budgets are in trials and/or seconds, whichever ends first; a trial is a candidate sent to the
builder (failures count). Every result is committed to the database as it arrives, so a killed run
resumes where it stopped: records of the same ``run`` are reloaded, counted against the budget,
shown to the strategy, and never measured again.

Example:
    >>> import felixjax as fj
    >>> res = fj.tune(fj.ops.matmul(32, 32, 32), strategy="random", trials=4, progress=False)
    >>> len(res.history), res.best.ok
    (4, True)
"""
from .measurer import Measurer
from .pipeline import tune_task as tune
from .results import TuneResult

__all__ = ["Measurer", "TuneResult", "tune"]
