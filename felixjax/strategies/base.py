"""The search-strategy interface and the registry of strategies by name.

A strategy proposes candidate configs for one task and learns from measured results. It sees a
:class:`SearchContext` (the task's spaces, a seeded RNG, the run's measured records) and returns
configs; the tuner builds, measures and records them, then calls :meth:`Strategy.update`.
Users may pass their own object with the same two methods anywhere a strategy name is accepted.

Example:
    >>> from felixjax.strategies import get_strategy
    >>> get_strategy("random").name
    'random'
"""
from __future__ import annotations

import inspect
from typing import Callable, Protocol, runtime_checkable

import numpy as np

from codegen.space import Config, default_sketch

from ..context import SearchContext


@runtime_checkable
class Strategy(Protocol):
    """``propose(ctx, n)`` returns up to ``n`` new valid configs; ``update(ctx, records)`` learns."""

    name: str

    def propose(self, ctx: SearchContext, n: int) -> list[Config]: ...

    def update(self, ctx: SearchContext, records: list) -> None: ...


_REGISTRY: dict[str, Callable[..., Strategy]] = {}


def register(name: str, *, replace: bool = False) -> Callable:
    """Class decorator: make a strategy constructible by name. A class's ``name`` attribute, where it has
    one, must be ``name`` (runs are stored as ``<strategy.name>:<seed>``). Registering a name again replaces
    a user's strategy (a notebook cell run twice); a built-in one only with ``replace=True``."""
    if not isinstance(name, str) or not name or ":" in name or "@" in name:
        raise ValueError(f"strategy name {name!r}: a non-empty string without ':' or '@'")

    def deco(factory: Callable[..., Strategy]) -> Callable[..., Strategy]:
        if not getattr(factory, "__module__", "").startswith(f"{__package__}."):
            _load_builtins()  # first: a built-in imported later would overwrite the user's (a review, session 82)
        own = getattr(factory, "name", name) if isinstance(factory, type) else name
        if isinstance(own, str) and own != name:
            raise ValueError(f"register({name!r}) on {factory.__name__}, whose name is {own!r}: its runs would be "
                             f"stored as {own!r}; give both the same name")
        old = _REGISTRY.get(name)
        if old is not None and old is not factory and not replace and \
                getattr(old, "__module__", "").startswith(f"{__package__}.") and \
                not getattr(factory, "__module__", "").startswith(f"{__package__}."):
            raise ValueError(f"{name!r} is a built-in strategy; register(..., replace=True) to replace it")
        _REGISTRY[name] = factory
        return factory

    return deco


BUILTIN = ("random", "genetic", "gradient")  # modules of this package that register a strategy on import


def _load_builtins() -> None:
    """Import the built-in strategy modules (their registration side effect); a missing one is skipped, so a
    strategy under construction never breaks the others."""
    import importlib

    for mod in BUILTIN:
        try:
            importlib.import_module(f"{__package__}.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.{mod}":
                raise


def registered() -> list[str]:
    """Names of the registered strategies (a built-in module that is missing or registers nothing is
    skipped, so a strategy under construction never breaks the others)."""
    _load_builtins()
    return sorted(_REGISTRY)


def get_strategy(strategy: str | Strategy, **kwargs) -> Strategy:
    """A strategy instance from a registered name or a user object (returned as is)."""
    if not isinstance(strategy, str):
        if not isinstance(strategy, Strategy):
            raise TypeError(f"{strategy!r} is not a strategy: it needs a name, propose(ctx, n) and update(ctx, recs)")
        if kwargs:  # they would be dropped: the instance is already built
            raise ValueError(f"options {sorted(kwargs)} apply to a strategy given by name; set them on the "
                             f"{type(strategy).__name__} instance instead")
        return strategy
    names = registered()
    if strategy not in _REGISTRY:
        raise ValueError(f"unknown strategy {strategy!r}; registered: {', '.join(names)}")
    cls = _REGISTRY[strategy]
    params = inspect.signature(cls).parameters.values()
    known = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    # a class attribute batch_size (random's) is an option too, as ``random@32`` sets it
    set_batch = ("batch_size" not in known and isinstance(getattr(cls, "batch_size", None), int)
                 and not any(p.kind is p.VAR_KEYWORD for p in params))  # (**options: the constructor takes it)
    unknown = sorted(set(kwargs) - set(known) - ({"batch_size"} if set_batch else set()))
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in params):
        raise ValueError(f"strategy {strategy!r} has no option {', '.join(map(repr, unknown))}; its options: "
                         f"{', '.join(known + ['batch_size'] * set_batch) or 'none'}")
    if "batch_size" in kwargs:
        count_option("batch_size", kwargs["batch_size"])  # (2.5 ran at 2)
    batch = kwargs.pop("batch_size") if set_batch and "batch_size" in kwargs else None
    made = cls(**kwargs)
    if batch is not None:
        made.batch_size = int(batch)
    if not isinstance(getattr(made, "name", None), str):  # runs are stored as <name>:<seed>
        raise TypeError(f"strategy {strategy!r} ({getattr(cls, '__name__', cls)}) has no name: give the class "
                        f"name = {strategy!r}")
    return made


def count_option(name: str, value: object, least: int = 1) -> int:
    """A strategy's count option as an int: a whole number >= ``least`` (a JSON ``4.0`` too); a ValueError
    naming it for 2.5, '8', True, inf or NaN (each ran as something else, or failed mid-run)."""
    integral = isinstance(value, (int, np.integer)) or isinstance(value, float) and value.is_integer()
    if isinstance(value, (bool, np.bool_)) or not integral or value < least:
        raise ValueError(f"{name} must be an integer >= {least} (got {value!r})")
    return int(value)


def fresh(ctx: SearchContext, configs, limit: int) -> list[Config]:
    """Dedupe ``configs`` (order kept) against each other and the run's measured set; at most ``limit``."""
    out, seen = [], set(ctx.measured)
    for c in configs:
        if c not in seen:
            seen.add(c)
            out.append(c)
            if len(out) >= limit:
                break
    return out


def opening_defaults(ctx: SearchContext, n: int) -> list[Config]:
    """The first round's head start: every sketch's hand-written default schedule
    (:meth:`~codegen.space.Space.default`), at most ``n``, on a run with no record yet; the default
    sketch's first (:func:`~codegen.space.default_sketch`: the schedule an untuned network build runs,
    so a budget of one trial measures it), then the others by name.

    The tuning loops (``fj.tune``, ``fj.compare``) measure these before the strategy's proposals,
    whatever the strategy, so no run ends worse than the untuned default and comparisons stay
    apples to apples.
    """
    if ctx.history:
        return []
    out = []
    try:
        first = default_sketch(ctx.task, ctx.target).name
        if first not in ctx.spaces:  # a run without Winograd: what a build without it runs untuned
            first = default_sketch(ctx.task, ctx.target, winograd=False).name
    except (ValueError, KeyError, AttributeError):  # no CPU sketch applies (a GPU target's spaces)
        first = None
    for name in sorted(ctx.spaces, key=lambda name: (name != first, name)):
        try:
            cfg = ctx.spaces[name].default()
        except ValueError:  # a space whose default cannot be built: the strategy alone proposes
            continue
        if cfg not in ctx.measured:
            out.append(cfg)
    return out[:n]


def cost_model_options(strategy: str, cost_model: str | None) -> dict | None:
    """``strategy_options`` that start a learned strategy from a pretrained cost model (``None``: the
    strategy's default, ``"auto"``; ``"none"``: no pretrained model, the roofline prior first)."""
    if cost_model is None:
        return None
    if strategy not in COST_MODEL_STRATEGIES:
        raise ValueError(f"--cost-model needs a strategy with a cost model ({', '.join(COST_MODEL_STRATEGIES)}), "
                         f"not {strategy!r}")
    return {"cost_model": None if cost_model == "none" else cost_model}


COST_MODEL_STRATEGIES = ("gradient", "genetic")


def interleave(first, second, share: float, k: int) -> list:
    """Up to ``k`` distinct items from two rankings of the same items, best first: a ``share`` of
    them taken in ``first``'s order and the rest in ``second``'s, alternating so that every prefix
    keeps that share (the pessimism hedge of both learned strategies).

    Example:
        >>> interleave([1, 2, 3, 4], [4, 3, 2, 1], 0.5, 4)
        [1, 4, 2, 3]
    """
    orders, out, seen, pos, taken = (list(first), list(second)), [], set(), [0, 0], 0
    for _ in range(min(k, len(orders[0]))):
        side = 0 if taken < share * (len(out) + 1) - 1e-9 else 1  # ``first`` opens
        while orders[side][pos[side]] in seen:  # both hold every item: one not yet taken is left
            pos[side] += 1
        seen.add(orders[side][pos[side]])
        out.append(orders[side][pos[side]])
        taken += side == 0
    return out


def spread_picks(order: np.ndarray, xs: np.ndarray, sketch: list, k: int, radius: float) -> np.ndarray:
    """The first ``k`` of ``order`` (pool rows, best first) that lie farther than ``radius`` (L1, integer
    points ``xs``) from every earlier pick of their sketch; when those run out, the skipped rows in
    ``order``. ``radius`` 0: ``order[:k]``."""
    if radius <= 0 or k <= 0:
        return order[:k]
    picked: list = []
    near: list = []
    by_sketch: dict = {}  # sketch -> the picked rows' points
    for i in order:
        if len(picked) >= k:
            break
        pts = by_sketch.get(sketch[i])
        if pts and np.abs(np.asarray(pts) - xs[i]).sum(axis=1).min() <= radius:
            near.append(i)
            continue
        picked.append(i)
        by_sketch.setdefault(sketch[i], []).append(xs[i])
    return np.asarray(picked + near[: k - len(picked)], np.int64)
