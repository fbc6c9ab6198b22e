"""The bridge between records and cost models: configs -> features -> scores, records -> training.

Strategies never touch feature arrays or model parameters; they ask a :class:`Scorer` to rank
configs (higher score = predicted faster) and tell it about new measurements. ``costmodels`` works
on arrays only (DESIGN.md), so turning records into arrays happens here, in ``felixjax``.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from codegen.space import Config


@runtime_checkable
class Scorer(Protocol):
    """Ranks configs of one task. ``score`` returns predicted -log(latency) (higher = faster)."""

    def score(self, configs: list[Config]) -> np.ndarray: ...

    def update(self, records: list) -> None: ...


class RandomScorer:
    """A scorer with no knowledge: i.i.d. scores from a seeded RNG (a baseline for tests)."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def score(self, configs: list[Config]) -> np.ndarray:
        return self.rng.normal(size=len(configs))

    def update(self, records: list) -> None:
        pass
