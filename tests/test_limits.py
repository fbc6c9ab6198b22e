"""Size limits (codegen.limits): absurd sizes are refused with one clear error, fast, before allocating;
divisors come from the factorization (never a scan up to n)."""
import math
import time

import numpy as np
import pytest

from codegen import limits, ops
from codegen.limits import Limits, SizeLimitError
from codegen.space import Space, default_config, divisors, factorize, sketches_for
from codegen.target import Target


def _fast(fn, budget_s=30.0):  # a hang guard (the enumerations these limits stop take hours), not a speed test
    t0 = time.perf_counter()
    with pytest.raises(SizeLimitError) as info:
        fn()
    assert time.perf_counter() - t0 < budget_s
    return str(info.value)


def test_huge_channels_refused_fast():
    msg = _fast(lambda: ops.conv2d(1, 10**11, 8, 8, out_channels=8, kernel=1))
    assert "axis c" in msg and "maximum extent" in msg and "FELIXJAX_MAX_EXTENT" in msg


def test_million_cubed_matmul_refused_fast():
    msg = _fast(lambda: ops.matmul(10**6, 10**6, 10**6))
    assert "matmul_1000000x1000000x1000000" in msg and "FELIXJAX_MAX_BUFFER_BYTES" in msg
    assert "limits={'max_buffer_bytes': ...}" in msg


def test_flops_limit_and_keyword():
    # small buffers, many FLOPs: 2 * 4096^3 = 1.4e11
    t = ops.matmul(4096, 4096, 4096)
    assert t.flops > 1e11
    msg = _fast(lambda: ops.matmul(4096, 4096, 4096, limits={"max_flops": 1e9}))
    assert "FLOPs exceed the limit" in msg and "FELIXJAX_MAX_FLOPS" in msg
    with pytest.raises(SizeLimitError):
        t.random_inputs(limits={"max_flops": 1e9})
    with pytest.raises(SizeLimitError):
        t.reference(np.zeros((1, 1)), np.zeros((1, 1)), limits={"max_flops": 1e9})


def test_environment_variable(monkeypatch):
    monkeypatch.setenv("FELIXJAX_MAX_BUFFER_BYTES", "1000")
    msg = _fast(lambda: ops.matmul(64, 64, 64))
    assert "data of shape (64, 64)" in msg and "per-buffer limit" in msg
    assert ops.matmul(64, 64, 64, limits={"max_buffer_bytes": 10**6}).flops == 2 * 64**3  # keyword wins
    monkeypatch.setenv("FELIXJAX_MAX_BUFFER_BYTES", "lots")
    with pytest.raises(ValueError, match="FELIXJAX_MAX_BUFFER_BYTES"):
        ops.matmul(8, 8, 8)
    monkeypatch.setenv("FELIXJAX_MAX_BUFFER_BYTES", "inf")
    monkeypatch.setenv("FELIXJAX_MAX_TOTAL_BYTES", "inf")
    monkeypatch.setenv("FELIXJAX_MAX_FLOPS", "inf")
    assert ops.matmul(10**6, 10**6, 10**6).name == "matmul_1000000x1000000x1000000"


def test_total_bytes_limit():
    lim = {"max_buffer_bytes": 5000, "max_total_bytes": 9000}
    msg = _fast(lambda: ops.matmul(32, 32, 32, limits=lim))  # 3 buffers of 4096 bytes
    assert "in all" in msg and "FELIXJAX_MAX_TOTAL_BYTES" in msg


def test_override_block_and_from_json():
    with limits.override(max_flops="inf", max_buffer_bytes="inf", max_total_bytes="inf"):
        big = ops.matmul(10**6, 10**6, 10**6)
    # a stored task loads whatever today's limits are; allocating it is still refused
    assert ops.Task.from_json(big.to_json()) == big
    _fast(lambda: big.random_inputs())


def test_defaults_follow_ram():
    d = Limits.defaults()
    ram = limits.physical_memory_bytes()
    assert d.max_buffer_bytes == ram // 4 and d.max_total_bytes == ram // 2
    assert d.max_flops == 1e13 and d.max_extent == 2**31 - 1
    assert issubclass(SizeLimitError, ValueError)


def test_ordinary_tasks_unaffected():
    t = ops.conv2d(1, 64, 56, 56, out_channels=64, kernel=3, padding=1, bias=True)
    a = t.random_inputs()
    assert t.reference(*a).shape == (1, 64, 56, 56)


# ---- divisors from the factorization -------------------------------------------------------------

def test_divisors_match_brute_force():
    for n in list(range(1, 1200)) + [2**20, 3**7 * 5, 9973 * 2, 1000, 720720]:
        assert divisors(n) == tuple(d for d in range(1, n + 1) if n % d == 0), n
        assert math.prod(p**e for p, e in factorize(n)) == n


def test_divisors_of_huge_extents_fast():
    t0 = time.perf_counter()
    assert divisors(2**31 - 1) == (1, 2**31 - 1)  # a Mersenne prime
    assert divisors(2**30) == tuple(2**i for i in range(31))
    assert len(divisors(2**2 * 3 * 5 * 7 * 11 * 13 * 17 * 19 * 23 * 29)) == 3 * 2**9
    assert time.perf_counter() - t0 < 30.0  # a hang guard: trial division up to 2**31 takes minutes


def test_space_on_large_prime_extent_fast():
    t0 = time.perf_counter()
    task = ops.dense(1, 2**31 - 1, 1, limits={"max_buffer_bytes": "inf", "max_total_bytes": "inf"})
    sp = Space(task, sketches_for(task)[0], Target.cpu())
    sp.validate(default_config(sp))
    assert time.perf_counter() - t0 < 30.0  # a hang guard, as above


# ---- the ONNX import path ------------------------------------------------------------------------

def _onnx_model(op, x_shape, y_shape, w_shape=None):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))
    inits = []
    if op == "Conv":
        inits = [numpy_helper.from_array(np.ones(w_shape, np.float32), "w")]
        node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    else:
        node = helper.make_node(op, ["x"], ["y"])
    graph = helper.make_graph([node], "g", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def test_huge_onnx_input_refused_fast():
    from felixjax import load_onnx

    data = _onnx_model("Relu", (1, 3, 10**6, 10**6), (1, 3, 10**6, 10**6))
    msg = _fast(lambda: load_onnx(data))
    assert "'x'" in msg and "(1, 3, 1000000, 1000000)" in msg and "FELIXJAX_MAX_BUFFER_BYTES" in msg


def test_huge_onnx_intermediate_and_flops_refused():
    from felixjax import load_onnx

    # the input fits, the convolution's output (1 x 2^16 x 1000 x 1000 floats) does not
    data = _onnx_model("Conv", (1, 3, 1000, 1000), (1, 2**16, 1000, 1000), (2**16, 3, 3, 3))
    msg = _fast(lambda: load_onnx(data, limits={"max_buffer_bytes": 2**30}))
    assert "node 'Conv_0' (op Conv)" in msg and "'y'" in msg
    # buffers fit, FLOPs do not: refused, not silently left to the numpy executor
    data = _onnx_model("Conv", (1, 64, 512, 512), (1, 64, 512, 512), (64, 64, 3, 3))
    msg = _fast(lambda: load_onnx(data, limits={"max_flops": 1e9}))
    assert "FLOPs" in msg
    assert len(load_onnx(data).tasks) == 1
