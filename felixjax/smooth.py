"""Smoothing: the one place where the features' non-differentiable operations live (DESIGN.md ⑤).

Every ceil, floor, min, max, comparison, equality and select in :mod:`felixjax.features` goes
through a :class:`Smooth`. It has two modes:

* **hard** (``Smooth.hard_mode()``): the exact operation. At integer schedules the features then
  equal those of the emitted program (checked against :mod:`felixjax.extract`).
* **soft** (``Smooth.soft(temperature)``): a differentiable surrogate for gradient descent.
  Comparisons become the algebraic sigmoid ``σ(t) = t / (2√(t² + 1)) + ½`` of a log ratio divided
  by the temperature, equality a hump ``1/√(t² + 1)``, min/max an algebraic smooth min/max,
  floordiv a division and ceildiv the expected ceiling ``(a + b − 1) / b`` (the mean number of
  ``b``-element lines that a run of ``a`` elements touches at a random alignment). As the
  temperature falls to 0 every soft operation converges to its hard one (ceil and floor are blended
  with their exact value by ``min(temperature, 1)``).

``Smooth`` is a pytree whose mode is static (part of the tree structure) and whose temperature is a
leaf, so ``jax.jit`` compiles once per mode and never per temperature.

Example:
    >>> import jax.numpy as jnp
    >>> hard, soft = Smooth.hard_mode(), Smooth.soft(1.0)
    >>> float(hard.lt(2.0, 3.0)), round(float(soft.lt(2.0, 3.0)), 3)
    (1.0, 0.688)
    >>> float(hard.ceil_div(17.0, 16.0)), float(soft.ceil_div(17.0, 16.0))
    (2.0, 2.0)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

# |t| beyond this saturates σ and the hump to within 1e-12 of their limits; keeps t² finite in f32.
_T_CLIP = 1e6
# soft temperatures below this are treated as this (division by the temperature stays finite).
_MIN_TEMPERATURE = 1e-6


@jax.custom_jvp
def algebraic_sigmoid(t: jax.Array) -> jax.Array:
    """``σ(t) = t / (2√(t² + 1)) + ½``: a sigmoid with polynomial tails (Felix's choice).

    Example:
        >>> float(algebraic_sigmoid(0.0)), round(float(algebraic_sigmoid(1.0)), 4)
        (0.5, 0.8536)
    """
    t = jnp.clip(t, -_T_CLIP, _T_CLIP)
    return 0.5 + 0.5 * t * jax.lax.rsqrt(1.0 + t * t)


@algebraic_sigmoid.defjvp
def _algebraic_sigmoid_jvp(primals, tangents):
    # dσ/dt = ½ (1 + t²)^(-3/2), written with rsqrt so it stays finite for large |t|.
    (t,), (dt,) = primals, tangents
    tc = jnp.clip(t, -_T_CLIP, _T_CLIP)
    r = jax.lax.rsqrt(1.0 + tc * tc)
    return algebraic_sigmoid(t), 0.5 * r * r * r * dt


@jax.custom_jvp
def hump(t: jax.Array) -> jax.Array:
    """``1 / √(t² + 1)``: 1 at ``t = 0``, falling to 0 on both sides (soft equality).

    Example:
        >>> float(hump(0.0)), round(float(hump(1.0)), 4)
        (1.0, 0.7071)
    """
    t = jnp.clip(t, -_T_CLIP, _T_CLIP)
    return jax.lax.rsqrt(1.0 + t * t)


@hump.defjvp
def _hump_jvp(primals, tangents):
    # d/dt (1 + t²)^(-1/2) = −t (1 + t²)^(-3/2)
    (t,), (dt,) = primals, tangents
    tc = jnp.clip(t, -_T_CLIP, _T_CLIP)
    r = jax.lax.rsqrt(1.0 + tc * tc)
    return hump(t), -tc * r * r * r * dt


@jax.tree_util.register_pytree_node_class
@dataclass(frozen=True)
class Smooth:
    """Hard or soft versions of the non-smooth operations the features use.

    Attributes:
        hard: exact operations (static: part of the pytree structure).
        temperature: soft mode's sharpness (a pytree leaf, so it can change without recompiling).
            Comparisons act on log ratios divided by it; min/max use it as an absolute width.
    """

    hard: bool = True
    temperature: Any = 1.0

    # ---- construction / pytree -------------------------------------------------------------------
    @staticmethod
    def hard_mode() -> Smooth:
        """Exact operations.

        Example:
            >>> Smooth.hard_mode().hard
            True
        """
        return Smooth(True, 0.0)

    @staticmethod
    def soft(temperature: float = 1.0) -> Smooth:
        """Differentiable surrogates at the given temperature (> 0).

        Example:
            >>> Smooth.soft(0.5).temperature
            0.5
        """
        return Smooth(False, temperature)

    def tree_flatten(self):
        return (self.temperature,), self.hard

    @classmethod
    def tree_unflatten(cls, hard, children):
        return cls(hard, children[0])

    @property
    def _tau(self) -> jax.Array:
        return jnp.maximum(jnp.asarray(self.temperature, jnp.float32), _MIN_TEMPERATURE)

    @property
    def _blend(self) -> jax.Array:
        """Weight of the smooth surrogate in ceil/floor: 1 at temperature ≥ 1, → 0 as it → 0."""
        return jnp.clip(jnp.asarray(self.temperature, jnp.float32), 0.0, 1.0)

    # ---- comparisons -----------------------------------------------------------------------------
    def step(self, d: jax.Array) -> jax.Array:
        """``[d > 0]``; soft: ``σ(d / temperature)``. ``d`` is a difference or a log ratio.

        Example:
            >>> float(Smooth.hard_mode().step(-0.1)), float(Smooth.soft(1.0).step(0.0))
            (0.0, 0.5)
        """
        if self.hard:
            return (jnp.asarray(d) > 0).astype(jnp.float32)
        return algebraic_sigmoid(d / self._tau)

    def lt(self, a: jax.Array, b: jax.Array) -> jax.Array:
        """``[a < b]`` for positive ``a``, ``b``; soft: ``σ(log(b / a) / temperature)``.

        Example:
            >>> float(Smooth.hard_mode().lt(3.0, 2.0))
            0.0
        """
        if self.hard:
            return (jnp.asarray(a) < b).astype(jnp.float32)
        return self.step(jnp.log(b) - jnp.log(a))

    def le(self, a: jax.Array, b: jax.Array) -> jax.Array:
        """``[a ≤ b]`` for positive ``a``, ``b`` (soft: as :meth:`lt`).

        Example:
            >>> float(Smooth.hard_mode().le(2.0, 2.0))
            1.0
        """
        if self.hard:
            return (jnp.asarray(a) <= b).astype(jnp.float32)
        return self.step(jnp.log(b) - jnp.log(a))

    def gt(self, a: jax.Array, b: jax.Array) -> jax.Array:
        """``[a > b]`` for positive ``a``, ``b``.

        Example:
            >>> float(Smooth.hard_mode().gt(3.0, 2.0))
            1.0
        """
        return self.lt(b, a)

    def ge(self, a: jax.Array, b: jax.Array) -> jax.Array:
        """``[a ≥ b]`` for positive ``a``, ``b``.

        Example:
            >>> float(Smooth.hard_mode().ge(2.0, 2.0))
            1.0
        """
        return self.le(b, a)

    def eq(self, a: jax.Array, b: jax.Array) -> jax.Array:
        """``[a == b]`` for positive ``a``, ``b``; soft: ``hump(log(a / b) / temperature)``.

        Example:
            >>> float(Smooth.hard_mode().eq(4.0, 4.0)), round(float(Smooth.soft(1.0).eq(2.0, 1.0)), 3)
            (1.0, 0.822)
        """
        if self.hard:
            return (jnp.asarray(a) == b).astype(jnp.float32)
        return hump((jnp.log(a) - jnp.log(b)) / self._tau)

    @staticmethod
    def select(c: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
        """``a if c else b`` as ``c·(a − b) + b`` (exact when ``c`` is 0 or 1).

        Example:
            >>> float(Smooth.select(0.25, 8.0, 4.0))
            5.0
        """
        return c * (a - b) + b

    # ---- min / max ---------------------------------------------------------------------------------
    def maximum(self, a: jax.Array, b: jax.Array) -> jax.Array:
        """``max(a, b)``; soft: ``(a + b + √((a − b)² + τ²)) / 2``.

        Example:
            >>> float(Smooth.hard_mode().maximum(1.0, 3.0)), float(Smooth.soft(2.0).maximum(1.0, 1.0))
            (3.0, 2.0)
        """
        if self.hard:
            return jnp.maximum(a, b)
        d = a - b
        return 0.5 * (a + b + jnp.sqrt(d * d + self._tau ** 2))

    def minimum(self, a: jax.Array, b: jax.Array) -> jax.Array:
        """``min(a, b)``; soft: ``(a + b − √((a − b)² + τ²)) / 2``.

        Example:
            >>> float(Smooth.hard_mode().minimum(1.0, 3.0))
            1.0
        """
        if self.hard:
            return jnp.minimum(a, b)
        d = a - b
        return 0.5 * (a + b - jnp.sqrt(d * d + self._tau ** 2))

    def relu(self, a: jax.Array) -> jax.Array:
        """``max(a, 0)``.

        Example:
            >>> float(Smooth.hard_mode().relu(-2.0))
            0.0
        """
        return self.maximum(a, jnp.zeros_like(a))

    # ---- integer division and rounding ---------------------------------------------------------------
    def ceil_div(self, a: jax.Array, b: jax.Array) -> jax.Array:
        """``⌈a / b⌉``; soft: ``(a + b − 1) / b`` (blended with the exact value below temperature 1).

        Example:
            >>> float(Smooth.hard_mode().ceil_div(20.0, 16.0)), float(Smooth.soft(1.0).ceil_div(20.0, 16.0))
            (2.0, 2.1875)
        """
        exact = jnp.ceil(a / b)
        if self.hard:
            return exact
        return self.select(self._blend, (a + b - 1.0) / b, exact)

    def floor_div(self, a: jax.Array, b: jax.Array) -> jax.Array:
        """``⌊a / b⌋``; soft: ``a / b`` (blended with the exact value below temperature 1).

        Example:
            >>> float(Smooth.hard_mode().floor_div(20.0, 16.0)), float(Smooth.soft(1.0).floor_div(20.0, 16.0))
            (1.0, 1.25)
        """
        exact = jnp.floor(a / b)
        if self.hard:
            return exact
        return self.select(self._blend, a / b, exact)

    def integer(self, v: jax.Array) -> jax.Array:
        """Snap a value that is an integer at integer schedules: ``round`` (hard), identity (soft).

        Hard mode computes tile products as ``exp(Σ x log p)``; rounding removes the float error
        before it reaches a ceil or a comparison.

        Example:
            >>> float(Smooth.hard_mode().integer(7.9999995)), float(Smooth.soft().integer(7.5))
            (8.0, 7.5)
        """
        return jnp.round(v) if self.hard else v

    def ramp(self, d: jax.Array) -> jax.Array:
        """``clip(d, 0, 1)``: linear interpolation of a depth knob; hard mode rounds ``d`` first.

        Exact at integer ``d`` in both modes (used for "loop ``i`` is fused" given a parallel depth).

        Example:
            >>> float(Smooth.soft().ramp(0.25)), float(Smooth.hard_mode().ramp(0.75))
            (0.25, 1.0)
        """
        if self.hard:
            d = jnp.round(d)
        return jnp.clip(d, 0.0, 1.0)
