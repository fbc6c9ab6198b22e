"""Relaxation: encoding, sampling, projection, rounding with repair, neighbourhood, constraints."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codegen.knobs import knob_slot
from codegen.ops import conv2d, dense, depthwise_conv2d, matmul
from codegen.space import MAX_UNROLL_STEP, Config, Space, sketches_for
from codegen.target import Target
from felixjax.points import first_appearance, unique_rows
from felixjax.relax import (
    CONSTRAINTS,
    FREE_LEVELS,
    I_PAR,
    I_UNROLL,
    I_VEC,
    MAX_PRIMES,
    N_TILE,
    N_X,
    Relaxation,
    constraints,
    penalty,
    project,
    tile_exponents,
)

TARGET = Target(cores=2, simd_lanes=16, vector_registers=32, l1d_bytes=48 * 1024, l2_bytes=2 << 20,
                l3_bytes=4 << 20)
TASKS = {
    "matmul": matmul(12, 16, 20),
    "conv": conv2d(1, 4, 6, 6, out_channels=8, kernel=3, padding=1),
    "depthwise": depthwise_conv2d(1, 8, 6, 6, kernel=3, padding=1, bias=True, act="relu"),
    "primes": matmul(7, 13, 6, bias=True),
    "big_primes": dense(1, 197, 1000),  # 197 is prime, 1000 = 2³·5³: Felix rejects both
}
SPACES = {f"{name}/{sk.name}": Space(t, sk, TARGET) for name, t in TASKS.items() for sk in sketches_for(t)}
RELAX = {name: Relaxation(sp) for name, sp in SPACES.items()}


def _slot(rel: Relaxation, axis: str, level: int, prime: int) -> int:
    """Index in x of (axis, free tile level 1..3, prime)."""
    a = [ax.name for ax in rel.space.axes].index(axis)
    j = [p for p, _ in rel.primes[a]].index(prime)
    return (a * FREE_LEVELS + level - 1) * MAX_PRIMES + j


# ---- encoding ------------------------------------------------------------------------------------

def test_every_valid_config_of_a_small_space_round_trips():
    sp = Space(matmul(4, 6, 2), "gemm_packed", TARGET)
    rel = Relaxation(sp)
    configs = list(sp.enumerate())
    assert len(configs) > 1000
    xs = np.stack([rel.to_x(c) for c in configs])
    assert np.array_equal(xs, np.round(xs))  # integer points
    assert all(rel.from_x(x) == c for x, c in zip(xs, configs))
    assert len({x.tobytes() for x in xs}) == len(configs)  # injective


@pytest.mark.parametrize("name", sorted(SPACES))
def test_sampled_configs_round_trip(name):
    sp, rel = SPACES[name], RELAX[name]
    for cfg in sp.sample_many(np.random.default_rng(0), 30) + [sp.default()]:
        x = rel.to_x(cfg)
        assert rel.from_x(x) == cfg
        assert rel.round_x(x[None]) == [cfg]  # rounding is the identity on valid integer points


def test_to_x_rejects_non_divisors():
    sp = SPACES["matmul/gemm_packed"]
    cfg = sp.default()
    bad = Config(cfg.sketch, ((1, 1, 1, 1), (2, 1, 1, 4)) + cfg.tiles[2:], 0, 1, 1)  # 8 != 12
    with pytest.raises(ValueError):
        RELAX["matmul/gemm_packed"].to_x(bad)


def test_too_many_distinct_primes_is_a_clear_error():
    with pytest.raises(ValueError, match="prime"):
        Relaxation(Space(matmul(2 * 3 * 5 * 7 * 11, 16, 16), "gemm_packed", TARGET))


def test_large_prime_extents_have_their_own_prime_slots():
    rel = RELAX["big_primes/gemm_packed"]
    names = [a.name for a in rel.space.axes]
    assert rel.primes[names.index("k")] == ((197, 1),)
    assert rel.primes[names.index("n")] == ((2, 3), (5, 3))
    assert float(rel.arrays.log_p[names.index("k"), 0]) == pytest.approx(math.log(197))


# ---- sampling and projection ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["conv/conv_direct", "big_primes/gemm_packed"])
def test_samples_are_uniform_in_the_polytope(name):
    rel = RELAX[name]
    n = 20000
    x = np.asarray(rel.sample_x(jax.random.PRNGKey(0), n), np.float64)
    ex = tile_exponents(x)  # [n, A, J, P]
    mask = np.asarray(rel.arrays.slot_mask) > 0
    cap = np.asarray(rel.arrays.cap, np.float64)
    assert (ex >= 0).all() and (ex[:, ~mask] == 0).all()
    assert (ex.sum(2) <= cap + 1e-4).all()
    for a, axis in enumerate(rel.space.axes):
        m = 1 if axis.reduce else FREE_LEVELS  # free levels; the slack is one more Dirichlet part
        for j, (_, e) in enumerate(rel.primes[a]):
            for lvl in range(m):
                y = ex[:, a, lvl, j]
                # marginal of one coordinate of e·Dirichlet(1, ..., 1) with m + 1 parts: e·Beta(1, m)
                assert y.mean() == pytest.approx(e / (m + 1), abs=0.03 * e)
                assert y.var() == pytest.approx(e * e * m / ((m + 1) ** 2 * (m + 2)), rel=0.08)
                ys = np.sort(y)
                cdf = 1.0 - (1.0 - ys / e) ** m
                assert np.abs(cdf - np.arange(1, n + 1) / n).max() < 0.02  # Kolmogorov-Smirnov
    hi = np.array([math.log2(MAX_UNROLL_STEP), math.log2(16), rel.space.n_spatial])
    scalars = x[:, [I_UNROLL, I_VEC, I_PAR]]
    assert (scalars >= 0).all() and (scalars <= hi).all()
    assert scalars.mean(0) == pytest.approx(hi / 2, rel=0.03)


def test_projection_is_feasible_and_idempotent():
    rel = RELAX["conv/conv_spatial_pack"]
    rs = rel.arrays
    x = np.random.default_rng(1).uniform(-3.0, 6.0, (256, N_X)).astype(np.float32)
    proj = jax.jit(project)
    p = np.asarray(proj(rs, x))
    ex = tile_exponents(p)
    assert (ex >= -1e-6).all()
    assert (ex.sum(2) <= np.asarray(rs.cap) + 1e-4).all()
    np.testing.assert_allclose(np.asarray(proj(rs, p)), p, atol=1e-5)
    np.testing.assert_allclose(rel.project(x), p, atol=1e-5)  # the float64 numpy twin agrees
    inside = np.asarray(rel.sample_x(jax.random.PRNGKey(2), 256))
    np.testing.assert_allclose(np.asarray(proj(rs, inside)), inside, atol=1e-5)


def test_projection_of_the_design_example():
    # DESIGN.md ③: (0.6, 0.6) with e = 1 must not round to (1, 1). m = 12 = 2²·3: prime 3 has e = 1.
    rel = RELAX["matmul/gemm_packed"]
    x = np.zeros(N_X, np.float32)
    i1, i2 = _slot(rel, "m", 1, 3), _slot(rel, "m", 2, 3)
    x[i1] = x[i2] = 0.6
    p = rel.project(x)
    assert p[i1] == pytest.approx(0.5) and p[i2] == pytest.approx(0.5)
    cfg = rel.round_x(x[None])[0]
    rel.space.validate(cfg)
    xr = rel.to_x(cfg)
    assert xr[i1] + xr[i2] == 1  # one factor 3 in S1 or S2, none in the quotient


# ---- rounding and repair -------------------------------------------------------------------------

@settings(derandomize=True, deadline=None, max_examples=40)
@given(name=st.sampled_from(sorted(SPACES)), seed=st.integers(0, 2**31 - 1),
       scale=st.floats(0.1, 8.0), shift=st.floats(-3.0, 3.0))
def test_random_continuous_points_round_to_valid_configs(name, seed, scale, shift):
    rel = RELAX[name]
    x = np.random.default_rng(seed).normal(shift, scale, size=(16, N_X)).astype(np.float32)
    configs = rel.round_x(x)
    assert len(configs) == len(x)  # one config per trajectory point, none dropped
    for cfg in configs:
        rel.space.validate(cfg)


def test_round_unique_dedupes_and_indexes():
    rel = RELAX["conv/conv_direct"]
    x = np.asarray(rel.sample_x(jax.random.PRNGKey(3), 200))
    x = np.concatenate([x, x[:50]])
    uniq, idx = rel.round_unique(x)
    assert len(set(uniq)) == len(uniq) < len(x)
    assert [uniq[i] for i in idx] == rel.round_x(x)


@settings(derandomize=True, deadline=None, max_examples=60)
@given(rows=st.integers(0, 40), cols=st.integers(1, 12), values=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_unique_rows_equals_numpys_unique(rows, cols, values, seed):
    # the search's fast dedup returns exactly what np.unique(axis=0) returns: rows, order, first index, inverse
    rng = np.random.default_rng(seed)
    a = rng.integers(-1, values, size=(rows, cols)).astype(np.float32)
    a[:, rng.random(cols) < 0.3] = 2.0  # constant columns (most of a point's slots)
    u, first, inverse = unique_rows(a)
    if rows:
        ref_u, ref_first, ref_inverse = np.unique(a, axis=0, return_index=True, return_inverse=True)
        np.testing.assert_array_equal(u, ref_u)
        np.testing.assert_array_equal(first, ref_first)
        np.testing.assert_array_equal(inverse, ref_inverse.reshape(-1))
    else:
        assert u.shape == (0, cols) and len(first) == len(inverse) == 0
    pts, index = first_appearance(a)
    np.testing.assert_array_equal(pts[index], a)  # every row maps back to itself
    assert len(pts) == len(u) and sorted(first.tolist()) == [int(np.flatnonzero((a == p).all(1))[0]) for p in pts]


def test_repair_lowers_vec_and_shrinks_the_register_block():
    rel = RELAX["matmul/gemm_packed"]
    x = np.zeros(N_X, np.float32)
    # everything of m (12) and n (16) in the S3 register block: 192 accumulators at vec 1
    x[_slot(rel, "m", 3, 2)], x[_slot(rel, "m", 3, 3)] = 2, 1
    x[_slot(rel, "n", 3, 2)] = 4
    x[I_VEC] = 4  # vec 16
    cfg = rel.round_x(x[None])[0]
    rel.space.validate(cfg)
    assert rel.space.accumulators(cfg) <= rel.space.max_accumulators
    assert cfg.vec == 16  # the vector axis keeps its width: rows moved out first
    # a vector width that cannot divide the innermost tile is lowered
    x = np.zeros(N_X, np.float32)
    x[_slot(rel, "n", 3, 2)] = 2  # S3 tile 4
    x[I_VEC] = 4
    assert rel.round_x(x[None])[0].vec == 4


# ---- neighbourhood and constraints ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["conv/conv_spatial_pack", "primes/gemm_packed"])
def test_neighbours_are_valid_one_step_moves(name):
    sp, rel = SPACES[name], RELAX[name]
    cfg = sp.default()
    nb = rel.neighbours(cfg)
    assert len(nb) == len(set(nb)) > 5 and cfg not in nb
    x0 = rel.to_x(cfg)
    for c in nb:
        sp.validate(c)
        d = np.abs(rel.to_x(c) - x0)
        tile_moved = d[:N_TILE].sum()
        scalar_moved = d[N_TILE:]
        if tile_moved:
            assert tile_moved in (1, 2) and not scalar_moved.any()  # one prime between two levels
        else:
            # one knob one step (vec 1 <-> 4); the declared knobs' slots count as knobs too
            assert sorted(scalar_moved[scalar_moved != 0].tolist()) in ([1], [2])


@pytest.mark.parametrize("name", sorted(SPACES))
def test_hard_constraints_hold_exactly_at_valid_configs(name):
    sp, rel = SPACES[name], RELAX[name]
    g = jax.jit(jax.vmap(constraints, in_axes=(None, 0)))
    cfgs = sp.sample_many(np.random.default_rng(1), 40)
    vals = np.asarray(g(rel.arrays, jnp.asarray(np.stack([rel.to_x(c) for c in cfgs]))))
    assert vals.shape == (len(cfgs), len(CONSTRAINTS))
    assert (vals[:, :2] <= 1e-5).all()
    chunks_ok = np.array([math.prod(t[0] for t in c.tiles[: c.parallel]) >= TARGET.cores for c in cfgs])
    np.testing.assert_array_equal(vals[:, 2] <= 1e-5, chunks_ok)


def test_constraints_detect_violations():
    rel = RELAX["matmul/gemm_packed"]
    x = np.zeros(N_X, np.float32)
    x[I_VEC] = 3  # vec 8 with an S3 tile of 1
    g = np.asarray(rel.constraints(x))
    assert g[0] == pytest.approx(3 * math.log(2), rel=1e-5)
    x[_slot(rel, "m", 3, 2)], x[_slot(rel, "m", 3, 3)] = 2, 1
    x[_slot(rel, "n", 3, 2)] = 4
    x[I_VEC] = 0
    g = np.asarray(rel.constraints(x))
    assert g[1] == pytest.approx(math.log(192 / 28), rel=1e-5)
    grad = jax.jit(jax.grad(lambda rs, v: penalty(rs, v), argnums=1))
    assert grad(rel.arrays, jnp.asarray(x))[_slot(rel, "m", 3, 2)] > 0


# ---- the vectorized integer side against plain per-config references --------------------------------

def _reference_repair(rel, ex, scalars):
    """The repair rule of ``Relaxation._repair_arrays`` one config at a time, in plain Python."""
    sp, ex = rel.space, ex.copy()
    vi = sp.vector_index

    def tiles_of(ex):
        return [[math.prod(p ** int(ex[a, lvl, j]) for j, (p, _) in enumerate(rel.primes[a])) for lvl in range(4)]
                for a in range(len(sp.axes))]

    tiles, vec = tiles_of(ex), 2 ** int(scalars[1])
    while tiles[vi][-1] % vec:
        vec = max(v for v in sp.vec_choices if v < vec)
    while math.prod(t[-1] for t, a in zip(tiles, sp.axes) if not a.reduce) // vec > sp.max_accumulators:
        cands = [(a == vi, p, -tiles[a][-1], a, j)
                 for a, axis in enumerate(sp.axes) if not axis.reduce
                 for j, (p, _) in enumerate(rel.primes[a])
                 if ex[a, 3, j] >= 1 and not (a == vi and (tiles[a][-1] // p) % vec)]
        _, _, _, a, j = min(cands)
        ex[a, 3, j] -= 1
        ex[a, 2, j] += 1
        tiles = tiles_of(ex)
    tiles = tuple(tuple(t[:2] if axis.reduce else t) for t, axis in zip(tiles, sp.axes))
    return Config(sp.sketch.name, tiles, int(scalars[2]), vec, 2 ** int(scalars[0]),
                  _reference_extra(sp, scalars[3:]))


def _reference_extra(sp, coords):
    """``Config.extra`` of declared-knob coordinates (one slot each), non-default values only."""
    out = []
    for knob in sp.knobs:
        point = float(coords[knob_slot(knob.name)])
        value = knob.values(sp)[list(knob.points(sp)).index(point)]
        if value != knob.default_value(sp):
            out.append((knob.name, value))
    return tuple(out)


@settings(derandomize=True, deadline=None, max_examples=30)
@given(name=st.sampled_from(sorted(SPACES)), seed=st.integers(0, 2**31 - 1), scale=st.floats(0.5, 6.0))
def test_vectorized_rounding_equals_the_per_config_rule(name, seed, scale):
    rel = RELAX[name]
    x = np.abs(np.random.default_rng(seed).normal(0.0, scale, size=(24, N_X)))
    xp = rel.project(x)
    ex, sc = rel._round_exponents(xp), rel._round_scalars(xp)
    expected = [_reference_repair(rel, e, s) for e, s in zip(ex, sc)]
    assert rel.round_x(x) == expected
    pts, idx = rel.round_points(x)
    assert np.array_equal(pts[idx], np.stack([rel.to_x(c) for c in expected]))
    assert len(np.unique(pts, axis=0)) == len(pts)


def _reference_neighbours(rel, cfg):
    sp, out = rel.space, set()
    for a, (tiles, primes) in enumerate(zip(cfg.tiles, rel.primes)):
        for p, _ in primes:
            for src in range(len(tiles)):
                for dst in range(len(tiles)):
                    if src != dst and tiles[src] % p == 0:
                        t = list(tiles)
                        t[src] //= p
                        t[dst] *= p
                        out.add(Config(cfg.sketch, cfg.tiles[:a] + (tuple(t),) + cfg.tiles[a + 1:], cfg.parallel,
                                       cfg.vec, cfg.unroll))
    ch = sorted(sp.vec_choices)
    i = ch.index(cfg.vec)
    out |= {Config(cfg.sketch, cfg.tiles, cfg.parallel, ch[k], cfg.unroll) for k in (i - 1, i + 1) if 0 <= k < len(ch)}
    # unroll one step each way among the steps search draws (larger valid values build the same kernel)
    out |= {Config(cfg.sketch, cfg.tiles, cfg.parallel, cfg.vec, u) for u in (cfg.unroll // 2, cfg.unroll * 2)
            if u in sp.unroll_steps}
    out |= {Config(cfg.sketch, cfg.tiles, q, cfg.vec, cfg.unroll) for q in (cfg.parallel - 1, cfg.parallel + 1)}
    out = {Config(c.sketch, c.tiles, c.parallel, c.vec, c.unroll, cfg.extra) for c in out}  # knobs kept
    for knob in sp.knobs:  # one declared knob one domain step up or down, the rest kept
        vals = knob.values(sp)
        i = vals.index(cfg.knob(knob.name, knob.default_value(sp)))
        for k in (i - 1, i + 1):
            if 0 <= k < len(vals):
                kept = dict(cfg.extra) | {knob.name: vals[k]}
                extra = tuple((kk.name, kept[kk.name]) for kk in sp.knobs
                              if kept.get(kk.name, kk.default_value(sp)) != kk.default_value(sp))
                out.add(Config(cfg.sketch, cfg.tiles, cfg.parallel, cfg.vec, cfg.unroll, extra))
    return {c for c in out if c != cfg and sp.is_valid(c)}


@pytest.mark.parametrize("name", sorted(SPACES))
def test_vectorized_neighbours_and_validity_equal_the_space(name):
    sp, rel = SPACES[name], RELAX[name]
    cfgs = sp.sample_many(np.random.default_rng(5), 12)
    for cfg in cfgs:
        assert set(rel.neighbours(cfg)) == _reference_neighbours(rel, cfg)
    # valid_x agrees with Space.is_valid on integer points near valid ones (most of them invalid)
    xs = np.stack([rel.to_x(c) for c in cfgs])
    noisy = np.rint(xs[:, None] + np.random.default_rng(6).integers(-1, 2, size=(len(xs), 40, N_X))
                    * (np.random.default_rng(7).random((len(xs), 40, N_X)) < 0.05)).reshape(-1, N_X)
    ok = rel.valid_x(noisy)
    for x, v in zip(noisy, ok):
        try:
            cfg = rel.from_x(x)
            expected = sp.is_valid(cfg) and np.array_equal(rel.to_x(cfg), x)
        except ValueError:
            expected = False
        assert v == expected, (x, v)
    assert ok.any() and not ok.all()
    assert rel.valid_x(xs).all()


@pytest.mark.parametrize("name", sorted(SPACES))
def test_neighbours_by_row_are_each_rows_own_neighbours(name):
    """One call for many rows (the gradient search's ``flat`` ranking) lists exactly what one call per
    row does, under the row it belongs to; a point next to two rows appears under both."""
    sp, rel = SPACES[name], RELAX[name]
    x0 = rel.to_x(sp.default())[None]
    xs = np.concatenate([x0, rel.neighbours_x(x0)[:6], np.stack([rel.to_x(c) for c in
                                                                 sp.sample_many(np.random.default_rng(8), 5)])])
    pts, row = rel.neighbours_by_row(xs)
    assert pts.shape == (len(row), N_X) and (np.diff(row) >= 0).all()
    for i in range(len(xs)):
        np.testing.assert_array_equal(pts[row == i], rel.neighbours_x(xs[i: i + 1]))
    assert len(np.unique(pts, axis=0)) < len(pts)  # the default is listed under each of its neighbours
    none, rows = rel.neighbours_by_row(np.zeros((0, N_X), np.float32))
    assert none.shape == (0, N_X) and rows.shape == (0,)


def test_unroll_above_the_top_step_builds_the_top_steps_kernel():
    """Valid unroll values above ``MAX_UNROLL_STEP`` (records of older versions) build, featurize and
    encode like the top step; search draws only the steps (benchmarks/unroll_probe.py: gcc took up to
    40x longer on them for no speed)."""
    from codegen.lower import lower
    from codegen.render_c import render
    from felixjax.extract import extract

    sp = Space(dense(1, 640, 200), "gemm_packed", Target(simd_lanes=8))
    top = Config("gemm_packed", ((1, 1, 1, 1), (1, 1, 1, 1), (1, 1, 25, 8), (2, 320)), 1, 8, MAX_UNROLL_STEP)
    big = Config(top.sketch, top.tiles, top.parallel, top.vec, 4 * MAX_UNROLL_STEP)
    sp.validate(big)  # still a valid config
    assert lower(sp, big).unroll == MAX_UNROLL_STEP
    strip = lambda src: [l for l in src.splitlines() if "config:" not in l]  # the header comment names the config
    assert strip(render(lower(sp, big))) == strip(render(lower(sp, top)))
    for a, b in zip(extract(sp, big), extract(sp, top)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    rel = Relaxation(sp)
    assert np.array_equal(rel.to_x(big), rel.to_x(top))
    assert {c.unroll for c in sp.sample_many(np.random.default_rng(0), 200)} <= set(sp.unroll_steps)
    assert max(sp.unroll_steps) == MAX_UNROLL_STEP
