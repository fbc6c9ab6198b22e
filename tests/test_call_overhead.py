"""The per-call path of a built network (NetLibrary.call_fast, CompiledModel.__call__): every call
returns fresh outputs equal to the checked path's, and anything unusual falls back to the checks.
(benchmarks/overhead.py times it; no timing verdicts here.)"""
import os

import numpy as np
import pytest

import felixjax as fj
from codegen import fastcall
from felixjax import zoo
from felixjax.onnx_import import load_onnx


@pytest.fixture(scope="module", params=["fastcall", "ctypes"])
def exe(request):
    """The network on both per-call paths: the C extension (codegen.fastcall) and ctypes."""
    old = os.environ.pop("FELIXJAX_NO_FASTCALL", None)
    if request.param == "ctypes":
        os.environ["FELIXJAX_NO_FASTCALL"] = "1"
    elif fastcall.load() is None:
        pytest.skip("the fastcall extension cannot be built here (no Python headers or compiler)")
    try:
        built = fj.build_model(load_onnx(zoo.make_model("transformer_block", seq=8, dim=16, heads=2)), threads=1)
    finally:
        os.environ.pop("FELIXJAX_NO_FASTCALL", None)
        if old is not None:
            os.environ["FELIXJAX_NO_FASTCALL"] = old
    assert (built.library._fast is None) == (request.param == "ctypes")  # the path under test
    return built


def test_fast_path_returns_fresh_outputs_equal_to_the_checked_path(exe):
    x = np.random.default_rng(0).standard_normal(exe.net.input_shapes[0]).astype(np.float32)
    ref = exe.library([x])[0]
    y1, y2 = exe(x), exe(x)
    assert y1 is not y2 and not np.shares_memory(y1, y2)
    np.testing.assert_array_equal(y1, ref)
    np.testing.assert_array_equal(y2, ref)
    y1[...] = 0  # editing one result leaves the next call's alone
    np.testing.assert_array_equal(exe(x), ref)
    assert y2.dtype == np.float32 and y2.shape == tuple(exe.net.output_shapes[0]) and y2.flags.c_contiguous
    assert y2.flags.writeable


def test_unusual_inputs_take_the_checked_path(exe):
    rng = np.random.default_rng(1)
    shape = tuple(exe.net.input_shapes[0])
    x = rng.standard_normal(shape).astype(np.float32)
    ref = exe(x)
    ro = x.copy()
    ro.flags.writeable = False
    np.testing.assert_array_equal(exe(ro), ref)  # read-only
    np.testing.assert_array_equal(exe(x.astype(np.float64)), ref)  # converted
    big = np.zeros(shape[:-1] + (2 * shape[-1],), np.float32)
    big[..., ::2] = x
    np.testing.assert_array_equal(exe(big[..., ::2]), ref)  # not contiguous
    np.testing.assert_array_equal(exe({exe.input_names[0]: x}), ref)  # by name
    np.testing.assert_array_equal(exe.library.call_fast([x])[0], ref)
    # session 73: a JAX array or nested lists were split along their first axis as if a list of inputs
    import jax.numpy as jnp

    np.testing.assert_array_equal(exe(jnp.asarray(x)), ref)
    np.testing.assert_array_equal(exe(x.tolist()), ref)
    np.testing.assert_array_equal(exe([x]), ref)  # a list of the inputs, still
    np.testing.assert_array_equal(exe(*[x]), ref)
    with pytest.raises(ValueError, match="expects"):
        exe(np.zeros(shape[:-1] + (shape[-1] + 1,), np.float32))
