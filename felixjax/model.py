"""The bridge between records and cost models: configs -> features -> scores, records -> training.

Strategies never touch feature arrays or model parameters; they ask a :class:`Scorer` to rank
configs (higher score = predicted faster) and tell it about new measurements. ``costmodels`` works
on arrays only (DESIGN.md), so turning records into arrays happens here, in ``felixjax``.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from codegen.knobs import registry_key
from codegen.space import Config
from costmodels import Features, MLPCostModel

from .features import N_ACCESS_FEATURES, N_GLOBAL_FEATURES, batch_features, feature_inputs, features
from .features_gpu import batch_gpu_features, gpu_feature_inputs, gpu_features
from .relax_gpu import GpuRelaxation, relaxation_for
from .smooth import Smooth


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


class OnlineCostModel:
    """One learned latency model for every task of a tuning session (DESIGN.md ⑥).

    Holds the analytic roofline prior and the Flax MLP, and every measurement the session has fed
    it, from every task (task ids as groups, so the rank loss and the held-out pairwise accuracy
    compare configs of the same task only). After each round the MLP is fine-tuned from its current
    weights on all of it (never refit from scratch per task or per round) and takes over from the
    prior once its held-out pairwise accuracy beats the prior's on the same rows. With
    ``pretrained`` (a checkpoint of :func:`felixjax.pretrain.pretrain`, or a loaded MLP) the MLP
    ranks from the first round.

    Per-task views (:meth:`scorer`, a :class:`CostModelScorer`) turn configs into features; the
    model itself sees arrays only.

    Example:
        >>> import felixjax as fj
        >>> from codegen.space import Space, sketches_for
        >>> shared = OnlineCostModel(fj.Target.cpu())
        >>> t1, t2 = fj.ops.matmul(64, 64, 64), fj.ops.dense(1, 256, 64)
        >>> s1 = shared.scorer({s.name: Space(t1, s, fj.Target.cpu()) for s in sketches_for(t1)})
        >>> s2 = shared.scorer({s.name: Space(t2, s, fj.Target.cpu()) for s in sketches_for(t2)})
        >>> (s1.group, s2.group, s1.shared is s2.shared)
        (0, 1, True)
    """

    MIN_TRAIN = 24
    #: Online fine-tuning budget: each update sees about this many samples (TenSet/Felix train
    #: from scratch on 30000 per round; here the MLP continues from its weights every round, so a
    #: smaller budget per round keeps the update under a second).
    SAMPLE_BUDGET = 4096
    #: ... and at most this many rows per update (``min_epochs`` epochs over a longer history: a fresh random
    #: subset each epoch), so a round's refit stops growing with the history past ~9,800 training rows
    MAX_SAMPLES = 49_152
    #: The CPU prior: ``"multilevel"`` (:func:`multilevel_prior`, issue 15) or ``"roofline"`` (the
    #: single roofline over L3 traffic that ties most configs of a task).
    prior_kind = "roofline"

    #: Ways a task's first rounds are ranked (``opening``): ``"shared"`` by the model as the session's
    #: other tasks have fine-tuned it; ``"packaged"`` by the pretrained checkpoint as loaded, until the
    #: task has :attr:`OPENING_ROWS` measurements of its own (issue 15, session 53: replaying the
    #: headline's openings offline, the checkpoint's top pick of a task's pool was within 95% of its
    #: best in 0.45 of them, the fine-tuned model's in 0.09).
    OPENINGS = ("shared", "packaged")
    OPENING_ROWS = 16

    def __init__(self, target, *, seed: int = 0, hidden: int = 128, train_config=None, pretrained=None,
                 ranker=None, opening: str = "shared"):
        from costmodels import MLPCostModel, RooflineModel, TrainConfig

        from . import jaxcache
        from .features import GLOBAL_FEATURES, N_ACCESS_FEATURES, N_GLOBAL_FEATURES

        jaxcache.enable()
        if opening not in self.OPENINGS:
            raise ValueError(f"opening must be one of {self.OPENINGS} (got {opening!r})")
        self.target = target
        self.opening = opening
        n_access, n_glob = N_ACCESS_FEATURES, N_GLOBAL_FEATURES
        if getattr(target, "is_gpu", False):  # GPU feature set (felixjax.features_gpu): same classes, own widths
            from .features_gpu import GPU_GLOBAL_FEATURES, L2_BYTES_PER_CLK_SM, N_GPU_ACCESS_FEATURES, N_GPU_GLOBAL_FEATURES

            spec, g = target.spec, GPU_GLOBAL_FEATURES.index
            n_access, n_glob = N_GPU_ACCESS_FEATURES, N_GPU_GLOBAL_FEATURES
            self.prior = RooflineModel(flops_col=g("flops"), bytes_col=g("l2_bytes"), peak_flops=spec.peak_flops,
                                       bandwidth=L2_BYTES_PER_CLK_SM * spec.sm_count * spec.clock_hz,
                                       efficiency_cols=(g("sm_fill"), g("fma_share"), g("tail_efficiency"),
                                                        g("warp_efficiency")), overhead=4e-6, softness=0.1)
        else:
            peak = float(target.peak_gflops_per_core or 150.0) * 1e9 * max(1, int(target.cores))
            g = GLOBAL_FEATURES.index
            if self.prior_kind == "multilevel":
                self.prior = multilevel_prior(target)
            else:
                self.prior = RooflineModel(flops_col=g("flops"), bytes_col=g("traffic_l3"), peak_flops=peak,
                                           bandwidth=12e9 * max(1, int(target.cores)),
                                           efficiency_cols=(g("vec_utilization"), g("balance"),
                                                            g("register_utilization")), softness=0.1)
        cfg = train_config or TrainConfig(sample_budget=self.SAMPLE_BUDGET, max_epochs=100, max_samples=self.MAX_SAMPLES)
        pretrained = resolve_cost_model(pretrained, target)
        if pretrained is None:
            self.mlp = MLPCostModel(n_access, n_glob, hidden=hidden, seed=seed, config=cfg)
            self.pretrained = None
        else:
            self.mlp = (load_pretrained(pretrained, widths=(n_access, n_glob))
                        if isinstance(pretrained, (str, os.PathLike)) else pretrained)
            if not isinstance(self.mlp, MLPCostModel):
                raise TypeError(f"cost_model takes a checkpoint path (`felixjax pretrain`, MLPCostModel.save) or a "
                                f"costmodels.MLPCostModel, not {type(pretrained).__name__}: the search descends on and "
                                f"fine-tunes that MLP. Another model class ranks genetic search's candidates as its "
                                f"scorer: strategy_options={{'scorer': obj}} with score(configs) and update(records)")
            _finite_weights(self.mlp, pretrained if isinstance(pretrained, (str, os.PathLike)) else "object")
            if (self.mlp.n_access_features, self.mlp.n_glob_features) != (n_access, n_glob):
                raise ValueError(f"the cost model {pretrained} takes {self.mlp.n_access_features} / "
                                 f"{self.mlp.n_glob_features} access / global features; a {target.kind} target's "
                                 f"are {n_access} / {n_glob} (a CPU checkpoint on a GPU, or the reverse): give "
                                 f"cost_model=None (`--cost-model none`) to start from the roofline prior "
                                 f"(`felixjax pretrain` learns CPU records only)")
            self.mlp.config = cfg  # online fine-tuning, from the pretrained weights and standardization
            self.mlp._rng = np.random.default_rng(seed)
            self.pretrained = str(pretrained) if isinstance(pretrained, (str, os.PathLike)) else "object"
        # the checkpoint's weights as loaded (new containers, the same immutable arrays): what opens a task
        # with ``opening="packaged"``; fine-tuning replaces the MLP's params, never these
        self._loaded = None if pretrained is None else jax.tree_util.tree_map(lambda a: a, self.mlp.params)
        self.active = "prior" if pretrained is None else "mlp"
        self.metrics: dict = {}
        self.groups: dict[str, int] = {}  # task key -> group id
        self._feats: list = []
        self._lat: list[float] = []
        self._grp: list[int] = []
        self._seen: set = set()
        self._own: dict[int, int] = {}  # rows per group
        self.updates = 0
        # a non-differentiable ranker (felixjax.ranker.TreeRanker) that ranks candidates once fitted, while
        # descents stay on the differentiable model; with data rows of other tasks it fits before any
        # measurement of this session
        self.ranker = ranker
        if ranker is not None:
            ranker.fit(np.zeros((0, 0), np.float32), np.zeros(0), np.zeros(0, np.int64))

    #: The tree ranker ranks a task's candidates once the task has this many measurements of its own
    #: (before that the prior or MLP do): trained on other tasks only, its first rounds were worse than
    #: the roofline prior's on 2 of 4 ops in the measured ablation (docs/BENCHMARKS.md, session 23).
    RANKER_MIN_OWN = 16

    def ranking(self, group: int | None = None) -> bool:
        """Whether candidates of task ``group`` (any task: ``None``) are ranked by the tree ranker
        (set, fitted, and the task measured :attr:`RANKER_MIN_OWN` times) instead of :attr:`model`."""
        if self.ranker is None or not self.ranker.fitted:
            return False
        return group is None or self._own.get(group, 0) >= self.RANKER_MIN_OWN

    def opens(self, group: int) -> bool:
        """Whether task ``group`` is still ranked by the checkpoint as loaded (``opening="packaged"``, a
        pretrained model, and fewer than :attr:`OPENING_ROWS` measurements of the task)."""
        return (self.opening == "packaged" and self._loaded is not None
                and self._own.get(group, 0) < self.OPENING_ROWS)

    def predict(self, features, group: int | None = None) -> np.ndarray:
        """Scores of hard features under the model that ranks task ``group`` (any task: ``None``):
        the checkpoint as loaded while the task opens (:meth:`opens`), else :attr:`model`."""
        if group is not None and self.opens(group):
            return np.asarray(self.mlp.predict(features, params=self._loaded), np.float64)
        return np.asarray(self.model.predict(features), np.float64)

    def blend(self, group: int | None = None) -> Blend:
        """:attr:`differentiable` as task ``group`` sees it: the checkpoint as loaded while the task
        opens (the same structure, so no new compilation), else the active model."""
        if group is not None and self.opens(group):
            return Blend(self.prior, self.mlp, 1.0, mlp_params=self._loaded)
        return self.differentiable

    def group_of(self, task) -> int:
        """The group id of a task (by key), assigned in order of first sight."""
        return self.groups.setdefault(task.key, len(self.groups))

    def scorer(self, spaces: dict) -> "CostModelScorer":
        """A per-task view over this model (``spaces``: the task's spaces by sketch name)."""
        return CostModelScorer(spaces, self.target, model=self)

    @property
    def model(self):
        return self.mlp if self.active == "mlp" else self.prior

    @property
    def differentiable(self) -> "Blend":
        """The active model as one differentiable function whose structure never changes, so the
        gradient strategy's descent compiles once per process whichever model is active."""
        return Blend(self.prior, self.mlp, 1.0 if self.active == "mlp" else 0.0)

    @property
    def samples(self) -> int:
        return len(self._lat)

    def add(self, group: int, configs: list, features, latencies) -> int:
        """Remember measurements of one task (configs already seen in that group are skipped);
        returns how many rows were new. Call :meth:`fit` to learn from them."""
        keep = [i for i, c in enumerate(configs) if (group, c) not in self._seen]
        if not keep:
            return 0
        idx = np.asarray(keep)
        self._feats.append(Features(features.access[idx], features.mask[idx], features.glob[idx]))
        self._lat += [float(latencies[i]) for i in keep]
        self._grp += [group] * len(keep)
        self._own[group] = self._own.get(group, 0) + len(keep)
        self._seen.update((group, configs[i]) for i in keep)
        return len(keep)

    def fit(self) -> dict:
        """Fine-tune the MLP on every measurement so far and pick the better ranker."""
        from costmodels import concat_features, pairwise_accuracy

        if not self._feats:
            return {}
        feats = concat_features(self._feats)
        self._feats = [feats]  # keep one concatenated block
        lat = np.asarray(self._lat)
        groups = np.asarray(self._grp, np.int64)
        if self.ranker is not None:
            from .ranker import flat_features

            self.ranker.fit(flat_features(feats), lat, groups)
        if len(self._lat) < self.MIN_TRAIN:
            return {}
        m = self.mlp.update(feats, lat, groups)
        self.updates += 1
        val = self.mlp.last_val_index
        if len(val) >= 8:
            sub = Features(feats.access[val], feats.mask[val], feats.glob[val])
            prior_acc = pairwise_accuracy(self.prior.predict(sub), lat[val], groups[val])
            mlp_acc = float(m.get("val_pairwise_accuracy", float("nan")))
            self.metrics = {"n": len(lat), "tasks": len(set(self._grp)), "mlp_val_pairwise": mlp_acc,
                            "prior_val_pairwise": prior_acc}
            self.active = "mlp" if mlp_acc > prior_acc else "prior"
        return self.metrics


class CostModelScorer:
    """The learned scorer of one task: a view of an :class:`OnlineCostModel` (shared by every task of
    a session) that turns the task's configs into hard-mode features.

    Without ``model`` it makes a model of its own (``seed``, ``hidden``, ``train_config``,
    ``pretrained``, ``ranker`` and ``opening`` go to it), which is what a strategy used on its own, outside a session, gets.

    Attributes:
        relaxations: one :class:`~felixjax.relax.Relaxation` per sketch (features are computed from
            the relaxed point of a config, exactly, in hard mode).
        inputs: the feature function's per-sketch inputs.
        shared, group: the model and this task's group id in it.
        active: ``"prior"`` or ``"mlp"`` (the shared model's); ``metrics`` holds its last comparison.
    """

    CHUNK = 1024
    MIN_TRAIN = OnlineCostModel.MIN_TRAIN
    SAMPLE_BUDGET = OnlineCostModel.SAMPLE_BUDGET

    def __init__(self, spaces: dict, target=None, *, model: OnlineCostModel | None = None, seed: int = 0,
                 hidden: int = 128, train_config=None, pretrained=None, ranker=None, opening: str = "shared"):
        if model is None:
            if target is None:
                raise ValueError("CostModelScorer needs a target or a shared model")
            model = OnlineCostModel(target, seed=seed, hidden=hidden, train_config=train_config,
                                    pretrained=pretrained, ranker=ranker, opening=opening)
        self.shared = model
        self.relaxations = {name: relaxation_for(sp) for name, sp in spaces.items()}
        # GPU spaces have features of their own (felixjax.features_gpu); a session's spaces are all one kind
        self.gpu = any(isinstance(r, GpuRelaxation) for r in self.relaxations.values())
        if self.gpu and not all(isinstance(r, GpuRelaxation) for r in self.relaxations.values()):
            raise ValueError("a scorer's spaces are all CPU or all GPU sketches")
        self.feature_fn = gpu_features if self.gpu else features
        self.inputs = {name: (gpu_feature_inputs(r) if self.gpu else feature_inputs(r))
                       for name, r in self.relaxations.items()}
        task = next(iter(spaces.values())).task if spaces else None
        self.group = model.group_of(task) if task is not None else 0

    # the shared model's state, seen from this task
    prior = property(lambda self: self.shared.prior)
    mlp = property(lambda self: self.shared.mlp)
    active = property(lambda self: self.shared.active)
    metrics = property(lambda self: self.shared.metrics)
    pretrained = property(lambda self: self.shared.pretrained)
    model = property(lambda self: self.shared.model)
    #: the differentiable model this task is ranked and descended on (:meth:`OnlineCostModel.blend`)
    differentiable = property(lambda self: self.shared.blend(self.group))

    def _padded(self, xs: np.ndarray):
        """``(chunk padded to 64 or CHUNK rows, real rows)`` over ``xs``: two shapes, two compilations."""
        xs = np.asarray(xs, np.float32)
        for lo in range(0, len(xs), self.CHUNK):
            chunk = xs[lo: lo + self.CHUNK]
            n = len(chunk)
            size = 64 if n <= 64 else self.CHUNK
            yield np.concatenate([chunk, np.repeat(chunk[-1:], size - n, axis=0)]), n

    def features_x(self, sketch: str, xs: np.ndarray):
        """Hard-mode features of integer points ``[B, N_X]`` of one sketch, as numpy ``Features``.

        Rows go through the jitted feature function in chunks padded to 64 or :attr:`CHUNK` rows, so
        it compiles twice at most whatever ``B`` is.
        """
        parts = []
        for pad, n in self._padded(xs):
            batch = batch_gpu_features if self.gpu else batch_features
            f = batch(self.inputs[sketch], jnp.asarray(pad), Smooth.hard_mode())
            parts.append(Features(*(np.asarray(a)[:n] for a in f)))
        return Features(*(np.concatenate([getattr(p, k) for p in parts]) for k in ("access", "mask", "glob")))

    def features(self, configs: list[Config]):
        """Hard-mode features of configs (any mix of sketches), in order, as numpy ``Features``."""
        order, parts = [], []
        for name in sorted({c.sketch for c in configs}):
            idx = [i for i, c in enumerate(configs) if c.sketch == name]
            parts.append(self.features_x(name, np.stack([self.relaxations[name].to_x(configs[i]) for i in idx])))
            order += idx
        inv = np.argsort(np.asarray(order))
        return Features(*(np.concatenate([getattr(p, f) for p in parts])[inv] for f in ("access", "mask", "glob")))

    def score(self, configs: list[Config]) -> np.ndarray:
        if not configs:
            return np.zeros(0)
        if self.shared.ranking(self.group):
            from .ranker import flat_features

            return self.shared.ranker.predict(flat_features(self.features(configs)))
        return self.shared.predict(self.features(configs), self.group)

    def score_x(self, sketch: str, xs: np.ndarray, model=None) -> np.ndarray:
        """Scores of integer points ``[B, N_X]`` of one sketch (no :class:`Config` objects built):
        hard features and the active model in one jitted call per padded chunk, compiled once per
        process for every task and sketch (the model enters as parameters of a :class:`Blend`).
        ``model``: another pure model over the same features instead (e.g. a :class:`Pessimistic`)."""
        xs = np.asarray(xs, np.float32)
        if not len(xs):
            return np.zeros(0)
        if model is None and self.shared.ranking(self.group):  # the tree ranker: features (jitted), then trees
            from .ranker import flat_features

            return self.shared.ranker.predict(flat_features(self.features_x(sketch, xs)))
        blend = model if model is not None else self.differentiable
        fn = _hard_score_for(blend, self.feature_fn)
        out = []
        for pad, n in self._padded(xs):
            out.append(np.asarray(fn(blend.params, self.inputs[sketch], jnp.asarray(pad)))[:n])
        return np.concatenate(out).astype(np.float64)

    def soft_score(self, temperature: float, model=None):
        """``fn(params, inputs, x) -> predicted score`` on soft features of one relaxed point: the
        differentiable objective of the gradient strategy (pure; compiled once per model kind);
        ``model`` as in :meth:`score_x`."""
        return _soft_score_for(model if model is not None else self.differentiable, float(temperature),
                               self.feature_fn)

    def update(self, records: list) -> None:
        """Feed this task's new correct measurements to the shared model and fine-tune it."""
        new = [r for r in records if r.ok and r.config.sketch in self.relaxations]
        if not new:
            return
        cfgs = [r.config for r in new]
        if self.shared.add(self.group, cfgs, self.features(cfgs), [r.latency_s for r in new]):
            try:
                self.shared.fit()
            except KeyboardInterrupt:  # raised inside JAX's training step: ~100 lines of its frames otherwise
                raise KeyboardInterrupt("interrupted while the cost model was being refit") from None


class Blend:
    """``w · mlp + (1 − w) · prior`` with ``w`` a parameter: ``apply(params, features)`` is pure."""

    def __init__(self, prior, mlp, weight: float, mlp_params=None):
        self._prior, self._mlp = prior, mlp
        self.hidden = mlp.hidden
        self.n_access_features, self.n_glob_features = mlp.n_access_features, mlp.n_glob_features
        self.prior_cols = (prior.flops_col, prior.bytes_col) + tuple(prior.efficiency_cols)
        self.prior_softness = prior.softness
        self.prior_key = model_key(prior)  # the prior's kind and columns: compiled code is per prior
        self.params = {"w": np.float32(weight), "prior": prior.params, "mlp": mlp.params if mlp_params is None else mlp_params}

    def apply(self, params, features):
        w = params["w"]
        return w * self._mlp.apply(params["mlp"], features) + (1.0 - w) * self._prior.apply(params["prior"], features)


#: Machine constants of the multilevel prior that the target does not describe (AMD Zen 2/3 and
#: Intel Skylake-class cores: FMA latency 4-5 cycles, 2 FMA / 2 load / 1 store ports, 4-wide issue;
#: L2 -> L1 32 B/cycle, L3 -> L2 ~16 B/cycle per core). The clock is derived from the measured peak
#: when the target has one (peak = clock x 2 FMA ports x 2 FLOPs x lanes), else ``clock_hz``.
CPU_MACHINE = {"clock_hz": 3.0e9, "fma_latency": 4.0, "fma_ports": 2.0, "load_ports": 2.0, "store_ports": 1.0,
               "issue_width": 4.0, "loop_ops": 2.0, "l2_bytes_per_cycle": 32.0, "l3_bytes_per_cycle": 16.0,
               "dram_bytes_per_s_per_core": 12e9}


def multilevel_prior(target, softness: float = 0.1, side: bool = False):
    """The :class:`costmodels.roofline.MultiLevelRoofline` prior of a CPU target over this feature set.

    ``side``: count the accumulator / epilogue / copy vector accesses and a pipeline drain per
    accumulator-loop execution too. Off: on the issue-15 measurements (``benchmarks/prior_rank.py``)
    that term lowered the mean Kendall tau from 0.52 to 0.46 (it charges scalar (vec 1) configs
    one store per element and every ``S2`` iteration a full drain, more than gcc's code pays)."""
    from costmodels.roofline import MultiLevelRoofline

    from .features import ACCESS_FEATURES, GLOBAL_FEATURES, SLOTS

    g, a, m = GLOBAL_FEATURES.index, ACCESS_FEATURES.index, CPU_MACHINE
    lanes, cores = max(1, int(target.simd_lanes)), max(1, int(target.cores))
    fma_ports = m["fma_ports"] if getattr(target, "fma", True) else 1.0
    clock = (float(target.peak_gflops_per_core) * 1e9 / (2.0 * fma_ports * lanes)
             if target.peak_gflops_per_core else m["clock_hz"])
    cols = {k: g(k) for k in ("flops", "elem_bytes", "vec", "accumulators", "balance", "unroll_effective",
                              "traffic_l1", "traffic_l2", "traffic_l3")}
    cols["s2_trips"] = tuple(g(f"trips_{p}") for p in ("S0", "S1", "R0", "S2")) if side else ()
    machine = {"clock_hz": clock, "fma_latency": m["fma_latency"], "fma_ports": fma_ports,
               "load_ports": m["load_ports"], "store_ports": m["store_ports"], "issue_width": m["issue_width"],
               "loop_ops": m["loop_ops"], "cores": cores, "l2_bw": m["l2_bytes_per_cycle"] * clock,
               "l3_bw": m["l3_bytes_per_cycle"] * clock, "dram_bw": m["dram_bytes_per_s_per_core"] * cores}
    return MultiLevelRoofline(cols=cols, operand_slots=(SLOTS.index("data"), SLOTS.index("weight")),
                              other_slots=tuple(SLOTS.index(s) for s in SLOTS if s not in ("data", "weight"))
                              if side else (),
                              tile_col=a("S3_unique_bytes"), total_col=a("S0_bytes"),
                              contiguous_col=a("vec_contiguous"), machine=machine, softness=softness)


def model_key(model) -> tuple:
    """Models with equal keys share compiled code (their parameters are arguments, not constants)."""
    static = {k: v for k, v in vars(model).items() if isinstance(v, (int, float, str, bool, tuple))
              and not k.startswith("_")}
    return (type(model).__name__,) + tuple(sorted(static.items()))


_HARD_SCORE: dict = {}


def _hard_score_for(model, feature_fn=features):
    """``jit(params, inputs, x [B, N_X]) -> scores [B]`` on exact (hard-mode) features of ``feature_fn``
    (:func:`felixjax.features.features`, or :func:`felixjax.features_gpu.gpu_features`)."""
    key = (model_key(model), registry_key(), feature_fn.__name__)  # the features call the declared knobs' hooks
    if key not in _HARD_SCORE:
        hard = Smooth.hard_mode()

        def one(params, inputs, x):
            f = feature_fn(inputs, x, hard)
            return model.apply(params, f)  # one point, no batch axis: see _soft_score_for

        _HARD_SCORE[key] = jax.jit(jax.vmap(one, in_axes=(None, None, 0)))
    return _HARD_SCORE[key]


_SOFT_SCORE: dict = {}


def _soft_score_for(model, temperature: float, feature_fn=features):
    """``fn(params, inputs, x [N_X]) -> score`` on soft features (not jitted: the caller composes it)."""
    key = (model_key(model), temperature, registry_key(), feature_fn.__name__)
    if key not in _SOFT_SCORE:
        soft = Smooth.soft(temperature)

        def one(params, inputs, x):
            f = feature_fn(inputs, x, soft)
            # one point's features as they are, not as a batch of one ([None] ... [0]): under the
            # descent's vmap and grad that axis made XLA's CPU backward pass of the MLP ~3.4x slower
            # (benchmarks/descent_grad.py, session 65); every model's apply takes [..., A, F]
            return model.apply(params, f)

        _SOFT_SCORE[key] = one
    return _SOFT_SCORE[key]


def make_scorer(ctx, cost_model: str | None = "auto", ranker: str | None = None, ranker_data: str | None = None, *,
                opening: str = "shared") -> Scorer:
    """A scorer with a model of its own, for a strategy used outside a tuning session
    (``cost_model``: a pretrained MLP checkpoint, ``felixjax pretrain``, to start from, ``"auto"``:
    :func:`resolve_cost_model`; ``ranker``,
    ``ranker_data``: a tree ranker, :func:`make_ranker`; ``opening``: :class:`OnlineCostModel`'s)."""
    seed = int(ctx.rng.integers(2**31))
    return CostModelScorer(ctx.spaces, ctx.target, seed=seed, pretrained=cost_model,
                           ranker=make_ranker(ranker, ranker_data, seed=seed), opening=opening)


def make_ranker(kind: str | None, data: str | None = None, *, seed: int = 0):
    """The ranker a strategy's ``ranker`` / ``ranker_data`` options ask for (``None``: none):
    ``"gbdt"`` is a :class:`felixjax.ranker.TreeRanker`, trained also on the measurements in the
    ``data`` databases (comma-separated paths) when given."""
    from .ranker import TreeRanker, check_ranker

    if check_ranker(kind, data)[0] is None:
        return None
    return TreeRanker(ranker_rows(data) if data else None, seed=seed)


def resolve_cost_model(cost_model, target):
    """What a ``cost_model`` option means on ``target``: ``"auto"`` (the strategies' default) is the
    packaged model (``"packaged"``) on a CPU target of the SIMD width it was measured at when it is
    installed, else none (the roofline prior ranks until the online MLP beats it; another width: with a
    ``RuntimeWarning``); anything else is returned as given.

    Example:
        >>> import felixjax as fj
        >>> resolve_cost_model("auto", fj.Target.cuda_sim("a100")) is None
        True
        >>> resolve_cost_model("my.npz", fj.Target.cpu())
        'my.npz'
    """
    if not (isinstance(cost_model, str) and cost_model == "auto"):
        return cost_model
    if getattr(target, "is_gpu", False) or not PACKAGED_MODEL.exists():
        return None
    lanes, machine = packaged_lanes()
    if lanes is not None and int(getattr(target, "simd_lanes", lanes)) != lanes:
        import warnings

        warnings.warn(f"the shipped cost model was measured on a CPU with {lanes} fp32 SIMD lanes ({machine}); this "
                      f"target has {target.simd_lanes}: tuning starts from the roofline prior instead (a model of "
                      f"another machine's latencies misleads the first rounds: in replayed runs it took 1.5-4x the "
                      f"trials of a cold start). cost_model='packaged' uses it anyway; `felixjax pretrain` trains one "
                      f"on your own databases", RuntimeWarning, stacklevel=2)
        return None
    return "packaged"


@functools.lru_cache(maxsize=1)
def packaged_lanes() -> tuple[int | None, str]:
    """``(fp32 SIMD lanes, machine)`` of the CPU the shipped dataset was measured on, from its provenance
    (``None`` where it does not say): ``cost_model="auto"`` uses the shipped model on targets of that width."""
    import json
    import re

    try:
        meta = json.loads(PACKAGED_MODEL.with_name(PACKAGED_MODEL.name + ".json").read_text())
        machine = next(m for m in meta["data_provenance"]["machine"] if m.lstrip("- ").startswith("machine:"))
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        return None, ""
    found = re.search(r"\((\d+) fp32 lanes\)", machine)
    text = machine.lstrip("- ").removeprefix("machine: ").split(",")[0]
    return (int(found.group(1)) if found else None), text


#: The MLP pretrained on the packaged dataset (``benchmarks/make_pretrain_dataset.py --model-only``), which
#: ``cost_model="packaged"`` names.
PACKAGED_MODEL = Path(__file__).resolve().parent / "data" / "pretrain_cpu.npz"


#: An ensemble of 4 MLPs pretrained on the same dataset (bootstrap resamples, own seeds): where they
#: disagree the data do not reach (``pessimism="packaged"`` in the gradient strategy).
PACKAGED_ENSEMBLE = Path(__file__).resolve().parent / "data" / "pretrain_cpu_ens.npz"


#: A second MLP, pretrained on a dataset of another machine (``felixjax/data/pretrain_cpu_b.jsonl.gz``) whose
#: errors are its own: the ``judge="judge"`` option of the learned strategies (:class:`felixjax.context.Judge`).
PACKAGED_JUDGE = Path(__file__).resolve().parent / "data" / "pretrain_cpu_judge.npz"


def resolve_judge(cost_model: str | os.PathLike) -> str:
    """The checkpoint a ``judge`` option names: ``"judge"`` is :data:`PACKAGED_JUDGE`, else the path itself
    (a clear error when it does not exist)."""
    path = PACKAGED_JUDGE if str(cost_model) == "judge" else Path(cost_model)
    if not path.exists():
        raise FileNotFoundError(f"no judge checkpoint at {path} (the shipped one is made by "
                                "benchmarks/make_pretrain_dataset.py --model-only; or pass a `felixjax pretrain` checkpoint)")
    return str(path)


def load_ensemble(path: str | os.PathLike):
    """The :class:`~costmodels.ensemble.EnsembleCostModel` of a checkpoint (``felixjax.pretrain.pretrain``
    with ``members > 1``); ``"packaged"``: :data:`PACKAGED_ENSEMBLE`. Cached per path (read-only use)."""
    path = PACKAGED_ENSEMBLE if str(path) == "packaged" else Path(path)
    key = str(Path(path).resolve())
    if key not in _ENSEMBLES:
        from costmodels import EnsembleCostModel

        if not Path(path).exists():
            raise FileNotFoundError(f"no ensemble checkpoint at {path} (make one with felixjax.pretrain.pretrain(..., "
                                    "members=4))")
        ens = EnsembleCostModel.load(path)
        first = ens.members[0]
        if (first.n_access_features, first.n_glob_features) != (N_ACCESS_FEATURES, N_GLOBAL_FEATURES):
            raise ValueError(f"{path} was trained on another feature set: pretrain again")
        _finite_weights(ens, path)  # (its parameters hold every member's, stacked)
        _ENSEMBLES[key] = ens
    return _ENSEMBLES[key]


_ENSEMBLES: dict = {}


class Pessimistic:
    """``base − beta · std(members)``: a model's score minus the disagreement of an ensemble, so
    a descent (or a ranking) that optimizes it stays where the ensemble's data reach instead of
    chasing the model where it extrapolates (conservative model-based optimization). Pure
    ``apply(params, features)`` over ``params = {"base", "ens", "beta"}``; compiled once per kind.

    Example:
        >>> import numpy as np
        >>> from costmodels import EnsembleCostModel, Features, RooflineModel
        >>> base = RooflineModel(flops_col=0, bytes_col=1, peak_flops=1e9, bandwidth=1e9)
        >>> p = Pessimistic(base, EnsembleCostModel(3, 2, num_members=2, hidden=8), beta=1.0)
        >>> f = Features(np.ones((4, 2, 3)), np.ones((4, 2)), np.ones((4, 2)))
        >>> bool((p.apply(p.params, f) < base.apply(base.params, f)).all())
        True
    """

    def __init__(self, base, ensemble, beta: float):
        self._base, self._ens = base, ensemble
        self.base_key = model_key(base)
        self.members, self.member_hidden = len(ensemble.members), ensemble.members[0].hidden
        self.params = {"base": base.params, "ens": ensemble.params, "beta": np.float32(beta)}

    def apply(self, params, features):
        _, std = self._ens.apply_with_std(params["ens"], features)
        return self._base.apply(params["base"], features) - params["beta"] * std


def load_pretrained(path: str | os.PathLike, *, widths: tuple[int, int] | None = None) -> MLPCostModel:
    """The MLP of a checkpoint written by :func:`felixjax.pretrain.pretrain`, checked against this
    feature set (``widths``: access / global feature counts, default the CPU's; a clear ``ValueError``
    for a file that is not such a checkpoint); ``"packaged"`` is the model shipped with felixjax
    (:data:`PACKAGED_MODEL`)."""
    if str(path) == "packaged":
        path = PACKAGED_MODEL
    if not Path(path).exists():
        raise FileNotFoundError(f"no cost-model checkpoint at {path} (make one with `felixjax pretrain`)")
    model = MLPCostModel.load(path)
    n_access, n_glob = widths or (N_ACCESS_FEATURES, N_GLOBAL_FEATURES)
    if (model.n_access_features, model.n_glob_features) != (n_access, n_glob):
        raise ValueError(f"{path} was trained on {model.n_access_features} access / {model.n_glob_features} global "
                         f"features; this felixjax computes {n_access} / {n_glob} for this target: "
                         + ("pretrain again (`felixjax pretrain`)" if (n_access, n_glob) == (N_ACCESS_FEATURES,
                            N_GLOBAL_FEATURES) else "give cost_model=None (`--cost-model none`) to start from the "
                            "roofline prior (`felixjax pretrain` learns CPU records only)"))
    if not model.fitted:
        raise ValueError(f"{path} holds an untrained model")
    _finite_weights(model, path)
    return model


def _finite_weights(model: MLPCostModel, what) -> None:
    """A ValueError for a model holding NaN / Inf weights or standardization (it ranked every candidate as
    NaN, silently, until its first fine-tuning)."""
    leaves = jax.tree_util.tree_leaves_with_path(model.params)  # the standardization statistics are params too
    bad = sum(int((~np.isfinite(np.asarray(a, np.float64))).sum()) for _, a in leaves
              if np.asarray(a).dtype.kind in "fc")
    if bad:
        raise ValueError(f"the cost model {what} holds {bad} NaN/Inf weight(s)")
    scales = [jax.tree_util.keystr(path) for path, a in leaves  # divided by: a zero one makes every score NaN
              if jax.tree_util.keystr(path).endswith("_std']") and not (np.asarray(a) > 0).all()]
    if scales:
        raise ValueError(f"the cost model {what} holds a standardization scale that is not positive ({scales[0]})")


def ranker_rows(paths: str | os.PathLike | tuple, *, per_task: int = 128, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` training rows from tuning databases: each task's distinct correct CPU measurements
    (at most ``per_task``, a seeded draw), hard-mode features of the configs, targets centred per task.
    ``paths``: one database or several (``"a.db,b.db"`` or a tuple). Cached per process."""
    if isinstance(paths, (str, os.PathLike)):
        paths = tuple(p for p in str(paths).split(",") if p)
    return _ranker_rows(tuple(str(p) for p in paths), int(per_task), int(seed))


@functools.lru_cache(maxsize=8)
def _ranker_rows(paths: tuple[str, ...], per_task: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from codegen.spaces import spaces_for
    from codegen.target import Target

    from .database import Database
    from .ranker import centred_targets, flat_features

    X, y = [], []
    rng = np.random.default_rng(seed)
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(f"ranker data: no database at {path}")
        with Database(path, readonly=True) as db:
            for task, target_key in db.tasks():
                recs: dict = {}
                for r in db.records(task=task, target=target_key):
                    if r.ok and not r.run.startswith("retime:"):
                        recs.setdefault(r.config, r)
                if not recs:
                    continue
                first = next(iter(recs.values()))
                target = Target.from_json(first.target) if first.target else Target.cpu()
                if target.is_gpu:
                    continue
                spaces = spaces_for(task, target)
                rows = [r for r in recs.values() if r.config.sketch in spaces]
                if len(rows) < 8:
                    continue
                rows = [rows[i] for i in np.sort(rng.permutation(len(rows))[:per_task])]
                scorer = CostModelScorer(spaces, target, seed=0)
                X.append(flat_features(scorer.features([r.config for r in rows])))
                lat = np.array([r.latency_s for r in rows])
                y.append(centred_targets(lat, np.zeros(len(lat), int)))
    if not X:
        return np.zeros((0, 0), np.float32), np.zeros(0)
    return np.concatenate(X), np.concatenate(y)
