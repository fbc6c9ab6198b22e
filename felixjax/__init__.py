"""felixjax: a JAX-native tensor program optimizer.

Schedules of real C kernels are relaxed into continuous variables, scored by a differentiable
learned latency model, and searched by gradient descent; every candidate is compiled, checked
against numpy and timed on this machine.

Example:
    >>> import felixjax as fj
    >>> t = fj.ops.matmul(64, 64, 64)
    >>> res = fj.tune(t, fj.Target.cpu(), strategy="random", trials=2, progress=False)
    >>> res.best.ok
    True
"""
from codegen.space import Config, Sketch, Space, sketches_for
from codegen.target import Target

from . import ops, zoo
from .approx.search import ApproxResult, approximate
from .compare import Comparison, compare
from .dask_runner import DaskRunner
from .database import Database, TuningRecord
from .errors import ModelFormatError, UnsupportedModelError
from .network import CompiledModel, NetworkTuneResult, build_model, choose_layout, tune_model
from .sparsify import sparsify
from .onnx_import import Model, load_onnx
from .ops import Task
from .strategies import get_strategy, registered as strategies
from .tuner import TuneResult, tune

__version__ = "0.1.0"

__all__ = ["ApproxResult", "approximate", "CompiledModel", "NetworkTuneResult", "build_model", "choose_layout", "tune_model", "sparsify", "Model", "ModelFormatError", "UnsupportedModelError", "load_onnx", "zoo", "Comparison", "Config", "DaskRunner", "Database", "Sketch", "Space", "Target", "Task", "TuneResult", "TuningRecord",
           "compare", "get_strategy", "ops", "sketches_for", "strategies", "tune"]
