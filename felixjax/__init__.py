"""felixjax: a JAX-native tensor program optimizer.

Schedules of real C kernels are relaxed into continuous variables, scored by a differentiable
learned latency model, and searched by gradient descent; every candidate is compiled, checked
against numpy and timed on this machine.

The public names below load on first use (PEP 562): ``import felixjax`` and ``felixjax --help`` stay
fast, and JAX, Flax and onnx load when a name that needs them is first touched.

Example:
    >>> import felixjax as fj
    >>> t = fj.ops.matmul(64, 64, 64)
    >>> res = fj.tune(t, fj.Target.cpu(), strategy="random", trials=2, progress=False)
    >>> res.best.ok
    True
"""
from __future__ import annotations

import importlib
import sys
import types


def _installed_version() -> str:
    """The installed distribution's version (pyproject.toml's, one place), or ``0+unknown`` from a bare checkout."""
    from importlib import metadata

    try:
        return metadata.version("felixjax")
    except metadata.PackageNotFoundError:
        return "0+unknown"


#: public name -> (module, attribute); modules relative to this package unless absolute
_EXPORTS = {
    "Config": ("codegen.space", "Config"), "Sketch": ("codegen.space", "Sketch"), "Space": ("codegen.space", "Space"),
    "sketches_for": ("codegen.space", "sketches_for"), "Target": ("codegen.target", "Target"),
    "ApproxResult": (".approx.search", "ApproxResult"), "approximate": (".approx.search", "approximate"),
    "Comparison": (".compare", "Comparison"), "compare": (".compare", "compare"),
    "DaskRunner": (".dask_runner", "DaskRunner"),
    "Database": (".database", "Database"), "TuningRecord": (".database", "TuningRecord"),
    "ModelFormatError": (".errors", "ModelFormatError"), "UnsupportedModelError": (".errors", "UnsupportedModelError"),
    "CompiledModel": (".network", "CompiledModel"), "NetworkTuneResult": (".network", "NetworkTuneResult"),
    "build_model": (".network", "build_model"), "choose_layout": (".network", "choose_layout"),
    "tune_model": (".network", "tune_model"), "sparsify": (".sparsify", "sparsify"),
    "Model": (".onnx_import", "Model"), "load_onnx": (".onnx_import", "load_onnx"), "Task": (".ops", "Task"),
    "get_strategy": (".strategies", "get_strategy"), "TuneResult": (".tuner", "TuneResult"), "tune": (".tuner", "tune"),
}
_SUBMODULES = ("ops", "zoo")

__all__ = sorted([*_EXPORTS, *_SUBMODULES, "strategies"])


def __getattr__(name: str):
    if name == "__version__":  # looked up on first use: importlib.metadata costs ~50 ms of import time
        globals()[name] = value = _installed_version()
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = getattr(importlib.import_module(module, __name__ if module.startswith(".") else None), attr)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _shadowing(name: str, load) -> property:
    """A public name that is also a submodule's (``compare``, ``sparsify``, ``strategies``): importing the
    submodule binds it on the package, which would hide the function; this keeps the function there."""
    def get(self):
        return load()

    def keep(self, _module) -> None:  # the import system binding the submodule: it stays in sys.modules
        pass

    return property(get, keep, doc=f"felixjax.{name}: the function, not the submodule of that name")


def _registered():
    from .strategies import registered

    return registered


class _Package(types.ModuleType):
    compare = _shadowing("compare", lambda: __getattr__("compare"))
    sparsify = _shadowing("sparsify", lambda: __getattr__("sparsify"))
    strategies = _shadowing("strategies", _registered)  # fj.strategies(): the registered strategies' names


sys.modules[__name__].__class__ = _Package
