"""Ablation of issue 15's levers on the replay oracle (no timing): which lever buys the gradient
search fewer measurements to 95% of the best, next to the genetic search given the same lever.

Arms (each a strategy object with its own name, all through ``fj.compare`` with the same replay,
budget, seeds and opening — no default schedules measured first, so search logic alone counts):

* ``gradient`` — the defaults until session 31 (64 per round, no spread; every gradient arm is pinned to them
  unless it names its own: the strategy's defaults since session 32 are ``gradient_pre_b32_spread4``'s);
* ``gradient_b16`` — 16 candidates per round (more rounds to learn from);
* ``gradient_trust`` — the trust region around the best measured points (weight 1, radius 2);
* ``gradient_b16_trust`` — both (the base the next arms add one lever to);
* ``..._ucb`` / ``..._thompson`` — ensemble acquisition (4 small MLPs fitted on the run's measurements);
* ``..._local`` — measured-neighbour moves (a quarter of each batch: the model's best ±1 neighbours
  of the 4 best measured configs, as Dynamic Gradient Descent);
* ``gradient_b32_trust`` — 32 per round;
* ``gradient_gbdt`` / ``genetic_gbdt`` — candidates ranked by the tree ranker (``ranker="gbdt"``,
  :mod:`felixjax.ranker`) also trained on ``--ranker-data`` (the calibration suite's measurements);
* ``gradient_pre`` / ``genetic_pre`` — both searches' cost model started from the MLP pretrained on the
  packaged dataset (``cost_model="packaged"``: CIFAR-size layers, disjoint from ``ops`` and ``fresh``; the
  strategies' default since session 24, ``"auto"``); every other arm starts from the roofline prior
  (``cost_model=None``), as all arms did before; ``gradient_pre_trust``: with the trust region too;
  ``gradient_pre_local``: half of each batch from measured-neighbour moves, ranked by the pretrained model;
  ``gradient_pre_lr05``: a tenth of the learning rate (0.05: the descents barely leave their starts, a probe
  of whether descending on the pretrained model hurts); ``gradient_pre_lcb``: pessimistic acquisition
  (score − std of the run's ensemble, ``ucb_beta=-1``: prefer candidates the members agree on);
  ``gradient_pre_pess1`` / ``_pess3``: descent and ranking on score − 1 (3) x the disagreement of the
  ensemble pretrained on the packaged dataset (``pessimism``: stay where the pretraining data reach);
  ``genetic_pre_pess1``: the genetic search ranking by the same pessimistic score (equal equipment);
  ``gradient_pre_hedge`` / ``genetic_pre_hedge``: half of the starts and picks pessimistic (beta 1), half plain;
  ``gradient_pre_evo``: the descents' points ranked in one pool with the best mutants a genetic population of
  2048 (Ansor's) breeds from the measured configs under the same model (``evolve=2048``: the pool holds what
  ``genetic_pre`` picks from, plus the descents'); ``gradient_pre_evo_pess1``: that pool, pessimistic (beta 1);
  ``gradient_pre_res``: the model corrected by a Gaussian process over the run's own measurements
  (``residual=True``, :mod:`felixjax.strategies.residual`: descent on the calibrated score plus the GP's
  mean, ranking by both); ``gradient_pre_res_ucb``: ranking by the GP's mean + 1 std; ``gradient_pre_b32`` /
  ``gradient_pre_res_b32``: 32 per round, without and with the GP (more rounds for it to learn from);
  ``gradient_pre_resdesc_b32``: the GP steering the descent only, the model alone ranking (32 per round);
  ``genetic_pre_b32``: the genetic search at 32 per round (the equal-batch partner of ``gradient_pre_b32``);
  ``gradient_pre_b32_spread`` / ``_spread4``: 32 per round, the picks kept more than one (two) moves apart
  (``spread=2`` / ``4``: one over-rated region does not take the whole batch); ``genetic_pre_b32_spread4``: the
  genetic search's picks kept apart the same way (equal equipment); ``gradient_pre_b32_spread4_from1``: spread 4
  from the second round on, the first round's picks the top scores (``spread_from=1``);
  ``gradient_pre_b32_spread4_flat``: the ranking by the score averaged half-and-half with its ±1
  neighbourhood's mean (``flat=0.5``; the gradient search's defaults since session 35; every other arm has
  ``flat=0``, as before); ``gradient_host_NAME`` / ``genetic_host_b32_NAME``: ``gradient_pre_b32_spread4_flat`` /
  ``genetic_pre_b32`` started from the checkpoint NAME of ``--host-models NAME=PATH,...``, e.g. a model
  pretrained on measurements of this host's CPU; ``gradient_pre_judge`` / ``_judge1``: the default gradient search
  (``gradient_pre_b32_spread4_flat``) ranking its candidates by half its model's score, half the judge's (all the
  judge's): a second MLP pretrained on the second machine's dataset, fine-tuned online too, that the descent never
  optimized against (``judge="judge"``, :class:`felixjax.context.Judge`); ``genetic_pre_b32_judge``: the genetic
  search's best ``8n`` re-ranked the same way (equal equipment); ``gradient_pre_climb4``: the default gradient search
  with 4 more rounds of greedy ascent on the model over the pool's best points' ±1 neighbourhoods (``climb=4``);
  ``gradient_pre_eps0`` / ``_eps25``: the default gradient search with no random picks / a quarter of each round
  random (``eps_greedy`` 0 / 0.25; the default 0.05 is 1 of 32); ``gradient_pre_thompson``: the default gradient
  search picking by Thompson sampling over a 4-MLP ensemble fitted on the run's measurements, spread 4 kept
  (``acquisition="thompson"``); ``gradient_pre_prune``: the default gradient search holding a sketch measured 16
  times whose best is 1.5x the task's best or slower to 1 candidate per round (``prune=1.5``);
  ``gradient_pre_local_now`` / ``gradient_pre_res_now``: the default gradient search with half of each batch from
  measured-neighbour moves (``local_share=0.5``) / with the residual GP (``residual=True``): levers that act from the
  second round on, so under common random numbers their first round is the default's;
  ``gradient_pre_b16_now`` / ``gradient_pre_b8_now``: the default gradient search at 16 / 8 candidates per round
  (issue 15 item 5 at today's defaults: more rounds to learn from; their first 16 / 8 picks are the default's
  first 16 / 8 under common random numbers); ``genetic_pre_b16`` / ``genetic_pre_b8``: their equal-batch partners;
  ``gradient_pre_open`` / ``genetic_pre_b32_open``: the default gradient search / ``genetic_pre_b32`` with each task's
  first rounds (until 16 measurements of its own) ranked and descended on by the packaged checkpoint as loaded, not
  by the shared model as the earlier tasks' rounds fine-tuned it (``opening="packaged"``); ``gradient_pre_flat1``: the
  default gradient search ranking its best candidates by their ±1 neighbourhood's mean score alone (``flat=1``; the
  default averages half-and-half); ``gradient_pre_pert0`` / ``gradient_pre_pert90``: the default gradient search with
  every descent started at random / 90% of them started around the sketch's best measured configs
  (``perturbed_share`` 0 / 0.9; the default 0.5; the first round, with nothing measured, starts at random either way);
  ``gradient_pre_warm1`` / ``gradient_pre_warm4``: the default gradient search descending 1 / 4 passes of its starts on a
  sketch's first round (``warmup_passes``; the default 2, after Felix's longer warm-up descent);
  ``gradient_pre_spread2`` / ``gradient_pre_spread8``: the default gradient search with its picks kept one / four
  moves apart (``spread`` 2 / 8; the default 4, two moves; the first round's picks differ too);
  ``gradient_pre_nb0`` / ``gradient_pre_nb32``: the default gradient search scoring the ±1 neighbourhoods of none / the
  32 best of its rounded points per sketch (``neighbours_of`` 0 / 32; the default 8: the repair after rounding, issue
  15 item 3); ``gradient_pre_temp025``: the default gradient search descending on sharper soft features
  (``temperature=0.25``; the default 1.0; session 37 compared them offline only, item 4);
  ``gradient_pre_lr015`` / ``gradient_pre_lr15``: the default gradient search descending with Adam's initial step
  0.15 / 1.5 (``lr``; the default 0.5, decayed ×0.2 at 30% of the steps);
  ``gradient_pre_hv1`` / ``gradient_pre_hv4``: the default gradient search keeping every / every fourth iterate of each
  descent as a candidate (``harvest_every`` 1 / 4, plus the start and the last; the default 2);
  ``gradient_pre_breed``: the default gradient search whose first round alternates the genetic search's picks under
  the same model with the descents' (``breed_share=0.5``, bred first; later rounds descend only);
  ``gradient_pre_breed1``: the same with the whole first round the genetic search's (``breed_share=1``);
  ``gradient_pre_pess_now``: the default gradient search descending on, and ranking by, score − 1 x the pretrained
  ensemble's disagreement (``pessimism=1``; session 25 measured it on the defaults before spread and ``flat``);
  ``genetic_pre_b32_pess1``: ``genetic_pre_b32`` ranking by the same pessimistic score (equal equipment);
* ``genetic`` — Ansor's GA (64 per round) and ``genetic_b16`` (the same batch as the b16 arms).

``--arms`` picks a subset. Every arm of a task replays one shared, memoized oracle (each distinct
config is evaluated once, whichever arm asks), and since session 51 the arms' cost models of one seed
draw the same random numbers (:func:`felixjax.compare`'s common random numbers), so the arms of a seed
make the same trials until their logic first differs: a lever that acts late meets the same first rounds. "95% of best" is taken against the best latency any
arm found for the task (the union of arms and seeds); ratios are ``arm / gradient`` geomeans over the
ops (above 1: the default gradient is better). Also reported per arm, means over runs and rounds:
the model's Kendall tau on each round's candidates before they were measured (``rank tau``), the
soft objective's Kendall tau against the hard features on the proposed points (``soft/hard tau``),
the share of trajectories whose rounded end point scores below their rounded start (``left
basin``) and the score lost to rounding (``rounding loss``, log-latency units).
The replay oracle is :class:`felixjax.testing.SyntheticOracle`: an analytic stand-in for hardware, so
these numbers rank levers, they do not replace the measured comparison.

``--measured`` builds and times real kernels instead (one timing per distinct config, shared by the arms:
compare trials); ``--measured --own`` lets every run build and time its own candidates (seconds compare too).

Usage:
    python benchmarks/ablation.py --ops conv28,dw28,matmul512,dense4096 --seeds 2 --trials 96 --write
    python benchmarks/ablation.py --measured --own --suite dw_gemv --seeds 3 --trials 128 \
        --arms gradient_pre_b32_spread4_flat,genetic_pre_b32
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import felixjax as fj  # noqa: E402
from felixjax.strategies.genetic import GeneticSearch  # noqa: E402
from felixjax.strategies.gradient import GradientSearch  # noqa: E402
from felixjax.suites import suite  # noqa: E402
from felixjax.testing import ReplayRunner  # noqa: E402

SHORT = {"matmul512": 0, "matmul1024": 1, "conv56": 2, "conv28": 3, "conv14": 4, "dw28": 5, "dense4096": 6}


#: the tree ranker's extra training rows in the ``*_gbdt`` arms: measurements of the ``calibration`` suite
#: (disjoint from ``ops`` and ``fresh``) recorded by ``benchmarks/model_pool.py record`` in session 23
#: (databases, or ``.jsonl.gz`` exports of them as committed here)
RANKER_DATA = "docs/data/pools_s23/calibration.jsonl.gz,docs/data/pools_s23/calibration_genetic.jsonl.gz"


def arms(ranker_data: str | None = RANKER_DATA, host_models: dict | None = None) -> list:
    def named(obj, name):
        obj.name = name
        return obj

    def grad(**kw):  # the gradient arms as measured before session 32: 64 per round, spread 0 unless set;
        # with the per-round statistics this report reads (the strategy's default since session 33 leaves them off)
        return GradientSearch(**{"batch_size": 64, "spread": 0.0, "flat": 0.0, "stats": True, **kw})

    gbdt = {"ranker": "gbdt", "ranker_data": ranker_data or None}

    none = {"cost_model": None}  # every arm but the *_pre ones starts from the roofline prior, as before session 24
    trust = {"trust_weight": 1.0, "trust_radius": 2.0}
    return [
        named(grad(**none), "gradient"),
        named(grad(**none, batch_size=16), "gradient_b16"),
        named(grad(**none, **trust), "gradient_trust"),
        named(grad(**none, batch_size=16, **trust), "gradient_b16_trust"),
        named(grad(**none, batch_size=16, acquisition="ucb", **trust), "gradient_b16_trust_ucb"),
        named(grad(**none, batch_size=16, acquisition="thompson", **trust), "gradient_b16_trust_thompson"),
        named(grad(**none, batch_size=16, local_share=0.25, **trust), "gradient_b16_trust_local"),
        named(grad(**none, batch_size=32, **trust), "gradient_b32_trust"),
        named(grad(**none, **gbdt), "gradient_gbdt"),
        named(grad(cost_model="packaged"), "gradient_pre"),
        named(grad(cost_model="packaged", **trust), "gradient_pre_trust"),
        named(grad(cost_model="packaged", local_share=0.5), "gradient_pre_local"),
        named(grad(cost_model="packaged", lr=0.05), "gradient_pre_lr05"),
        named(grad(cost_model="packaged", acquisition="ucb", ucb_beta=-1.0), "gradient_pre_lcb"),
        named(grad(cost_model="packaged", pessimism=1.0), "gradient_pre_pess1"),
        named(grad(cost_model="packaged", pessimism=3.0), "gradient_pre_pess3"),
        named(grad(cost_model="packaged", pessimism=1.0, pessimism_share=0.5), "gradient_pre_hedge"),
        named(grad(cost_model="packaged", evolve=2048), "gradient_pre_evo"),
        named(grad(cost_model="packaged", evolve=2048, pessimism=1.0), "gradient_pre_evo_pess1"),
        named(grad(cost_model="packaged", residual=True), "gradient_pre_res"),
        named(grad(cost_model="packaged", residual=True, residual_beta=1.0), "gradient_pre_res_ucb"),
        named(grad(cost_model="packaged", batch_size=32), "gradient_pre_b32"),
        named(grad(cost_model="packaged", residual=True, batch_size=32), "gradient_pre_res_b32"),
        named(grad(cost_model="packaged", residual=True, residual_rank=False, batch_size=32),
              "gradient_pre_resdesc_b32"),
        named(grad(cost_model="packaged", batch_size=32, spread=2.0), "gradient_pre_b32_spread"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0), "gradient_pre_b32_spread4"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, spread_from=1), "gradient_pre_b32_spread4_from1"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5), "gradient_pre_b32_spread4_flat"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, climb=4), "gradient_pre_climb4"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, eps_greedy=0.0), "gradient_pre_eps0"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, eps_greedy=0.25), "gradient_pre_eps25"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, acquisition="thompson"),
              "gradient_pre_thompson"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, judge="judge"), "gradient_pre_judge"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, evolve=2048), "gradient_pre_evo_now"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, judge="judge", judge_weight=1.0),
              "gradient_pre_judge1"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, starts=128, steps=64),
              "gradient_pre_deep"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, steps=16), "gradient_pre_short"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, prune=1.5, prune_after=16, prune_keep=1),
              "gradient_pre_prune"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, local_share=0.5), "gradient_pre_local_now"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, residual=True), "gradient_pre_res_now"),
        named(grad(cost_model="packaged", batch_size=16, spread=4.0, flat=0.5), "gradient_pre_b16_now"),
        named(grad(cost_model="packaged", batch_size=8, spread=4.0, flat=0.5), "gradient_pre_b8_now"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, opening="packaged"), "gradient_pre_open"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=1.0), "gradient_pre_flat1"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, perturbed_share=0.0), "gradient_pre_pert0"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, perturbed_share=0.9), "gradient_pre_pert90"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, warmup_passes=1), "gradient_pre_warm1"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, warmup_passes=4), "gradient_pre_warm4"),
        named(grad(cost_model="packaged", batch_size=32, spread=2.0, flat=0.5), "gradient_pre_spread2"),
        named(grad(cost_model="packaged", batch_size=32, spread=8.0, flat=0.5), "gradient_pre_spread8"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, neighbours_of=0), "gradient_pre_nb0"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, neighbours_of=32), "gradient_pre_nb32"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, temperature=0.25), "gradient_pre_temp025"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, lr=0.15), "gradient_pre_lr015"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, lr=1.5), "gradient_pre_lr15"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, harvest_every=1), "gradient_pre_hv1"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, harvest_every=4), "gradient_pre_hv4"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, breed_share=0.5), "gradient_pre_breed"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, breed_share=1.0), "gradient_pre_breed1"),
        named(grad(cost_model="packaged", batch_size=32, spread=4.0, flat=0.5, pessimism=1.0), "gradient_pre_pess_now"),
        named(GeneticSearch(**none), "genetic"),
        named(GeneticSearch(**none, batch_size=16), "genetic_b16"),
        named(GeneticSearch(**none, **gbdt), "genetic_gbdt"),
        named(GeneticSearch(cost_model="packaged"), "genetic_pre"),
        named(GeneticSearch(cost_model="packaged", batch_size=32), "genetic_pre_b32"),
        named(GeneticSearch(cost_model="packaged", batch_size=16), "genetic_pre_b16"),
        named(GeneticSearch(cost_model="packaged", batch_size=8), "genetic_pre_b8"),
        named(GeneticSearch(cost_model="packaged", batch_size=32, opening="packaged"), "genetic_pre_b32_open"),
        named(GeneticSearch(cost_model="packaged", batch_size=32, spread=4.0), "genetic_pre_b32_spread4"),
        named(GeneticSearch(cost_model="packaged", batch_size=32, judge="judge"), "genetic_pre_b32_judge"),
        named(GeneticSearch(cost_model="packaged", pessimism=1.0), "genetic_pre_pess1"),
        named(GeneticSearch(cost_model="packaged", pessimism=1.0, pessimism_share=0.5), "genetic_pre_hedge"),
        named(GeneticSearch(cost_model="packaged", batch_size=32, pessimism=1.0), "genetic_pre_b32_pess1"),
    ] + [arm for name, path in (host_models or {}).items() for arm in (
        named(grad(cost_model=path, batch_size=32, spread=4.0, flat=0.5), f"gradient_host_{name}"),
        named(GeneticSearch(cost_model=path, batch_size=32), f"genetic_host_b32_{name}"))]


class Memo:
    """One measurer per task, memoized per config and shared by every arm and seed: the replay oracle,
    or (``measured=True``) real builds and timings at 1 thread, each distinct config measured once
    (issue 15 allows this for the ablation); a memo hit costs an arm no seconds, so with ``measured``
    only the trials columns compare arms. With ``share=False`` (``--own``) nothing is memoized: every
    run builds (into its own cache) and times its own candidates, so its seconds are its own too.
    ``build_chunk``: the measurer's (``felixjax.Measurer``; ``None``: its default, ``0``: whole batch)."""

    def __init__(self, measured: bool = False, share: bool = True, build_chunk: int | None = None):
        self.runners: dict = {}
        self.hits = self.misses = 0
        self.measured, self.local = measured, None
        self.share, self.build_chunk = share, build_chunk

    def _inner(self, task, target):
        if not self.measured:
            return ReplayRunner.from_oracle(task, target)
        from codegen.measure import LocalRunner
        from codegen.measure_records import TimingProtocol
        from felixjax.measurer import Measurer

        self.local = self.local or LocalRunner()
        chunk = {} if self.build_chunk is None else {"build_chunk": self.build_chunk or None}
        return Measurer(task, target, self.local, threads=1,
                        protocol=TimingProtocol(warmup=1, min_repeat_ms=10, repeats=3), **chunk)

    def __call__(self, task, target):
        if not self.share:  # the session keeps one measurer per task; runs set its build cache per step
            return self._inner(task, target)
        if task.key not in self.runners:
            inner = self._inner(task, target)
            cache: dict = {}
            self.runners[task.key] = _MemoRunner(inner, cache, self)
        return self.runners[task.key]


class _MemoRunner:
    def __init__(self, inner, cache: dict, memo: Memo):
        self.inner, self.cache, self.memo = inner, cache, memo
        self.trial_s = getattr(inner, "trial_s", 0.0)

    def measure(self, configs, on_result):
        """Each result is passed on as soon as it and every config before it in the batch are known
        (memo hits at once, misses as the inner measurer reports them), so an arm's clock reads when
        its result would have arrived had it measured the batch itself."""
        todo = [c for c in configs if c not in self.cache]
        self.memo.hits += len(configs) - len(todo)
        self.memo.misses += len(todo)
        done = 0
        stop = False

        def flush() -> bool:
            nonlocal done, stop
            while not stop and done < len(configs) and configs[done] in self.cache:
                stop = not on_result(configs[done], self.cache[configs[done]])
                done += 1
            return not stop

        if flush() and todo:
            def keep(cfg, res):
                self.cache[cfg] = res
                return flush()

            self.inner.measure(todo, keep)


def search_stats(cmp) -> list[str]:
    """Per arm: model ranking quality per round, soft-vs-hard agreement and rounding statistics."""
    lines = [("| arm | rank tau (model, next round) | top-25% recall | soft/hard tau | left basin | rounding loss "
              "| picks only evolution found |"),
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for arm in cmp.strategies:
        rank, recall, sh, basin, loss, evolved = [], [], [], [], [], []
        for (task, s, seed), st in cmp.stats.items():
            if s != arm:
                continue
            rank += [r["kendall_tau"] for r in st.get("ranking", [])]
            recall += [r["top_k_recall"] for r in st.get("ranking", [])]
            for r in st.get("search", []):
                sh.append(r.get("soft_hard_tau", math.nan))
                if "evolved" in r and r.get("proposed"):
                    evolved.append(r["evolved"] / r["proposed"])
                if r.get("trajectories"):
                    basin.append(r["left_basin"])
                    loss.append(r["rounding_loss"])

        def mean(xs):
            xs = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
            return f"{sum(xs) / len(xs):.3f}" if xs else "—"

        lines.append(f"| {arm} | {mean(rank)} | {mean(recall)} | {mean(sh)} | {mean(basin)} | {mean(loss)} "
                     f"| {mean(evolved)} |")
    return lines


def proposal_medians(csv_path: Path, window: int = 32) -> str:
    """Per arm, the geomean over runs of the median latency of each ``window`` trials' proposals over
    the run's task's best known (1.0 = every proposal as fast as the best): whether an arm's later
    proposals get better or worse than its first ones."""
    import csv
    from collections import defaultdict

    with open(csv_path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["phase"] == "tune" and r["status"] == "ok"]
    best = defaultdict(lambda: math.inf)
    for r in rows:
        best[r["task"]] = min(best[r["task"]], float(r["latency_s"]))
    runs = defaultdict(lambda: defaultdict(list))  # (arm) -> (task, seed, window) -> latencies
    for r in rows:
        runs[r["strategy"]][(r["task"], r["seed"], int(r["trial"]) // window)].append(
            float(r["latency_s"]) / best[r["task"]])
    n = 1 + max(int(r["trial"]) for r in rows) // window if rows else 0
    lines = [f"Median proposal / best known, per {window}-trial window (geomean over runs):", "",
             "| arm | " + " | ".join(f"trials {w * window}-{(w + 1) * window - 1}" for w in range(n)) + " |",
             "| --- |" + " ---: |" * n]
    for arm, cells in runs.items():
        vals = []
        for w in range(n):
            meds = [sorted(v)[len(v) // 2] for (t, s, ww), v in cells.items() if ww == w and v]
            vals.append(f"{math.exp(sum(map(math.log, meds)) / len(meds)):.2f}" if meds else "—")
        lines.append(f"| {arm} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def _section(doc: Path) -> str:
    """The ablation section's current text (earlier runs), without its markers."""
    if not doc.exists():
        return ""
    text = doc.read_text()
    b, e = "<!-- ablation:begin -->", "<!-- ablation:end -->"
    return text[text.index(b) + len(b): text.index(e)].strip("\n") if b in text and e in text else ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default="conv28,dw28,matmul512,dense4096",
                    help=f"from {', '.join(SHORT)}, or op specs as benchmarks/kernels.py --ops takes them")
    ap.add_argument("--suite", default="ops", help="ops (with --ops) or another suite of felixjax.suites, whole")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds run from this one (a repeat on new seeds)")
    ap.add_argument("--trials", type=int, default=96)
    ap.add_argument("--arms", default=None, help="comma-separated arm names (default: all)")
    ap.add_argument("--measured", action="store_true", help="real builds and timings (1 thread, each distinct "
                    "config once per op, shared by the arms) instead of the replay oracle; compare trials only")
    ap.add_argument("--own", action="store_true", help="with --measured: no memo; every run builds (into its own "
                    "cache) and times its own candidates, so seconds compare arms too")
    ap.add_argument("--build-chunk", type=int, default=None, help="candidates built before they are timed "
                    "(default: felixjax.Measurer's; 0: the whole batch first)")
    ap.add_argument("--out", default="results/ablation")
    ap.add_argument("--db", default=None, help="also record every measurement (configs included) in this database "
                    "(default: none; the CSV under --out holds latencies only)")
    ap.add_argument("--host-models", default="",
                    help="NAME=CHECKPOINT,... : adds arms gradient_host_NAME and genetic_host_b32_NAME started "
                         "from each (e.g. a model pretrained on this host's CPU)")
    ap.add_argument("--ranker-data", default=RANKER_DATA,
                    help="databases (comma-separated) the *_gbdt arms' tree ranker also trains on ('' : none)")
    ap.add_argument("--write", action="store_true", help="write the table into docs/BENCHMARKS.md and the curves "
                                                         "into docs/img/ablation_curves_<date>.png")
    args = ap.parse_args(argv)
    if args.suite == "ops":
        ops = suite("ops")
        from benchmarks.kernels import select_ops

        names = [n.strip() for n in args.ops.split(",") if n.strip()]
        tasks = [ops[SHORT[n]] if n in SHORT else next(iter(select_ops(n).values())) for n in names]
    else:  # a whole other suite (e.g. "fresh", held out: judge a lever there after designing it on ops)
        tasks = suite(args.suite)
    ranker_data = args.ranker_data
    if ranker_data and (not args.arms or "gbdt" in args.arms):
        from benchmarks.model_pool import as_database

        ranker_data = ",".join(as_database(p) for p in ranker_data.split(",") if p)
    hosts = dict(spec.partition("=")[::2] for spec in args.host_models.split(",") if spec)
    chosen = arms(ranker_data, hosts)
    if args.arms:
        want = args.arms.split(",")
        unknown = sorted(set(want) - {a.name for a in chosen})
        if unknown:
            ap.error(f"unknown arms {unknown} (the *_host_NAME arms need --host-models NAME=PATH)")
        chosen = [a for a in chosen if a.name in want]
    if args.measured and "FELIXJAX_CACHE" not in os.environ:
        # an empty build cache: every arm's clock pays its own compiles (kernels an earlier run compiled would be
        # free for the arm that proposes them again, e.g. the same arm with the same seed)
        os.environ["FELIXJAX_CACHE"] = tempfile.mkdtemp(prefix="fj_ablation_build_")
    if args.own and not args.measured:
        ap.error("--own needs --measured")
    memo = Memo(measured=args.measured, share=not args.own, build_chunk=args.build_chunk)
    # JIT warm-up on the first op, untimed and thrown away: no arm's clock pays the one-off compilations
    warm = [a for a in arms(None) if a.name in ("gradient_b16_trust_ucb", "genetic_b16")]
    fj.compare(tasks[:1], warm, trials=48, seeds=[99], db=None, replay=True, progress=False, remeasure=0,
               defaults=False)
    t0 = time.perf_counter()
    try:
        seeds = list(range(args.first_seed, args.first_seed + args.seeds))
        own = tempfile.mkdtemp(prefix="fj_ablation_runs_") if args.own else None  # a build cache per run
        cmp = fj.compare(tasks, chosen, trials=args.trials, seeds=seeds, db=args.db, replay=memo, out=args.out,
                         progress=True, remeasure=0, defaults=False, run_caches=own)
    finally:
        if memo.local is not None:
            memo.local.close()
    minutes = (time.perf_counter() - t0) / 60
    if args.measured:  # the comparison saw a replay-like runner factory: its latencies and seconds were measured
        cmp = dataclasses.replace(cmp, replay=False)
        if args.out:
            cmp.save(args.out)  # table.md and curves.png labelled as measured
    text = cmp.table()
    if args.measured and args.own:
        text = text.replace("latencies: measured", "latencies: measured (real builds and timings, 1 thread; every run "
                            "builds into an empty cache of its own and times its own candidates: seconds are its own)")
    elif args.measured:
        text = text.replace("latencies: measured", "latencies: measured (real builds and timings, 1 thread; each "
                            "distinct config measured once per op and shared by the arms: a memo hit costs an arm "
                            "no seconds; builds from an empty cache)")
    text = text + "\n\nSearch statistics (means over runs and rounds):\n\n" + "\n".join(search_stats(cmp))
    if len(seeds) > 1:  # how far the seeds pin the ratios down (benchmarks/ratio_intervals.py reads a saved CSV)
        from benchmarks.compare import interval_table

        text += "\n\n" + "\n".join(interval_table(cmp, 2000))
        text += "\n\n" + "\n".join(interval_table(cmp, 2000, paired=True))  # the arms of a seed share random numbers
    print(text)
    print(proposal_medians(Path(args.out) / "cmp.csv"))
    print(f"memoized oracle: {memo.hits} hits, {memo.misses} evaluations; {minutes:.1f} min"
          + (" (--own: no memo)" if args.own else ""), file=sys.stderr)
    if args.write:
        from benchmarks.kernels import write_doc

        root = Path(__file__).resolve().parent.parent
        img = root / "docs" / "img" / f"ablation_curves_{time.strftime('%Y%m%d_%H%M', time.gmtime())}.png"
        img.parent.mkdir(parents=True, exist_ok=True)
        img.write_bytes((Path(args.out) / "curves.png").read_bytes())
        arm_opt = f" --arms {args.arms}" if args.arms else ""
        head = (f"Replay oracle (no timing), {len(tasks)} ops x {args.seeds} seeds x {args.trials} trials, no "
                f"default schedules first, one memoized oracle per op shared by every arm, JIT compiled before the runs; `python "
                f"benchmarks/ablation.py --ops {args.ops} --seeds {args.seeds} --trials {args.trials}{arm_opt} "
                f"--write` ({minutes:.1f} min on a shared, loaded 2-core machine). Ratios: arm / {cmp.reference()} "
                "(above 1: that arm needed fewer trials / seconds, or found a faster kernel). Seconds are "
                "simulated (0.3 s per trial) plus the search's own wall time, which the machine's load inflates.")
        # newest run first; earlier runs stay below it (write_doc replaces the whole marked section)
        old = _section(root / "docs" / "BENCHMARKS.md")
        write_doc(head + "\n\n" + text + "\n\n![ablation: best so far against trials and seconds]"
                  f"(img/{img.name})" + ("\n\n" + old if old else ""), begin="<!-- ablation:begin -->", end="<!-- ablation:end -->",
                  heading="Ablation of the gradient search's levers on the replay oracle (benchmarks/ablation.py)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
