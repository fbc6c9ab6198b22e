"""Ansor's gradient task scheduler (pure logic: no hardware, testable with made-up latencies) and the
similarity tag that groups tasks by op kind and FLOP bucket."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from codegen.ops import Task



NO_LATENCY = 1e10  # Ansor's cost of a task without a correct kernel yet


def similarity_tag(task: Task, log_base: float = 1.618) -> str:
    """Ansor's similarity tag: the op kind and a logarithmic FLOP bucket.

    Example:
        >>> from codegen.ops import matmul
        >>> similarity_tag(matmul(64, 64, 64)) == similarity_tag(matmul(64, 64, 60))
        True
    """
    kind = task.op
    if task.op == "conv2d":
        p = task.p
        kind = "dwconv2d" if p["groups"] == p["c"] and p["groups"] > 1 else "conv2d"
    return f"{kind}_{int(math.log(task.flops + 1, log_base))}"


class TaskScheduler:
    """Ansor's gradient task scheduler over tasks with weights (occurrence counts).

    ``next_task()`` names the task of the next round (through the warm-up, one round per task, the tasks
    of largest ``weight x FLOPs`` first, so that a budget too small for all leaves the cheap ones out: Ansor
    goes in model order; then the largest expected reduction of ``sum_i w_i g_i``);
    ``record(i, best_latency_s, new_trials)`` reports a round. The backward term of a task's gradient uses
    only rounds with a correct kernel (Ansor's counts the 1e10 "no kernel yet" placeholder, which made a
    task that found its first kernel look like the most promising of all for three rounds).
    A task drops out when a round adds no trial (its space is exhausted) or after ``max_failed_rounds``
    rounds and ``min_failed_trials`` trials without any correct kernel (Ansor would give such a task,
    "infinitely slow", every round); a
    correct kernel timed only on a busy machine (a ``noisy`` record) reports its timing as an upper bound
    (:func:`felixjax.network_tune.round_best`), so its task stays in, priced at that bound or less
    (``network_tune._priced``: at most what the slowest measured task's throughput gives its FLOPs); such a
    price is reported ``provisional=True`` and the task's next report replaces it.

    Example:
        >>> from codegen.ops import matmul
        >>> s = TaskScheduler([matmul(64, 64, 64), matmul(256, 256, 256)], [1, 1])
        >>> s.next_task(), s.record(1, 1e-3, 16)  # the warm-up: the most FLOPs first
        (1, None)
        >>> s.next_task(); s.record(0, 1e-5, 16)
        0
        >>> s.next_task()  # the big, slow task promises the larger reduction
        1
    """

    def __init__(self, tasks: Sequence[Task], weights: Sequence[float], *, alpha: float = 0.2, beta: float = 2.0,
                 window: int = 3, seed: int = 0, max_failed_rounds: int = 3, min_failed_trials: int = 8):
        if len(tasks) != len(weights) or not tasks:
            raise ValueError("give one weight per task, and at least one task")
        self.tasks, self.weights = list(tasks), [float(w) for w in weights]
        self.alpha, self.beta, self.window = float(alpha), float(beta), int(window)
        self.max_failed_rounds, self.min_failed_trials = int(max_failed_rounds), int(min_failed_trials)
        self.rng = np.random.default_rng(seed)
        n = len(tasks)
        self.best = [NO_LATENCY] * n
        self.rounds = [0] * n
        self.trials = [0] * n
        self.provisional = [False] * n
        self.history: list[list[float]] = [[] for _ in range(n)]
        self.dead: set[int] = set()
        self.flops = [float(t.flops) for t in tasks]
        self.tags: list[str | None] = [similarity_tag(t) for t in tasks]
        self.groups: dict[str, list[int]] = {}
        for i, tag in enumerate(self.tags):
            self.groups.setdefault(tag, []).append(i)

    def objective(self, costs: Sequence[float] | None = None) -> float:
        """Estimated network latency ``sum_i w_i g_i``."""
        return float(sum(w * c for w, c in zip(self.weights, costs if costs is not None else self.best)))

    def gradients(self) -> list[float]:
        """The expected change of the objective per task (more negative = more promising)."""
        out = []
        for i in range(len(self.tasks)):
            if i in self.dead or self.rounds[i] == 0:
                out.append(0.0)
                continue
            g, t = self.best[i], self.rounds[i]
            chain = self.weights[i]  # d(sum_j w_j g_j) / d g_i
            h = self.history[i]
            backward = (h[t - 1] - h[t - 1 - self.window]) / self.window \
                if t - 1 - self.window >= 0 and h[t - 1 - self.window] < NO_LATENCY else 0.0
            g_next_1 = g - g / t
            g_next_2 = self.beta * 1e30
            group = self.groups.get(self.tags[i]) if self.tags[i] is not None else None
            if group is not None and len(group) > 1:
                best_flops = max(self.flops[j] / self.best[j] for j in group)
                g_next_2 = self.beta * self.flops[i] / best_flops
            forward = min(g_next_1, g_next_2) - g
            out.append(chain * (self.alpha * backward + (1 - self.alpha) * forward))
        return out

    def next_task(self) -> int | None:
        """The task of the next round, or None when every task is dead."""
        alive = [i for i in range(len(self.tasks)) if i not in self.dead]
        if not alive:
            return None
        warm = [i for i in alive if self.rounds[i] == 0]
        if warm:  # the largest weight x FLOPs first (stable: model order among equals)
            return max(warm, key=lambda i: self.weights[i] * self.flops[i])
        grads = self.gradients()
        vals = [grads[i] for i in alive]
        if max(vals) == min(vals):
            return alive[int(self.rng.integers(len(alive)))]
        return alive[int(np.argmin(vals))]

    def record(self, i: int, best_latency_s: float | None, new_trials: int, *, provisional: bool = False) -> None:
        """Report one round of task ``i``: its best latency so far and how many trials the round added.
        ``provisional``: a price, not a timing (a bound from disturbed timings): the next report replaces it."""
        if best_latency_s is not None and math.isfinite(best_latency_s):
            was = self.provisional[i]
            self.best[i] = float(best_latency_s) if was else min(self.best[i], float(best_latency_s))
            self.provisional[i] = provisional
        self.rounds[i] += 1
        self.trials[i] += max(0, int(new_trials))
        self.history[i].append(self.best[i])
        failed = self.rounds[i] >= self.max_failed_rounds and self.trials[i] >= self.min_failed_trials
        if new_trials <= 0 or (self.best[i] >= NO_LATENCY and failed):
            self.dead.add(i)  # exhausted, or no correct kernel at all: spend the budget elsewhere
        self._adjust_group(i)

    def _adjust_group(self, i: int) -> None:
        tag = self.tags[i]
        group = self.groups.get(tag) if tag is not None else None
        if group is None or len(group) <= 1:
            return
        best_flops = max(self.flops[j] / self.best[j] for j in group)
        mine = self.flops[i] / self.best[i]
        # many more rounds than its peers and still far slower: it is not similar to them after all
        if mine < best_flops / self.beta and self.rounds[i] > 5 + max(self.rounds[j] for j in group if j != i):
            self.tags[i] = None
            group.remove(i)
