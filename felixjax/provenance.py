"""What a tuning run was started with, kept in its database: the seed, the strategy and its options, the
candidates per round, the sketches left out, the cost model, the cost-aware options, whether the defaults were measured
first, and the versions of felixjax, jax, flax, optax and numpy (the target's JSON in every record already
names the CPU and the compiler). Written when a run starts (no record of it yet; ``Database.run_settings`` reads
it back); a call that resumes the run with other settings warns, since the run's history then mixes two
searches (session 79, a reproducibility review: a run resumed with another seed or batch size was accepted
silently; only another strategy is refused).

Example:
    >>> from felixjax.database import Database
    >>> db = Database(":memory:")
    >>> s = run_settings("genetic", 0, {"batch_size": 16}, session_cost_model=None, defaults=True, model_seed=None,
    ...                  batch=16)
    >>> keep_settings(db, "settings:t:k:genetic:0", s, resumed=False, what="run 'genetic:0'")
    >>> json.loads(db.get_meta("settings:t:k:genetic:0"))["options"]
    {'batch_size': 16}
"""
from __future__ import annotations

import inspect
import json
import sys
import time
import warnings
from functools import lru_cache
from typing import Any

#: the settings whose change makes a resumed run's history mix two searches (versions are provenance only)
COMPARED = ("strategy", "seed", "options", "batch", "excluded_sketches", "session_cost_model", "defaults",
            "model_seed", "cost_aware")


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: numbers, strings, booleans, None, lists and string-keyed dicts as they
    are, anything else (a cost-model object, an array, a function) as ``"<TypeName>"``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # a numpy scalar
        return jsonable(value.item())
    return f"<{type(value).__name__}>"


def effective_options(strategy: Any, options: dict | None, *, by_name: bool) -> dict:
    """The options of a strategy instance as its constructor takes them. Made by name (``by_name``): the
    constructor's defaults, overridden by ``options`` (so ``{}`` and ``{"population": <the default>}`` are the
    same settings; attributes are not read: ``__init__`` turns some into values of this machine, e.g. a worker
    count). An object (``fj.compare``'s, a user's): the constructor's parameters it holds as attributes of the
    same name."""
    options = dict(options or {})
    try:
        params = [p for p in inspect.signature(type(strategy)).parameters.values()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):  # a class without an inspectable constructor
        return options
    if by_name:
        return {p.name: p.default for p in params if p.default is not p.empty} | options
    return {p.name: getattr(strategy, p.name) for p in params if hasattr(strategy, p.name)} | options


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside felixjax (the user's call), as seen from keep_settings."""
    level, frame = 2, sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "felixjax":
        level, frame = level + 1, frame.f_back
    return level


@lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    """Installed versions of felixjax and the libraries its searches depend on (``""``: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("felixjax", "jax", "flax", "optax", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = ""
    return out


def run_settings(strategy: str, seed: int, options: dict | None, *, session_cost_model: Any, defaults: bool,
                 model_seed: Any, batch: int | None = None, excluded: Any = (), cost_aware: Any = None) -> dict:
    """The settings record of a run (see the module docstring); ``batch``: candidates per round; ``excluded``:
    sketches the run may not propose; ``cost_aware``: its :class:`~felixjax.cost_aware.CostAware` options (None
    when off; session 80: a resume with another filter or early stop was silent)."""
    on = cost_aware is not None and cost_aware.enabled
    return {"strategy": strategy, "seed": int(seed), "options": jsonable(dict(options or {})), "batch": jsonable(batch),
            "excluded_sketches": sorted(excluded),
            "cost_aware": jsonable(dict(vars(cost_aware))) if on else None,
            "session_cost_model": jsonable(session_cost_model), "defaults": bool(defaults),
            "model_seed": jsonable(model_seed), "versions": versions(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _differing(value: Any, other: Any) -> Any:
    """``value``, or for two dicts only its entries that differ from ``other``'s (options hold ~20 keys), a key
    only ``other`` has as ``"<unset>"``."""
    if isinstance(value, dict) and isinstance(other, dict):
        return {k: value.get(k, "<unset>") for k in sorted(set(value) | set(other))
                if value.get(k, "<unset>") != other.get(k, "<unset>")}
    return value


def keep_settings(db, key: str, settings: dict, *, resumed: bool, what: str) -> None:
    """Store ``settings`` for a run started now (no record of it yet: settings of a call that measured nothing
    are replaced); for a resumed run, warn where the stored ones differ (a run of a database older than this
    record has none: nothing is said or stored, its start is not known)."""
    if not resumed:
        db.set_meta(key, json.dumps(settings, sort_keys=True))
        return
    before = db.get_meta(key)
    if before is None:
        return
    try:
        was = json.loads(before)
    except ValueError:
        return
    changed = [k for k in COMPARED if k in was and was[k] != settings.get(k)]
    if changed:
        then = ", ".join(f"{k}={_differing(was[k], settings.get(k))!r}" for k in changed)
        now = ", ".join(f"{k}={_differing(settings.get(k), was[k])!r}" for k in changed)
        warnings.warn(f"{what} was started with {then}; this call continues it with {now}: its history now mixes "
                      f"both searches (give another run name, run=..., to keep them apart)", RuntimeWarning,
                      stacklevel=_caller_level())
