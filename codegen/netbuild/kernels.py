"""The table of generic C kernels the whole-network build emits for untuned ops: the base cheap ops
(``cheap_ops``) merged with the ops real exporters add (``more_ops``). ``emission`` and the package read
:data:`CHEAP_OPS`, :data:`_RENDERERS` and :data:`_PRELUDE` from here (cheap_ops <- more_ops <- kernels,
no cycle)."""
from __future__ import annotations

from collections.abc import Callable

from ..render_c import _Writer
from . import cheap_ops
from .cheap_ops import _Ctx
from .more_ops import MORE_PRELUDE, MORE_RENDERERS

_PRELUDE: str = cheap_ops._PRELUDE + MORE_PRELUDE
_RENDERERS: dict[str, Callable[[_Ctx, _Writer], None]] = {**cheap_ops._RENDERERS, **MORE_RENDERERS}
CHEAP_OPS: tuple[str, ...] = cheap_ops.CHEAP_OPS + tuple(op for op in MORE_RENDERERS
                                                   if op not in cheap_ops.CHEAP_OPS)
assert set(_RENDERERS) == set(CHEAP_OPS)
