"""A CPython extension for the per-call path of built kernels (issue 14: under 5 us per call).

Through ctypes, a kernel call spent most of its ~5.8 us finding buffer addresses (``ctypes.c_char
.from_buffer``: ~0.8 us per array, four arrays per call for data, weights, bias and the fresh output),
comparing the weights with the packed copy (a ctypes ``memcmp``, ~0.5 us) and in the foreign call
itself (~0.8 us). This module, compiled once per machine and Python (cached like every kernel), does
those in one C call through the buffer protocol:

* ``run(fn, ptrs, *bufs)``: writes the address of each C-contiguous buffer in ``bufs`` into slot ``i`` of
  the pointer array at address ``ptrs`` (``None`` keeps a slot as prepared: packed weights, the
  workspace), then calls the kernel ``void fn(void* const*)`` with the GIL released;
* ``run_net(fn, weights, arena, ins, outs, n_in, *bufs)``: the same for a built network's entry point
  ``int fj_model_run_with(weights, arena, ins, outs)``: the first ``n_in`` buffers' addresses go into the
  input pointer array, the rest into the output one; returns its status;
* ``same(buf, addr, nbytes)``: whether ``buf`` is C-contiguous, ``nbytes`` long and byte-equal to the
  memory at ``addr`` (the weight cache's check).

Where the extension cannot be built (no Python headers, no compiler) :func:`load` returns ``None``
and :mod:`codegen.runtime` keeps its ctypes path; ``FELIXJAX_NO_FASTCALL=1`` forces that path (tests
run both).

Example:
    >>> import numpy as np
    >>> fc, a = load(), np.arange(4, dtype=np.uint8)
    >>> fc is None or (fc.same(a, a.copy().ctypes.data, 4), fc.same(a, (a + 1).ctypes.data, 4)) == (True, False)
    True
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sysconfig
from types import ModuleType

from .build import build

_NAME = "_fj_fastcall"
_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef void (*fj_kernel_fn)(void* const*);

static int fj_address(PyObject* obj, void** out, Py_ssize_t* len) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    *out = view.buf;
    if (len) *len = view.len;
    PyBuffer_Release(&view);  /* the caller holds the object: its memory stays put during the call */
    return 0;
}

static PyObject* fj_run(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs < 2) {
        PyErr_SetString(PyExc_TypeError, "run(fn, ptrs, *bufs)");
        return NULL;
    }
    void* fn = PyLong_AsVoidPtr(args[0]);
    void** ptrs = (void**)PyLong_AsVoidPtr(args[1]);
    if (PyErr_Occurred()) return NULL;
    if (!fn || !ptrs) {
        PyErr_SetString(PyExc_ValueError, "run: null kernel or pointer array");
        return NULL;
    }
    for (Py_ssize_t i = 2; i < nargs; ++i) {
        if (args[i] == Py_None) continue;
        if (fj_address(args[i], &ptrs[i - 2], NULL) < 0) return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    ((fj_kernel_fn)fn)((void* const*)ptrs);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

typedef int (*fj_model_fn)(const void*, void*, void* const*, void* const*);

static PyObject* fj_run_net(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    /* run_net(fn, weights, arena, ins, outs, n_in, *bufs): bufs[:n_in] -> ins, the rest -> outs */
    if (nargs < 6) {
        PyErr_SetString(PyExc_TypeError, "run_net(fn, weights, arena, ins, outs, n_in, *bufs)");
        return NULL;
    }
    void* fn = PyLong_AsVoidPtr(args[0]);
    void* weights = PyLong_AsVoidPtr(args[1]);
    void* arena = PyLong_AsVoidPtr(args[2]);
    void** ins = (void**)PyLong_AsVoidPtr(args[3]);
    void** outs = (void**)PyLong_AsVoidPtr(args[4]);
    Py_ssize_t n_in = PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (!fn || !ins || !outs || n_in < 0 || n_in > nargs - 6) {
        PyErr_SetString(PyExc_ValueError, "run_net: null pointer or bad input count");
        return NULL;
    }
    for (Py_ssize_t i = 6; i < nargs; ++i) {
        void** slot = i - 6 < n_in ? &ins[i - 6] : &outs[i - 6 - n_in];
        if (fj_address(args[i], slot, NULL) < 0) return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ((fj_model_fn)fn)(weights, arena, (void* const*)ins, (void* const*)outs);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

static PyObject* fj_same(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "same(buf, addr, nbytes)");
        return NULL;
    }
    void* addr = PyLong_AsVoidPtr(args[1]);
    Py_ssize_t n = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) return NULL;
    void* buf;
    Py_ssize_t len;
    if (fj_address(args[0], &buf, &len) < 0) {
        PyErr_Clear();  /* not a C-contiguous buffer: not the same bytes */
        Py_RETURN_FALSE;
    }
    if (len != n) Py_RETURN_FALSE;
    if (n == 0 || memcmp(buf, addr, (size_t)n) == 0) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static PyMethodDef fj_methods[] = {
    {"run", (PyCFunction)(void (*)(void))fj_run, METH_FASTCALL, "run(fn, ptrs, *bufs): fill slots, call the kernel"},
    {"run_net", (PyCFunction)(void (*)(void))fj_run_net, METH_FASTCALL, "run_net(fn, w, arena, ins, outs, n_in, *bufs)"},
    {"same", (PyCFunction)(void (*)(void))fj_same, METH_FASTCALL, "same(buf, addr, nbytes): byte equality"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fj_module = {PyModuleDef_HEAD_INIT, "_fj_fastcall", NULL, -1, fj_methods};

PyMODINIT_FUNC PyInit__fj_fastcall(void) { return PyModule_Create(&fj_module); }
"""

_loaded: list[ModuleType | None] = []  # [] until the first load; then [module or None]


def _compile() -> ModuleType | None:
    include = sysconfig.get_paths().get("include")
    if not include or not os.path.exists(os.path.join(include, "Python.h")):
        return None
    res = build(_SOURCE, flags=("-O2", "-shared", "-fPIC", "-std=gnu11", f"-I{include}"))
    if res.status != "ok":
        return None
    loader = importlib.machinery.ExtensionFileLoader(_NAME, res.lib_path)
    spec = importlib.util.spec_from_file_location(_NAME, res.lib_path, loader=loader)
    if spec is None:
        return None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load() -> ModuleType | None:
    """The compiled extension (built on first use, cached), or ``None`` where it cannot be built or
    ``FELIXJAX_NO_FASTCALL`` is set."""
    if os.environ.get("FELIXJAX_NO_FASTCALL"):
        return None
    if not _loaded:
        try:
            _loaded.append(_compile())
        except (OSError, ImportError):
            _loaded.append(None)
    return _loaded[0]
