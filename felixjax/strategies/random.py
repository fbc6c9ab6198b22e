"""Random search: uniform valid sampling (sketch uniform, then a config uniform within it)."""
from __future__ import annotations

from .base import SearchContext, fresh, register


@register("random")
class RandomSearch:
    """Propose uniformly random valid configs never measured before in this run.

    Example:
        >>> RandomSearch().name
        'random'
    """

    name = "random"
    batch_size = 16

    def propose(self, ctx: SearchContext, n: int) -> list:
        names = sorted(ctx.spaces)
        draws = []
        for _ in range(50):  # a few passes are plenty unless the space is nearly exhausted
            for _ in range(n):
                sp = ctx.spaces[names[int(ctx.rng.integers(len(names)))]]
                draws.append(sp.sample(ctx.rng))
            out = fresh(ctx, draws, n)
            if len(out) >= n:
                return out
        return out

    def update(self, ctx: SearchContext, records: list) -> None:
        pass
