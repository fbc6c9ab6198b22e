"""codegen.runtime.Kernel: the tuned kernel as a Python callable. Weights are packed once and reused
only while they are the same, unedited array (a recycled id or an in-place edit used to give stale
results); bind() packs once for constant weights; every call returns a fresh array."""
import os

import numpy as np
import pytest

from codegen import fastcall
from codegen.build import build
from codegen.lower import lower
from codegen.ops import conv2d, dense
from codegen.render_c import render
from codegen.runtime import Kernel
from codegen.space import Space, default_sketch
from codegen.target import Target

TARGET = Target.cpu()


@pytest.fixture(autouse=True, params=["fastcall", "ctypes"])
def call_path(request, monkeypatch):
    """Every test runs on both per-call paths: the C extension (codegen.fastcall) and ctypes."""
    if request.param == "ctypes":
        monkeypatch.setenv("FELIXJAX_NO_FASTCALL", "1")
    else:
        monkeypatch.delenv("FELIXJAX_NO_FASTCALL", raising=False)
        if fastcall.load() is None:
            pytest.skip("the fastcall extension cannot be built here (no Python headers or compiler)")
    return request.param


def _kernel(task):
    sp = Space(task, default_sketch(task, TARGET), TARGET)
    plan = lower(sp, sp.default())
    b = build(render(plan))
    assert b.status == "ok", b.error
    k = Kernel(plan, b.lib_path, threads=1)
    assert (k._fast is None) == bool(os.environ.get("FELIXJAX_NO_FASTCALL"))  # the path under test
    return k


@pytest.mark.cc
@pytest.mark.parametrize("task", [dense(1, 64, 16, bias=True, act="relu"),
                                  conv2d(1, 8, 10, 10, out_channels=16, kernel=3, padding=1)])
def test_weight_cache_sees_edits_and_new_arrays(task):
    k = _kernel(task)
    arrays = list(task.random_inputs(seed=0))
    w = arrays[1]
    np.testing.assert_allclose(k(*arrays), task.reference(*arrays), rtol=1e-4, atol=1e-4)
    w *= -0.5  # in place: same object, same id
    np.testing.assert_allclose(k(*arrays), task.reference(*arrays), rtol=1e-4, atol=1e-4)
    for seed in range(1, 6):  # fresh arrays, ids free to be recycled between iterations
        arrays[1] = task.random_inputs(seed=seed)[1]
        np.testing.assert_allclose(k(*arrays), task.reference(*arrays), rtol=1e-4, atol=1e-4)


@pytest.mark.cc
def test_bound_kernel_packs_once_and_returns_fresh_outputs():
    task = dense(2, 32, 24, bias=True)
    k = _kernel(task)
    x, w, bias = task.random_inputs(seed=3)
    f = k.bind(w)
    ref = task.reference(x, w, bias)
    y1, y2 = f(x, bias), f(x, bias)
    assert y1 is not y2 and not np.shares_memory(y1, y2)
    np.testing.assert_allclose(y1, ref, rtol=1e-4, atol=1e-4)
    w[:] = 0  # the bound kernel holds its own packed copy: weights are constants once bound
    np.testing.assert_allclose(f(x, bias), ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="shape"):
        f(x[:, :5], bias)
    with pytest.raises(ValueError, match="weights have shape"):
        k.bind(w[:, :3])


@pytest.mark.cc
def test_fast_path_and_checked_path_agree_on_unusual_arrays():
    """The per-call fast path (ready arrays) and the checked path (anything else) give the same
    fresh outputs; read-only, non-contiguous, float64 and list inputs are accepted, a wrong shape
    is a clear error, and editing one output leaves the next call's alone."""
    task = dense(3, 40, 24, bias=True, act="relu")
    k = _kernel(task)
    x, w, bias = task.random_inputs(seed=5)
    ref = task.reference(x, w, bias)
    f = k.bind(w)
    ro = x.copy()
    ro.flags.writeable = False
    wide = np.zeros((3, 80), np.float32)
    wide[:, ::2] = x
    for call in (k, lambda a, _w, b: f(a, b)):
        y1, y2 = call(x, w, bias), call(x, w, bias)
        assert y1 is not y2 and not np.shares_memory(y1, y2) and y1.flags.writeable
        y1[...] = -1
        for a in (x, ro, wide[:, ::2], x.astype(np.float64), x.tolist()):
            np.testing.assert_allclose(call(a, w, bias), ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(call(x, w, bias.astype(np.float64)), ref, rtol=1e-4, atol=1e-4)
        with pytest.raises(ValueError, match="shape"):
            call(x[:, :39], w, bias)
        with pytest.raises(ValueError, match="shape"):
            call(x, w, bias[:5])
    w_ro = w.copy()
    w_ro.flags.writeable = False
    np.testing.assert_allclose(k(x, w_ro, bias), ref, rtol=1e-4, atol=1e-4)  # read-only weights
    w_f = np.asfortranarray(w)
    np.testing.assert_allclose(k(x, w_f, bias), ref, rtol=1e-4, atol=1e-4)  # weights in another layout
    w_f *= 2  # edited in place: repacked
    np.testing.assert_allclose(k(x, w_f, bias), task.reference(x, w_f, bias), rtol=1e-4, atol=1e-4)


@pytest.mark.cc
def test_int8_kernels_refuse_inputs_that_do_not_convert_exactly():
    """Session 72: float weights of 0.9 were truncated to 0 (an all-zero result) and int32 weights of 1000 wrapped
    modulo 256, silently; exact integers of another type still convert."""
    task = dense(2, 64, 16, dtype="int8", weight_bits=7)
    k = _kernel(task)
    x, w, *rest = task.random_inputs(seed=0)
    want = k(x, w, *rest)
    np.testing.assert_allclose(want, task.reference(x, w, *rest), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(k(x.astype(np.int64), w.astype(np.float32), *rest), want)  # exact: fine
    for bad_w in (np.full_like(w, 0.9, dtype=np.float32), np.full(w.shape, 1000, np.int32)):
        with pytest.raises(ValueError, match="does not convert exactly"):
            k(x, bad_w, *rest)
        with pytest.raises(ValueError, match="does not convert exactly"):
            k.bind(bad_w)
    with pytest.raises(ValueError, match="input 0"):
        k(x.astype(np.float32) + 0.5, w, *rest)
    bound = k.bind(w)
    with pytest.raises(ValueError, match="input 0"):
        bound(np.full(x.shape, 300, np.int64), *rest)


@pytest.mark.cc
def test_int8_kernels_check_scales_zero_points_and_weight_bits_as_the_reference_does():
    """Session 73's known gap: ``task.reference`` refused x_zp=300, a NaN scale and 7-bit weights out of
    [-64, 63], while the built kernel computed numbers from them. The kernel (and its bound form) checks
    them too, once per change of the values."""
    task = dense(2, 64, 16, dtype="int8", weight_bits=7)
    k = _kernel(task)
    x, w, xs, xzp, ws = task.random_inputs(seed=1)
    want = task.reference(x, w, xs, xzp, ws)
    bound = k.bind(w)
    bad = {"x_zp=300": (xs, np.array([300], np.int32), ws), "x_scale": (np.array([np.nan], np.float32), xzp, ws),
           "w_scales": (xs, xzp, np.where(np.arange(ws.size) == 3, 0.0, ws).astype(np.float32))}
    for label, quant in bad.items():
        with pytest.raises(ValueError) as ref_err:
            task.reference(x, w, *quant)
        for call in (k, bound):
            with pytest.raises(ValueError) as err:
                call(x, w, *quant) if call is k else call(x, *quant)
            assert str(err.value) == str(ref_err.value), label
    np.testing.assert_allclose(k(x, w, xs, xzp, ws), want, rtol=1e-5, atol=1e-5)  # good values again: fine
    np.testing.assert_allclose(bound(x, xs, xzp, ws), want, rtol=1e-5, atol=1e-5)
    xzp[0] = 300  # edited in place after a good call: seen
    with pytest.raises(ValueError, match="x_zp=300"):
        k(x, w, xs, xzp, ws)
    wide = w.copy()
    wide[0, 0] = -100  # int8, but outside 7 bits
    with pytest.raises(ValueError, match="weight_bits=7"):
        k(x, wide, xs, np.array([128], np.int32), ws)
    with pytest.raises(ValueError, match="weight_bits=7"):
        k.bind(wide)
