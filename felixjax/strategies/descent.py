"""The gradient search's descent: multi-start Adam on one sketch's relaxed space through a soft objective,
projected onto the space after every step, jitted once per objective and relaxation kind."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from .residual import gp_mean

GRAD_RATIO = 5.0  # penalty gradient is rescaled to this multiple of the objective's (per start)

_COMPILED: dict = {}


def _descent_for(score_fn, rel, steps: int):
    """The jitted descent for one soft objective and relaxation kind (compiled once per process)."""
    key = (id(score_fn), type(rel), steps)
    if key not in _COMPILED:
        _COMPILED[key] = _descent(score_fn, type(rel).penalty_of, type(rel).project_of, steps)
    return _COMPILED[key]


def trust_penalty(x, anchors, mask, radius):
    """``max(0, d² − radius²)`` with ``d`` the (soft) distance from ``x`` to the nearest anchor: zero
    inside the trust region around the measured points, quadratic outside."""
    d2 = jnp.sum((anchors - x) ** 2, axis=-1)
    d2 = jnp.where(mask > 0, d2, 1e6)
    nearest = -0.5 * jax.nn.logsumexp(-d2 / 0.5)  # a soft minimum (temperature 0.5 in squared exponent units)
    return jnp.maximum(nearest - radius ** 2, 0.0)


def _descent(score_fn, penalty, project, steps: int):
    """``jit(params, inputs, rs, x0 [S, N_X], lr, anchors [A, N_X], mask [A], trust, slope, gp) ->
    iterates [steps, S, N_X]``: Adam on ``-(slope · score_fn(params, inputs, x) + gp_mean(x, *gp))``
    (the residual GP's mean: 0 where there is none; plus ``trust = (weight, radius)`` times the
    trust-region penalty around the anchors) and the constraint penalty, projected after every step.
    The model, the task's feature inputs, the relaxed space and the GP are arguments, so one
    compilation serves every task and round."""

    def run(params, inputs, rs, x0, lr, anchors, mask, trust, slope, gp):
        sched = optax.piecewise_constant_schedule(lr, {int(0.3 * steps): 0.2})
        opt = optax.adam(sched)

        def objective(p, i, x):
            return (-(slope * score_fn(p, i, x) + gp_mean(x, *gp))
                    + trust[0] * trust_penalty(x, anchors, mask, trust[1]))

        g_obj_fn = jax.vmap(jax.grad(objective, argnums=2), in_axes=(None, None, 0))
        g_pen_fn = jax.vmap(jax.grad(lambda x: penalty(rs, x)))

        def step(carry, _):
            x, state = carry
            g_obj = g_obj_fn(params, inputs, x)
            g_pen = g_pen_fn(x)
            n_obj = jnp.linalg.norm(g_obj, axis=-1, keepdims=True)
            n_pen = jnp.linalg.norm(g_pen, axis=-1, keepdims=True)
            scale = jnp.where(n_pen > 0, GRAD_RATIO * n_obj / jnp.maximum(n_pen, 1e-12), 1.0)
            g = jnp.nan_to_num(g_obj + scale * g_pen)
            upd, state = opt.update(g, state)
            x = jax.vmap(lambda v: project(rs, v))(x + upd)
            return (x, state), x

        (_, _), traj = jax.lax.scan(step, (x0, opt.init(x0)), None, length=steps)
        return traj

    return jax.jit(run)
