"""costmodels: latency models for tensor programs (jax, flax, optax, numpy only).

Models take arrays (``Features``, latencies in seconds, int task ids), never schedules, and score
programs by predicted ``−log(latency in seconds)``: higher is faster.

- ``RooflineModel``: analytic prior, no training (cold start).
- ``MLPCostModel``: Flax NNX segment-sum MLP, log-MSE + within-task RankNet, online fine-tuning.
- ``EnsembleCostModel``: K MLPs; mean score and std for uncertainty.

Example:
    >>> import numpy as np
    >>> import costmodels
    >>> f = costmodels.Features(np.zeros((2, 3, 4)), np.ones((2, 3)), np.log1p([[1e6, 1e3], [2e6, 1e3]]))
    >>> prior = costmodels.RooflineModel(flops_col=0, bytes_col=1, peak_flops=1e10, bandwidth=1e10)
    >>> costmodels.pairwise_accuracy(prior.predict(f), [1e-4, 2e-4], [0, 0])
    1.0
"""

from costmodels.base import (
    CostModel,
    Features,
    as_numpy_features,
    concat_features,
    holdout_mask,
    kendall_tau,
    neg_log_latency,
    pad_accesses,
    pairwise_accuracy,
    ranking_metrics,
)
from costmodels.ensemble import EnsembleCostModel
from costmodels.loading import load_model
from costmodels.mlp import MLPCostModel, SegmentSumMLP, TrainConfig
from costmodels.roofline import RooflineModel

__all__ = [
    "CostModel",
    "EnsembleCostModel",
    "Features",
    "MLPCostModel",
    "RooflineModel",
    "SegmentSumMLP",
    "TrainConfig",
    "as_numpy_features",
    "concat_features",
    "holdout_mask",
    "kendall_tau",
    "load_model",
    "neg_log_latency",
    "pad_accesses",
    "pairwise_accuracy",
    "ranking_metrics",
]
