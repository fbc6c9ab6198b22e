"""codegen.fastcall, the per-call extension: slots filled from buffers (None keeps a prepared slot),
non-contiguous buffers refused before the kernel runs, byte equality for the weight cache, and a
network entry point's status passed back."""
import ctypes

import numpy as np
import pytest

from codegen import fastcall
from codegen.build import build

pytestmark = pytest.mark.cc

KERNELS = r"""
void add_kernel(void* const* bufs) {  /* out[i] = x[i] + y[i] for 4 floats; bufs: x, y, out */
    const float* x = (const float*)bufs[0]; const float* y = (const float*)bufs[1]; float* o = (float*)bufs[2];
    for (int i = 0; i < 4; ++i) o[i] = x[i] + y[i];
}
int net_entry(const void* w, void* arena, void* const* ins, void* const* outs) {  /* out = in * w[0] */
    const float* x = (const float*)ins[0]; float* y = (float*)outs[0];
    for (int i = 0; i < 4; ++i) y[i] = x[i] * ((const float*)w)[0];
    return arena == 0 ? 7 : 0;
}
"""


@pytest.fixture(scope="module")
def fc():
    module = fastcall.load()
    if module is None:
        pytest.skip("the fastcall extension cannot be built here (no Python headers or compiler)")
    return module


@pytest.fixture(scope="module")
def lib():
    res = build(KERNELS)
    assert res.status == "ok", res.error
    return ctypes.CDLL(res.lib_path)


def _addr(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


def test_run_fills_slots_and_keeps_prepared_ones(fc, lib):
    x = np.arange(4, dtype=np.float32)
    y = np.full(4, 10, np.float32)
    out = np.zeros(4, np.float32)
    ptrs = (ctypes.c_void_p * 3)(0, y.ctypes.data, 0)
    fc.run(_addr(lib.add_kernel), ctypes.addressof(ptrs), x, None, out)  # slot 1 kept: y
    np.testing.assert_array_equal(out, x + 10)
    assert ptrs[0] == x.ctypes.data and ptrs[2] == out.ctypes.data
    ro = x.copy()
    ro.flags.writeable = False  # read-only inputs are fine
    fc.run(_addr(lib.add_kernel), ctypes.addressof(ptrs), ro, y, out)
    np.testing.assert_array_equal(out, x + 10)


def test_run_refuses_strided_buffers_before_the_kernel_runs(fc, lib):
    wide = np.arange(8, dtype=np.float32)
    out = np.full(4, -1, np.float32)
    ptrs = (ctypes.c_void_p * 3)()
    with pytest.raises((BufferError, ValueError)):
        fc.run(_addr(lib.add_kernel), ctypes.addressof(ptrs), wide[::2], np.ones(4, np.float32), out)
    np.testing.assert_array_equal(out, -1)  # not run
    with pytest.raises(ValueError):
        fc.run(0, ctypes.addressof(ptrs), out)
    with pytest.raises(TypeError):
        fc.run(_addr(lib.add_kernel))


def test_same_is_byte_equality(fc):
    a = np.arange(16, dtype=np.float32)
    copy = a.copy()
    assert fc.same(a, copy.ctypes.data, copy.nbytes)
    b = a.copy()
    b[7] = np.nextafter(b[7], np.float32(100))  # one ulp
    assert not fc.same(b, copy.ctypes.data, copy.nbytes)
    assert not fc.same(a, copy.ctypes.data, copy.nbytes - 4)  # another size
    assert not fc.same(np.asfortranarray(a.reshape(4, 4)), copy.ctypes.data, copy.nbytes)  # not C-contiguous
    assert fc.same(np.empty(0, np.float32), copy.ctypes.data, 0)


def test_run_net_passes_inputs_outputs_and_status(fc, lib):
    w = np.array([3.0], np.float32)
    arena = np.zeros(4, np.float32)
    ins, outs = (ctypes.c_void_p * 1)(), (ctypes.c_void_p * 1)()
    x, y = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    args = (_addr(lib.net_entry), w.ctypes.data, arena.ctypes.data, ctypes.addressof(ins), ctypes.addressof(outs), 1)
    assert fc.run_net(*args, x, y) == 0
    np.testing.assert_array_equal(y, 3 * x)
    assert fc.run_net(_addr(lib.net_entry), w.ctypes.data, 0, ctypes.addressof(ins), ctypes.addressof(outs), 1,
                      x, y) == 7  # the entry point's status comes back
    with pytest.raises(ValueError):
        fc.run_net(*args[:5], 3, x, y)  # more inputs than buffers: refused
