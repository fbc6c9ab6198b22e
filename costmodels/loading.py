"""Loading any saved cost model by the kind stored in its checkpoint (kept apart from
:mod:`costmodels.checkpoint`, which every model imports, so the imports point one way)."""
from __future__ import annotations

import os
from typing import Any

from costmodels.checkpoint import load_npz
from costmodels.ensemble import EnsembleCostModel
from costmodels.mlp import MLPCostModel
from costmodels.roofline import MultiLevelRoofline, RooflineModel


def load_model(path: str | os.PathLike) -> Any:
    """Loads any cost model saved with its ``save`` method, dispatching on the stored kind.

    Example:
        >>> import tempfile, os
        >>> from costmodels import RooflineModel
        >>> p = os.path.join(tempfile.mkdtemp(), "prior.npz")
        >>> RooflineModel(flops_col=0, bytes_col=1, peak_flops=1e11, bandwidth=1e10).save(p)
        >>> type(load_model(p)).__name__
        'RooflineModel'
    """
    kinds = {cls.KIND: cls for cls in (RooflineModel, MultiLevelRoofline, MLPCostModel, EnsembleCostModel)}
    _, meta = load_npz(path)
    if meta.get("kind") not in kinds:
        raise ValueError(f"unknown cost model kind {meta.get('kind')!r} in {path}")
    return kinds[meta["kind"]].load(path)
