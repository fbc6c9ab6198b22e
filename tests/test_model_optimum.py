"""benchmarks/model_optimum.py: every variant's first round scored under one packaged model."""
import sys
from pathlib import Path

import numpy as np
import pytest

import felixjax as fj

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import model_optimum  # noqa: E402


def test_first_round_columns():
    variants = {v: model_optimum.VARIANTS[v] for v in ("plain", "plain_climb4", "genetic@32_eps0")}
    res = model_optimum.first_round(fj.ops.matmul(64, 48, 32), variants, seed=0, n=16)
    assert list(res) == list(variants)
    for name, cols in res.items():
        assert cols["top"] >= cols["top8"] >= cols["mean"] and cols["propose_s"] > 0
        stats = [cols[c] for c in ("rounding_loss", "left_basin", "soft_hard_tau")]
        if name.startswith("genetic"):
            assert all(np.isnan(stats))  # the per-round statistics are the gradient search's
        else:
            assert np.isfinite(stats[:2]).all() and 0.0 <= cols["left_basin"] <= 1.0
    # the same descents, climbed further: its best pick scores at least as high under the model
    assert res["plain_climb4"]["top"] >= res["plain"]["top"]
    with pytest.raises(SystemExit):
        model_optimum.main(["--variants", "default,bogus"])
