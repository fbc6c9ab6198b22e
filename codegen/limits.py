"""Size limits: refuse absurd workloads with one clear error *before* anything is allocated.

A task of 10^11 channels, a 10^6-cubed matmul or an ONNX input of 1x3x10^6x10^6 would otherwise try
to allocate terabytes (and die of a numpy ``MemoryError`` or the OOM killer) or spend minutes in
integer loops. Every such size is checked here against :class:`Limits`:

==================  =================================  ===============================
limit               default                            environment variable
==================  =================================  ===============================
``max_buffer_bytes``  a quarter of physical RAM          ``FELIXJAX_MAX_BUFFER_BYTES``
``max_total_bytes``   half of physical RAM               ``FELIXJAX_MAX_TOTAL_BYTES``
``max_flops``         1e13 (about a minute of numpy)     ``FELIXJAX_MAX_FLOPS``
``max_extent``        2**31 - 1                          ``FELIXJAX_MAX_EXTENT``
==================  =================================  ===============================

A keyword changes them for one call (``limits=`` on the task factories, ``random_inputs`` and
``reference``), :func:`override` for a block of code. A violation raises :class:`SizeLimitError` (a
``ValueError``) naming what is too large, the limit, and how to raise it.

Example:
    >>> from codegen.ops import matmul
    >>> try:
    ...     matmul(10**6, 10**6, 10**6)
    ... except SizeLimitError as e:
    ...     print(str(e).split(":")[0])
    matmul_1000000x1000000x1000000
    >>> matmul(10**6, 10**6, 10**6, limits={"max_flops": 1e19, "max_buffer_bytes": "inf",
    ...                                     "max_total_bytes": "inf"}).flops
    2000000000000000000
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import os
from typing import Any, Iterable, Iterator, Mapping, Sequence

__all__ = ["ENV_VARS", "Limits", "SizeLimitError", "check_buffers", "check_extent", "check_flops",
           "current", "override", "physical_memory_bytes", "resolve"]

ENV_VARS = {
    "max_buffer_bytes": "FELIXJAX_MAX_BUFFER_BYTES",
    "max_total_bytes": "FELIXJAX_MAX_TOTAL_BYTES",
    "max_flops": "FELIXJAX_MAX_FLOPS",
    "max_extent": "FELIXJAX_MAX_EXTENT",
}
DEFAULT_MAX_FLOPS = 1e13
DEFAULT_MAX_EXTENT = 2**31 - 1
_FALLBACK_RAM = 16 * 2**30


class SizeLimitError(ValueError):
    """A size (buffer bytes, total bytes, FLOPs, an extent) is above its limit. The message names the
    buffer or axis, the size, the limit, and the keyword and environment variable that raise it."""


def physical_memory_bytes() -> int:
    """Physical RAM of this machine in bytes (16 GiB when it cannot be read)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return _FALLBACK_RAM


@dataclasses.dataclass(frozen=True)
class Limits:
    """Upper bounds on workload sizes. ``None`` or ``math.inf`` means unlimited."""

    max_buffer_bytes: float
    max_total_bytes: float
    max_flops: float
    max_extent: float

    @classmethod
    def defaults(cls) -> "Limits":
        """The built-in defaults (no environment variables), from this machine's RAM."""
        ram = physical_memory_bytes()
        return cls(ram // 4, ram // 2, DEFAULT_MAX_FLOPS, DEFAULT_MAX_EXTENT)

    @classmethod
    def from_env(cls) -> "Limits":
        """Defaults overridden by the ``FELIXJAX_MAX_*`` environment variables."""
        base = cls.defaults()
        changes = {}
        for field, var in ENV_VARS.items():
            raw = os.environ.get(var)
            if raw is None or not raw.strip():
                continue
            changes[field] = _parse_value(raw, f"environment variable {var}")
        return dataclasses.replace(base, **changes)

    def replace(self, **changes: Any) -> "Limits":
        unknown = set(changes) - set(ENV_VARS)
        if unknown:
            raise TypeError(f"unknown limit {sorted(unknown)[0]!r}; limits are {', '.join(ENV_VARS)}")
        return dataclasses.replace(self, **{k: _parse_value(v, f"limit {k}") for k, v in changes.items()})


def _parse_value(v: Any, what: str) -> float:
    if v is None:
        return math.inf
    if isinstance(v, str):
        s = v.strip().lower()
        if s in ("inf", "none", "unlimited"):
            return math.inf
        try:
            v = float(s)
        except ValueError:
            raise ValueError(f"{what}={v!r} is not a number (use e.g. 8e9, or 'inf' for no limit)") from None
    try:
        v = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{what}={v!r} is not a number") from None
    if math.isnan(v) or v <= 0:
        raise ValueError(f"{what}={v!r} must be positive (or 'inf' for no limit)")
    return v


_override: contextvars.ContextVar[Limits | None] = contextvars.ContextVar("felixjax_limits", default=None)


def current() -> Limits:
    """The limits in force: an :func:`override` block's, else the environment's, else the defaults."""
    o = _override.get()
    return o if o is not None else Limits.from_env()


def resolve(limits: Limits | Mapping[str, Any] | None = None) -> Limits:
    """``limits`` as a :class:`Limits`: a mapping changes only the fields it names of :func:`current`."""
    if limits is None:
        return current()
    if isinstance(limits, Limits):
        return limits
    if isinstance(limits, Mapping):
        return current().replace(**dict(limits))
    raise TypeError(f"limits must be a Limits, a dict of limits or None, got {type(limits).__name__}")


@contextlib.contextmanager
def override(limits: Limits | Mapping[str, Any] | None = None, **changes: Any) -> Iterator[Limits]:
    """Use other limits inside a ``with`` block (this thread / task only).

    Example:
        >>> from codegen.ops import matmul
        >>> with override(max_flops="inf", max_buffer_bytes="inf", max_total_bytes="inf"):
        ...     matmul(10**6, 10**6, 10**6).name
        'matmul_1000000x1000000x1000000'
    """
    if limits is None and not changes:  # nothing to change: keep the limits in force
        yield current()
        return
    lim = resolve(limits)
    if changes:
        lim = lim.replace(**changes)
    token = _override.set(lim)
    try:
        yield lim
    finally:
        _override.reset(token)


# ----------------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------------

def _how(field: str) -> str:
    return f"raise it with limits={{'{field}': ...}} or the environment variable {ENV_VARS[field]}"


def _fmt_bytes(n: float) -> str:
    if math.isinf(n):
        return "unlimited"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} bytes"


def check_extent(name: str, value: int, limits: Limits | Mapping[str, Any] | None = None, *,
                 what: str = "") -> None:
    """Raise :class:`SizeLimitError` if one dimension / loop extent is above ``max_extent``."""
    lim = resolve(limits)
    if value > lim.max_extent:
        prefix = f"{what}: " if what else ""
        raise SizeLimitError(f"{prefix}{name} = {value} is larger than the maximum extent {lim.max_extent:.0f} "
                             f"({_how('max_extent')})")


def check_flops(flops: int | float, limits: Limits | Mapping[str, Any] | None = None, *, what: str = "") -> None:
    """Raise :class:`SizeLimitError` if a workload's floating-point operations exceed ``max_flops``."""
    lim = resolve(limits)
    if flops > lim.max_flops:
        prefix = f"{what}: " if what else ""
        raise SizeLimitError(f"{prefix}{float(flops):.3g} FLOPs exceed the limit {lim.max_flops:.3g} "
                             f"({_how('max_flops')})")


def check_buffers(buffers: Mapping[str, Sequence[int]] | Iterable[tuple[str, Sequence[int]]],
                  limits: Limits | Mapping[str, Any] | None = None, *, itemsize: int = 4, what: str = "") -> int:
    """Check named buffer shapes (each ``itemsize`` bytes per element) against ``max_extent``,
    ``max_buffer_bytes`` and, together, ``max_total_bytes``. Returns the total bytes.

    Negative dimensions raise a plain ``ValueError``. Products are exact Python integers, so a
    shape like (10**6,) * 6 is reported, not overflowed.
    """
    lim = resolve(limits)
    items = list(buffers.items()) if isinstance(buffers, Mapping) else list(buffers)
    prefix = f"{what}: " if what else ""
    total = 0
    for name, shape in items:
        dims = [int(d) for d in shape]
        if any(d < 0 for d in dims):
            raise ValueError(f"{prefix}{name} has a negative dimension {tuple(dims)}")
        for d in dims:
            check_extent(f"a dimension of {name} {tuple(dims)}", d, lim, what=what)
        nbytes = math.prod(dims) * int(itemsize)
        if nbytes > lim.max_buffer_bytes:
            raise SizeLimitError(f"{prefix}{name} of shape {tuple(dims)} needs {_fmt_bytes(nbytes)}, more than the "
                                 f"per-buffer limit {_fmt_bytes(lim.max_buffer_bytes)} "
                                 f"({_how('max_buffer_bytes')})")
        total += nbytes
    if total > lim.max_total_bytes:
        raise SizeLimitError(f"{prefix}its buffers ({', '.join(n for n, _ in items)}) need {_fmt_bytes(total)} in "
                             f"all, more than the limit {_fmt_bytes(lim.max_total_bytes)} ({_how('max_total_bytes')})")
    return total
