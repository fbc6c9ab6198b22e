"""codegen: operator IR, CPU schedule spaces, lowering, C rendering, building and measurement.

Numpy and the standard library only (no jax): this package is the ground truth that measured
kernels come from.
"""
from .build import DEFAULT_FLAGS, BuildResult, build, build_many
from .lower import Plan, lower
from .measure import (
           STATUSES,
           LocalRunner,
           MeasureResult,
           RunRequest,
           TimingProtocol,
           check_output,
)
from .ops import Task, conv2d, dense, depthwise_conv2d, matmul, parse_spec
from .peak import measure_fp32_peak
from .render_c import render
from .runtime import Kernel
from .space import Config, Sketch, Space, sketches_for
from .sparse_lower import (  # also registers the sparse sketch's lowering
           SparsePlan,
           with_weights,
)
from .target import Target

__all__ = [
           "DEFAULT_FLAGS",
           "STATUSES",
           "BuildResult",
           "Config",
           "Kernel",
           "LocalRunner",
           "MeasureResult",
           "Plan",
           "RunRequest",
           "Sketch",
           "Space",
           "SparsePlan",
           "Target",
           "Task",
           "TimingProtocol",
           "build",
           "build_many",
           "check_output",
           "conv2d",
           "dense",
           "depthwise_conv2d",
           "lower",
           "matmul",
           "measure_fp32_peak",
           "parse_spec",
           "render",
           "sketches_for",
           "with_weights",
]
