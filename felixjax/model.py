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


class CostModelScorer:
    """The learned scorer of one task: hard-mode features -> roofline prior or Flax MLP.

    Cold start (DESIGN.md ⑥): without a pretrained model the analytic roofline prior ranks the
    first rounds; after each round the MLP is fine-tuned on every measurement of the run and takes
    over once its held-out pairwise ranking accuracy beats the prior's on the same rows. With
    ``pretrained`` (a checkpoint of :func:`felixjax.pretrain.pretrain`, trained on other tasks) the
    MLP ranks from the first round, is fine-tuned from those weights, and the same comparison
    decides later rounds.

    Attributes:
        relaxations: one :class:`~felixjax.relax.Relaxation` per sketch (features are computed from
            the relaxed point of a config, exactly, in hard mode).
        active: ``"prior"`` or ``"mlp"``; ``metrics`` holds the last comparison.
    """

    MIN_TRAIN = 24
    CHUNK = 1024
    #: Online fine-tuning budget: each update sees about this many samples (TenSet/Felix train
    #: from scratch on 30000 per round; here the MLP continues from its weights every round, so a
    #: smaller budget per round keeps the update under a second).
    SAMPLE_BUDGET = 4096

    def __init__(self, spaces: dict, target, *, seed: int = 0, hidden: int = 128, train_config=None,
                 pretrained: str | None = None):
        from costmodels import MLPCostModel, RooflineModel, TrainConfig

        from . import jaxcache
        from .features import GLOBAL_FEATURES, N_ACCESS_FEATURES, N_GLOBAL_FEATURES, feature_inputs
        from .relax import Relaxation

        jaxcache.enable()
        self.relaxations = {name: Relaxation(sp) for name, sp in spaces.items()}
        self.inputs = {name: feature_inputs(r) for name, r in self.relaxations.items()}
        peak = float(target.peak_gflops_per_core or 150.0) * 1e9 * max(1, int(target.cores))
        g = GLOBAL_FEATURES.index
        self.prior = RooflineModel(flops_col=g("flops"), bytes_col=g("traffic_l3"), peak_flops=peak,
                                   bandwidth=12e9 * max(1, int(target.cores)),
                                   efficiency_cols=(g("vec_utilization"), g("balance"), g("register_utilization")),
                                   softness=0.1)
        cfg = train_config or TrainConfig(sample_budget=self.SAMPLE_BUDGET, max_epochs=100)
        if pretrained is None:
            self.mlp = MLPCostModel(N_ACCESS_FEATURES, N_GLOBAL_FEATURES, hidden=hidden, seed=seed, config=cfg)
        else:
            from .pretrain import load_pretrained

            self.mlp = load_pretrained(pretrained)
            self.mlp.config = cfg  # online fine-tuning, from the pretrained weights and standardization
            self.mlp._rng = np.random.default_rng(seed)
        self.pretrained = None if pretrained is None else str(pretrained)
        self.active = "prior" if pretrained is None else "mlp"
        self.metrics: dict = {}
        self._feats: list = []
        self._lat: list[float] = []
        self._seen: set = set()

    @property
    def model(self):
        return self.mlp if self.active == "mlp" else self.prior

    @property
    def differentiable(self) -> "Blend":
        """The active model as one differentiable function whose structure never changes, so the
        gradient strategy's descent compiles once per process whichever model is active."""
        return Blend(self.prior, self.mlp, 1.0 if self.active == "mlp" else 0.0)

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
        import jax.numpy as jnp

        from costmodels import Features

        from .features import batch_features
        from .smooth import Smooth

        parts = []
        for pad, n in self._padded(xs):
            f = batch_features(self.inputs[sketch], jnp.asarray(pad), Smooth.hard_mode())
            parts.append(Features(*(np.asarray(a)[:n] for a in f)))
        return Features(*(np.concatenate([getattr(p, k) for p in parts]) for k in ("access", "mask", "glob")))

    def features(self, configs: list[Config]):
        """Hard-mode features of configs (any mix of sketches), in order, as numpy ``Features``."""
        from costmodels import Features

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
        return np.asarray(self.model.predict(self.features(configs)), np.float64)

    def score_x(self, sketch: str, xs: np.ndarray) -> np.ndarray:
        """Scores of integer points ``[B, N_X]`` of one sketch (no :class:`Config` objects built):
        hard features and the active model in one jitted call per padded chunk, compiled once per
        process for every task and sketch (the model enters as parameters of a :class:`Blend`)."""
        import jax.numpy as jnp

        xs = np.asarray(xs, np.float32)
        if not len(xs):
            return np.zeros(0)
        blend = self.differentiable
        fn = _hard_score_for(blend)
        out = []
        for pad, n in self._padded(xs):
            out.append(np.asarray(fn(blend.params, self.inputs[sketch], jnp.asarray(pad)))[:n])
        return np.concatenate(out).astype(np.float64)

    def update(self, records: list) -> None:
        from costmodels import Features, pairwise_accuracy

        new = [r for r in records if r.ok and r.config not in self._seen]
        if not new:
            return
        f = self.features([r.config for r in new])
        self._feats.append(f)
        self._lat += [r.latency_s for r in new]
        self._seen.update(r.config for r in new)
        if len(self._lat) < self.MIN_TRAIN:
            return
        feats = Features(*(np.concatenate([getattr(p, k) for p in self._feats]) for k in ("access", "mask", "glob")))
        lat = np.asarray(self._lat)
        groups = np.zeros(len(lat), np.int64)
        m = self.mlp.update(feats, lat, groups)
        val = self.mlp.last_val_index
        if len(val) >= 8:
            sub = Features(feats.access[val], feats.mask[val], feats.glob[val])
            prior_acc = pairwise_accuracy(self.prior.predict(sub), lat[val], groups[val])
            mlp_acc = float(m.get("val_pairwise_accuracy", float("nan")))
            self.metrics = {"n": len(lat), "mlp_val_pairwise": mlp_acc, "prior_val_pairwise": prior_acc}
            self.active = "mlp" if mlp_acc > prior_acc else "prior"


class Blend:
    """``w · mlp + (1 − w) · prior`` with ``w`` a parameter: ``apply(params, features)`` is pure."""

    def __init__(self, prior, mlp, weight: float):
        self._prior, self._mlp = prior, mlp
        self.hidden = mlp.hidden
        self.n_access_features, self.n_glob_features = mlp.n_access_features, mlp.n_glob_features
        self.prior_cols = (prior.flops_col, prior.bytes_col) + tuple(prior.efficiency_cols)
        self.prior_softness = prior.softness
        self.params = {"w": np.float32(weight), "prior": prior.params, "mlp": mlp.params}

    def apply(self, params, features):
        w = params["w"]
        return w * self._mlp.apply(params["mlp"], features) + (1.0 - w) * self._prior.apply(params["prior"], features)


def model_key(model) -> tuple:
    """Models with equal keys share compiled code (their parameters are arguments, not constants)."""
    static = {k: v for k, v in vars(model).items() if isinstance(v, (int, float, str, bool, tuple))
              and not k.startswith("_")}
    return (type(model).__name__,) + tuple(sorted(static.items()))


_HARD_SCORE: dict = {}


def _hard_score_for(model):
    """``jit(params, inputs, x [B, N_X]) -> scores [B]`` on exact (hard-mode) features."""
    key = model_key(model)
    if key not in _HARD_SCORE:
        import jax

        from costmodels import Features

        from .features import features
        from .smooth import Smooth

        hard = Smooth.hard_mode()

        def one(params, inputs, x):
            f = features(inputs, x, hard)
            return model.apply(params, Features(f.access[None], f.mask[None], f.glob[None]))[0]

        _HARD_SCORE[key] = jax.jit(jax.vmap(one, in_axes=(None, None, 0)))
    return _HARD_SCORE[key]


def make_scorer(ctx, cost_model: str | None = None) -> Scorer:
    """The default scorer of a search context (used by the genetic and gradient strategies);
    ``cost_model``: a pretrained MLP checkpoint (``felixjax pretrain``) to start from."""
    seed = int(ctx.rng.integers(2**31))
    return CostModelScorer(ctx.spaces, ctx.target, seed=seed, pretrained=cost_model)
