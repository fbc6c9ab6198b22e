"""Random search: uniform valid sampling (sketch uniform, then a config uniform within it)."""
from __future__ import annotations

from .base import SearchContext, fresh, register

ENUMERATE_UP_TO = 100_000  # a space this small (its upper bound) is enumerated when sampling finds nothing new


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
        # nearly exhausted: rejection misses the last few configs (3 of 896 left ended a run "exhausted" 7% of the
        # time); a small space gives them by enumeration, in random order
        rest = []
        for name in names:
            sp = ctx.spaces[name]
            try:
                if sp.size() > ENUMERATE_UP_TO:
                    continue
                rest.extend(sp.enumerate())
            except NotImplementedError:  # a space that is sampled only (the GPU's)
                continue
        rest = fresh(ctx, out + [rest[i] for i in ctx.rng.permutation(len(rest))], n)
        return rest

    def update(self, ctx: SearchContext, records: list) -> None:
        pass
