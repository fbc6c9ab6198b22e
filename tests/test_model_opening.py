"""``opening="packaged"`` (issue 15, session 53): a task's first rounds are ranked and descended on by the
pretrained checkpoint as loaded, not by the shared model as the session's other tasks fine-tuned it; from
``OnlineCostModel.OPENING_ROWS`` measurements of its own on, by the shared model. Replay oracle, no compiling."""
import numpy as np
import pytest

import felixjax as fj
from codegen.spaces import spaces_for
from felixjax.context import PessimisticScorer
from felixjax.model import OnlineCostModel
from felixjax.session import TuningSession
from felixjax.strategies.genetic import GeneticSearch
from felixjax.strategies.gradient import GradientSearch
from felixjax.testing import ReplayRunner, SyntheticOracle

# the shipped model's machine (16 lanes; on another SIMD width the default cost model sets it aside): replayed only
TARGET = fj.Target.cpu(cores=2, simd_lanes=16, vector_registers=32, fma=True, avx512_vnni=True, avx512_fp16=False,
                       l1d_bytes=32 << 10, l2_bytes=1 << 20, l3_bytes=32 << 20)
T1 = fj.ops.matmul(64, 48, 32)
T2 = fj.ops.conv2d(1, 16, 14, 14, out_channels=32, kernel=3, padding=1)


def _configs(task, n, seed):
    spaces = spaces_for(task, TARGET)
    rng = np.random.default_rng(seed)
    names = sorted(spaces)
    out = []
    for i in range(n):
        out += [c for c in spaces[names[i % len(names)]].sample_many(rng, 1) if c not in out]
    return spaces, out


def _feed(model, task, n, seed):
    """``n`` measured configs of ``task`` (synthetic latencies) fed to ``model`` and fitted."""
    spaces, cfgs = _configs(task, n, seed)
    scorer = model.scorer(spaces)
    lat = SyntheticOracle(task, TARGET).latencies(cfgs)
    model.add(scorer.group, cfgs, scorer.features(cfgs), lat)
    model.fit()
    return scorer


def _x_scores(scorer, cfgs):
    name = cfgs[0].sketch
    xs = np.stack([scorer.relaxations[name].to_x(c) for c in cfgs if c.sketch == name])
    return scorer.score_x(name, xs)


@pytest.mark.parametrize("opening", ["shared", "packaged"])
def test_a_task_opens_on_the_loaded_checkpoint_until_it_has_measurements_of_its_own(opening):
    loaded = OnlineCostModel(TARGET, pretrained="packaged").scorer(spaces_for(T2, TARGET))
    model = OnlineCostModel(TARGET, pretrained="packaged", opening=opening)
    _feed(model, T1, 48, seed=0)  # another task's rows fine-tune the shared MLP
    assert model.updates == 1
    spaces, cfgs = _configs(T2, 24, seed=1)
    view = model.scorer(spaces)
    as_loaded, shared = loaded.score(cfgs), np.asarray(model.model.predict(view.features(cfgs)), np.float64)
    assert not np.allclose(as_loaded, shared, atol=1e-4)  # the fine-tuning moved the model
    assert model.opens(view.group) == (opening == "packaged")
    want = as_loaded if opening == "packaged" else shared
    np.testing.assert_allclose(view.score(cfgs), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(PessimisticScorer(view, beta=0.0).score(cfgs), want, rtol=1e-5, atol=1e-5)  # genetic's
    # the jitted path (hard features and model in one call) and the descent's model agree with it
    same = [c for c in cfgs if c.sketch == cfgs[0].sketch]
    np.testing.assert_allclose(_x_scores(view, same), want[[cfgs.index(c) for c in same]], rtol=1e-4, atol=1e-4)
    assert float(view.differentiable.params["w"]) == (1.0 if opening == "packaged" else
                                                       float(model.differentiable.params["w"]))
    # with OPENING_ROWS measurements of its own the task is ranked by the shared model in either case
    lat = SyntheticOracle(T2, TARGET).latencies(cfgs[: OnlineCostModel.OPENING_ROWS])
    model.add(view.group, cfgs[: OnlineCostModel.OPENING_ROWS], view.features(cfgs[: OnlineCostModel.OPENING_ROWS]),
              lat)
    assert not model.opens(view.group)
    np.testing.assert_allclose(view.score(cfgs), model.model.predict(view.features(cfgs)), rtol=1e-5, atol=1e-5)


def test_the_opening_needs_a_checkpoint_and_a_known_name():
    model = OnlineCostModel(TARGET, pretrained=None, opening="packaged")  # nothing loaded: the shared model ranks
    assert not model.opens(model.group_of(T1))
    for make in (lambda: OnlineCostModel(TARGET, opening="frozen"), lambda: GradientSearch(opening="frozen"),
                 lambda: GeneticSearch(opening="frozen")):
        with pytest.raises(ValueError, match="opening must be one of"):
            make()


def test_a_model_group_serves_one_opening_and_compare_gives_each_arm_its_own():
    with TuningSession(TARGET, measurer=lambda t, tg: ReplayRunner.from_oracle(t, tg), progress=False) as s:
        s.model("g", cost_model="packaged", opening="packaged")
        with pytest.raises(ValueError, match="opening"):
            s.model("g", cost_model="packaged")
    opened = GeneticSearch(population=128, batch_size=24, opening="packaged")
    opened.name = "genetic_open"
    cmp = fj.compare([T1, T2], [GeneticSearch(population=128, batch_size=24), opened], trials=48, seeds=1, db=None,
                     replay=True, progress=False, remeasure=0, defaults=False, target=TARGET)
    first = {(task, arm): [r.config for r in h[:24]] for (task, arm, _), h in cmp.histories.items()}
    # the first task opens on the loaded checkpoint under both (nothing fine-tuned yet): the same 24 picks
    assert first[(T1.name, "genetic")] == first[(T1.name, "genetic_open")]
    # the second task opens after the first one's round fine-tuned the shared model: on it, or on the checkpoint
    assert first[(T2.name, "genetic")] != first[(T2.name, "genetic_open")]
