"""Tests of the costmodels package: numerics, ranking metrics, training, ensemble, checkpoints.

Every learned model here uses one small architecture (F=8, G=4, H=64), so the train step and the
forward pass compile once for the whole file.
"""

import doctest
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import costmodels
from costmodels import (
    EnsembleCostModel,
    Features,
    MLPCostModel,
    RooflineModel,
    TrainConfig,
    kendall_tau,
    load_model,
    pairwise_accuracy,
)

F, G, A, HIDDEN = 8, 4, 4, 64
N_TASKS = 6


def make_problem(n, seed):
    """Synthetic programs whose latency is a known function of the features, in N_TASKS tasks."""
    rng = np.random.default_rng(seed)
    access = rng.uniform(0, 3, size=(n, A, F)).astype(np.float32)
    n_real = rng.integers(1, A + 1, size=n)
    mask = (np.arange(A)[None] < n_real[:, None]).astype(np.float32)
    glob = rng.uniform(0, 3, size=(n, G)).astype(np.float32)
    groups = rng.integers(0, N_TASKS, size=n)
    task_size = np.random.default_rng(99).uniform(8, 14, size=N_TASKS)
    glob[:, 3] = task_size[groups]  # a task-level feature (like log FLOPs): constant within a task
    w = np.random.default_rng(100).normal(size=F) * 0.5
    per_access = np.logaddexp(0.0, access @ w)  # softplus of a linear map, summed over real slots
    log_latency = (
        glob[:, 3]
        - 20.0
        + 0.5 * (per_access * mask).sum(1)
        - 0.8 * glob[:, 0]
        + 0.4 * np.maximum(glob[:, 1], glob[:, 2])
        + rng.normal(scale=0.03, size=n)
    )
    return Features(access, mask, glob), np.exp(log_latency), groups


@pytest.fixture(scope="module")
def train_data():
    return make_problem(600, seed=0)


@pytest.fixture(scope="module")
def test_data():
    return make_problem(800, seed=1)


@pytest.fixture(scope="module")
def trained_mlp(train_data):
    model = MLPCostModel(F, G, hidden=HIDDEN, seed=0)
    metrics = model.update(*train_data)
    return model, metrics


def small_features(batch=5, seed=3):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, A), np.float32)
    mask[:, -1] = 0.0
    return Features(
        jnp.asarray(rng.normal(size=(batch, A, F)), jnp.float32),
        jnp.asarray(mask),
        jnp.asarray(rng.uniform(0, 3, size=(batch, G)), jnp.float32),
    )


@pytest.fixture(scope="module")
def models():
    """One untrained model of each kind (built once: NNX initialization is not free)."""
    prior = RooflineModel(flops_col=3, bytes_col=2, efficiency_cols=(0,), peak_flops=1e10, bandwidth=1e9)
    mlp = MLPCostModel(F, G, hidden=HIDDEN, seed=1)
    ensemble = EnsembleCostModel(F, G, num_members=3, hidden=HIDDEN, seed=2)
    return {"roofline": prior, "mlp": mlp, "ensemble": ensemble}


# ---- layer 1: numerics ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["roofline", "mlp", "ensemble"])
def test_apply_jits_is_finite_and_matches_predict(models, name):
    model = models[name]
    assert isinstance(model, costmodels.CostModel)
    features = small_features()
    scores = jax.jit(model.apply)(model.params, features)
    assert scores.shape == (5,)
    assert bool(jnp.isfinite(scores).all())
    np.testing.assert_allclose(model.predict(features), np.asarray(scores), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["roofline", "mlp", "ensemble"])
def test_gradients_wrt_features_are_finite(models, name):
    model = models[name]
    features = small_features()
    grads = jax.jit(jax.grad(lambda f: model.apply(model.params, f).sum()))(features)
    for g in grads:
        assert bool(jnp.isfinite(g).all())
    assert float(jnp.abs(grads.glob).sum()) > 0
    if name != "roofline":  # the prior reads glob only
        assert float(jnp.abs(grads.access).sum()) > 0


@pytest.mark.parametrize("name", ["roofline", "mlp", "ensemble"])
def test_apply_vmaps_over_single_programs(models, name):
    model = models[name]
    features = small_features()
    per_program = jax.jit(jax.vmap(model.apply, in_axes=(None, 0)))(model.params, features)
    batched = jax.jit(model.apply)(model.params, features)
    np.testing.assert_allclose(per_program, batched, rtol=1e-5, atol=1e-5)


def test_ensemble_params_first_read_inside_a_trace_stay_concrete(tmp_path):
    # session 78: the stacked params were cached from inside a jit trace (a tracer), and the next save failed
    ens = EnsembleCostModel(F, G, num_members=2, hidden=8, seed=0)
    features = small_features()
    jax.jit(jax.grad(lambda f: ens.apply(ens.params, f).sum()))(features)
    assert not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(ens.params))
    ens.save(tmp_path / "ens.npz")
    np.testing.assert_allclose(ens.predict(features), load_model(tmp_path / "ens.npz").predict(features), rtol=1e-6)


def test_padding_slots_do_not_change_scores(models):
    model = models["mlp"]
    features = small_features()
    garbage = features.access.at[:, -1, :].set(1e3)  # slot 3 is masked out
    apply = jax.jit(model.apply)
    a = apply(model.params, features)
    b = apply(model.params, features._replace(access=garbage))
    np.testing.assert_allclose(a, b, rtol=1e-6)
    wider = costmodels.pad_accesses(Features(*(np.asarray(x) for x in features)), A + 3)
    np.testing.assert_allclose(model.predict(wider), np.asarray(a), rtol=1e-5, atol=1e-5)


# ---- ranking metrics -----------------------------------------------------------------------


def brute_force_metrics(scores, latencies, groups):
    correct = total = 0.0
    taus = []
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        c = d = tx = ty = 0
        for i, j in itertools.combinations(idx, 2):
            ds, dl = np.sign(scores[i] - scores[j]), np.sign(latencies[j] - latencies[i])
            if dl != 0:
                total += 1
                correct += 1.0 if ds == dl else (0.5 if ds == 0 else 0.0)
            c += ds * dl > 0
            d += ds * dl < 0
            tx += ds == 0
            ty += dl == 0
        n_pairs = len(idx) * (len(idx) - 1) / 2
        denom = np.sqrt((n_pairs - tx) * (n_pairs - ty))
        if denom > 0:
            taus.append((c - d) / denom)
    return correct / total, float(np.mean(taus))


def test_metrics_match_brute_force():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, size=60).astype(float)  # many score ties
    latencies = rng.integers(1, 8, size=60) * 1e-3  # many latency ties
    groups = rng.integers(0, 4, size=60)
    acc, tau = brute_force_metrics(scores, latencies, groups)
    assert pairwise_accuracy(scores, latencies, groups) == pytest.approx(acc)
    assert kendall_tau(scores, latencies, groups) == pytest.approx(tau)


def test_metrics_compare_within_groups_only():
    # perfectly ordered inside each group, inverted across groups
    scores = np.array([1.0, 2.0, 10.0, 11.0])
    latencies = np.array([2.0, 1.0, 20.0, 10.0])
    groups = np.array([0, 0, 1, 1])
    assert pairwise_accuracy(scores, latencies, groups) == 1.0
    assert kendall_tau(scores, latencies, groups) == 1.0
    assert pairwise_accuracy(scores, latencies) < 1.0
    assert np.isnan(pairwise_accuracy([1.0, 2.0], [1.0, 1.0], [0, 0]))


# ---- roofline prior ------------------------------------------------------------------------


def test_roofline_values_and_no_op_update():
    prior = RooflineModel(
        flops_col=0, bytes_col=1, efficiency_cols=(2, 3), peak_flops=1e11, bandwidth=1e10, overhead=1e-6
    )
    raw = np.array([[1e9, 1e6, 1.0, 1.0], [1e9, 1e9, 1.0, 1.0], [1e9, 1e6, 0.5, 0.5]])
    features = Features(np.zeros((3, 1, 1)), np.ones((3, 1)), np.log1p(raw).astype(np.float32))
    latency = np.exp(-prior.predict(features))
    np.testing.assert_allclose(latency, [1e-2 + 1e-6, 1e-1 + 1e-6, 4e-2 + 1e-6], rtol=1e-4)
    params_before = jax.tree_util.tree_map(np.asarray, prior.params)
    metrics = prior.update(features, latency, [0, 0, 0])
    assert metrics["pairwise_accuracy"] == 1.0
    jax.tree_util.tree_map(np.testing.assert_array_equal, params_before, prior.params)


# ---- training ------------------------------------------------------------------------------


def test_an_update_visits_at_most_max_samples_rows(trained_mlp, train_data):
    # session 77's scale review: a round's refit grew with the history (min_epochs over every row: 12.5 s at 30k
    # records); past max_samples (online tuning sets it) each epoch trains on a fresh random subset instead
    _, metrics = trained_mlp
    assert metrics["rows_per_epoch"] == metrics["n_train"]  # no cap by default (pretraining): every row
    roomy = MLPCostModel(F, G, hidden=HIDDEN, seed=0, config=TrainConfig(max_samples=10**9))
    roomy.update(*train_data)  # a cap above the update's rows changes nothing (random stream included)
    jax.tree_util.tree_map(np.testing.assert_array_equal, roomy.params, trained_mlp[0].params)
    capped = MLPCostModel(F, G, hidden=HIDDEN, seed=0, config=TrainConfig(max_samples=640, max_epochs=10))
    m = capped.update(*train_data)
    assert m["rows_per_epoch"] == 64 < m["n_train"] and m["epochs"] <= 10  # 640 rows over 10 epochs
    assert np.isfinite(m["loss"])


def test_mlp_learns_ranking_and_beats_wrong_prior(trained_mlp, test_data):
    model, metrics = trained_mlp
    features, latencies, groups = test_data
    assert metrics["val_pairwise_accuracy"] > 0.8  # 60 held-out rows: noisier than the test set
    assert 30 <= metrics["n_val"] <= 90 and 1 <= metrics["best_epoch"] <= metrics["epochs"]
    held_out = pairwise_accuracy(model.predict(features), latencies, groups)
    assert held_out > 0.85
    assert kendall_tau(model.predict(features), latencies, groups) > 0.7
    # wrong on purpose: reads glob column 0 as FLOPs, but more of it makes programs faster
    wrong_prior = RooflineModel(flops_col=0, bytes_col=1, peak_flops=1e9, bandwidth=1e12, overhead=0.0)
    assert wrong_prior.update(features, latencies, groups)["pairwise_accuracy"] < held_out - 0.3


def test_update_continues_from_current_weights_and_never_gets_worse_on_val(train_data):
    features, latencies, groups = train_data
    model = MLPCostModel(F, G, hidden=HIDDEN, seed=3, config=TrainConfig(max_epochs=10))
    first = model.update(features, latencies, groups)
    before = model.predict(features)
    second = model.update(features, latencies, groups)
    assert model.n_updates == 2
    assert second["best_epoch"] >= 0
    # epoch 0 (the starting weights) takes part in the selection, so held-out rows can't regress
    val = model.last_val_index
    old_val = pairwise_accuracy(before[val], latencies[val], groups[val])
    assert second["val_pairwise_accuracy"] >= old_val - 1e-9
    assert np.isfinite(first["loss"]) and np.isfinite(second["loss"])


def test_held_out_rows_stay_held_out_as_the_dataset_grows(train_data):
    features, latencies, groups = train_data
    first = costmodels.holdout_mask(Features(*(x[:300] for x in features)), 0.1)
    grown = costmodels.holdout_mask(features, 0.1)
    np.testing.assert_array_equal(first, grown[:300])
    assert 0.05 < grown.mean() < 0.15


def test_update_drops_failed_measurements(train_data):
    features, latencies, groups = train_data
    latencies = latencies[:100].copy()
    latencies[[3, 7]] = [np.inf, np.nan]
    model = MLPCostModel(F, G, hidden=HIDDEN, config=TrainConfig(max_epochs=5))
    metrics = model.update(Features(*(x[:100] for x in features)), latencies, groups[:100])
    assert metrics["n_dropped"] == 2
    assert metrics["n_train"] + metrics["n_val"] == 98
    assert np.isfinite(model.predict(features)).all()


def test_fit_to_prior_reproduces_prior_ranking(train_data):
    features, _, groups = train_data
    prior = RooflineModel(flops_col=3, bytes_col=1, efficiency_cols=(0,), peak_flops=1e9, bandwidth=1e9)
    prior_scores = prior.predict(features)
    model = MLPCostModel(F, G, hidden=HIDDEN, seed=4, config=TrainConfig(max_epochs=25))
    model.fit_to_prior(features, prior_scores, groups)
    assert model.fitted
    fake_latency = np.exp(-prior_scores)
    assert pairwise_accuracy(model.predict(features), fake_latency, groups) > 0.9


def test_train_step_compiles_once_across_dataset_sizes():
    model = MLPCostModel(F, G, hidden=HIDDEN, seed=5, config=TrainConfig(max_epochs=3))
    before = model.train_step_traces
    sizes_and_slots = [(37, 4), (150, 3), (260, 4), (91, 2)]  # sizes and access widths both vary
    for k, (n, slots) in enumerate(sizes_and_slots):
        features, latencies, groups = make_problem(n, seed=10 + k)
        narrow = Features(features.access[:, :slots], features.mask[:, :slots], features.glob)
        model.update(narrow, latencies, groups)
        if k == 0:
            after_first = model.train_step_traces
            assert after_first - before <= 1  # 0 if another test already compiled this architecture
            assert after_first >= 1
    assert model.train_step_traces == after_first


# ---- ensemble ------------------------------------------------------------------------------


def test_ensemble_mean_std_and_training(train_data, test_data):
    features, latencies, groups = train_data
    ensemble = EnsembleCostModel(F, G, num_members=3, hidden=HIDDEN, seed=6, config=TrainConfig(max_epochs=12))
    metrics = ensemble.update(features, latencies, groups)
    assert np.isfinite(metrics["val_pairwise_accuracy"])
    test_features, test_latencies, test_groups = test_data
    mean, std = ensemble.predict_with_std(test_features)
    assert (std > 0).all()
    members = np.stack([m.predict(test_features) for m in ensemble.members])
    np.testing.assert_allclose(mean, members.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(std, members.std(0), rtol=1e-4, atol=1e-5)
    assert pairwise_accuracy(mean, test_latencies, test_groups) > 0.8


# ---- checkpoints ---------------------------------------------------------------------------


def test_checkpoint_round_trip_mlp(tmp_path, trained_mlp, test_data):
    model, _ = trained_mlp
    path = tmp_path / "mlp.npz"
    model.save(path)
    with np.load(path, allow_pickle=False) as data:  # plain arrays only, no pickle
        assert "__meta__" in data.files
    loaded = load_model(path)
    assert isinstance(loaded, MLPCostModel) and loaded.fitted and loaded.n_updates == model.n_updates
    np.testing.assert_array_equal(loaded.predict(test_data[0]), model.predict(test_data[0]))


def test_checkpoint_round_trip_ensemble_and_roofline(tmp_path, models):
    features = small_features(batch=7)
    for name, model in models.items():
        if name == "mlp":
            continue
        path = tmp_path / f"{name}.npz"
        model.save(path)
        loaded = type(model).load(path)
        np.testing.assert_array_equal(loaded.predict(features), model.predict(features))
    with pytest.raises(ValueError):
        MLPCostModel.load(tmp_path / "roofline.npz")


def test_docstring_examples_of_fast_modules():
    for module in (costmodels.base, costmodels.checkpoint, costmodels.roofline):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, module.__name__
