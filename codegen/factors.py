"""Number theory of tile sizes: factorizations of an extent into ordered factors (counting,
enumerating, uniform sampling) and divisors. Re-exported by :mod:`codegen.space`.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterator
from functools import lru_cache

import numpy as np


def whole(x: object) -> bool:
    """Whether ``x`` is an integer (numpy's included; not a bool, not a float such as 2.0)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def as_whole(x: object, what: str = "value") -> int:
    """``x`` as an int if it is a whole number (a JSON 2 or 2.0; a stored ``true`` as 1: a record an older version
    wrote stays readable); a ValueError for 2.5 or "2"."""
    if isinstance(x, numbers.Integral) or isinstance(x, float) and x.is_integer():
        return int(x)
    raise ValueError(f"{what} {x!r} is not an integer")


@lru_cache(maxsize=4096)
def factorize(n: int) -> tuple[tuple[int, int], ...]:
    """Prime factorization as ``((p, e), ...)`` ascending. ``factorize(1) == ()``.

    Trial division by 2, then odd numbers up to sqrt(n): at most ~23k steps for any extent below
    2**31 (the default ``codegen.limits`` bound), a few milliseconds.

    Example:
        >>> factorize(1000), factorize(2**31 - 1)
        (((2, 3), (5, 3)), ((2147483647, 1),))
    """
    n = int(n)
    if n < 1:
        raise ValueError(f"factorize: n must be >= 1, got {n}")
    out = []
    d = 2
    while d * d <= n:
        e = 0
        while n % d == 0:
            n //= d
            e += 1
        if e:
            out.append((d, e))
        d += 1 if d == 2 else 2
    if n > 1:
        out.append((n, 1))
    return tuple(out)


@lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    """All divisors of ``n``, ascending, built from its factorization (never a scan up to ``n``).

    Example:
        >>> divisors(12), len(divisors(2**30))
        ((1, 2, 3, 4, 6, 12), 31)
    """
    divs = [1]
    for p, e in factorize(n):
        divs = [d * p**k for d in divs for k in range(e + 1)]
    return tuple(sorted(divs))


@lru_cache(maxsize=4096)
def largest_divisor_leq(n: int, cap: int, multiple_of: int = 1) -> int:
    """The largest divisor of ``n`` that is at most ``cap`` and a multiple of ``multiple_of`` (1 if none).

    Example:
        >>> largest_divisor_leq(32, 12), largest_divisor_leq(96, 32, 16), largest_divisor_leq(7, 4)
        (8, 32, 1)
    """
    best = 1
    for d in divisors(n):
        if d <= cap and d % multiple_of == 0:
            best = max(best, d)
    return best


def count_factorizations(n: int, levels: int) -> int:
    """Number of ordered ways to write ``n`` as a product of ``levels`` positive integers."""
    return math.prod(math.comb(e + levels - 1, levels - 1) for _, e in factorize(n))


def _compositions(e: int, parts: int) -> Iterator[tuple[int, ...]]:
    if parts == 1:
        yield (e,)
        return
    for first in range(e + 1):
        for rest in _compositions(e - first, parts - 1):
            yield (first,) + rest


def factorizations(n: int, levels: int) -> Iterator[tuple[int, ...]]:
    """All ordered factorizations of ``n`` into ``levels`` factors."""
    per_prime = [[tuple(p ** x for x in comp) for comp in _compositions(e, levels)] for p, e in factorize(n)]

    def rec(i: int, acc: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        if i == len(per_prime):
            yield acc
            return
        for f in per_prime[i]:
            yield from rec(i + 1, tuple(a * b for a, b in zip(acc, f)))

    yield from rec(0, (1,) * levels)


def _random_composition(rng: np.random.Generator, e: int, parts: int) -> list[int]:
    # stars and bars: a uniform random composition of e into `parts` non-negative parts
    bars = np.sort(rng.choice(e + parts - 1, size=parts - 1, replace=False))
    edges = np.concatenate([[-1], bars, [e + parts - 1]])
    return list(np.diff(edges) - 1)


def random_factorization(rng: np.random.Generator, n: int, levels: int) -> tuple[int, ...]:
    """A uniformly random ordered factorization of ``n`` into ``levels`` factors."""
    out = [1] * levels
    for p, e in factorize(n):
        for lvl, x in enumerate(_random_composition(rng, e, levels)):
            out[lvl] *= p ** int(x)
    return tuple(out)
