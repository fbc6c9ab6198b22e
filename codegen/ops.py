"""Operator definitions: the compute of every supported anchor op, as a contraction.

Every op felixjax tunes is a *contraction* ``out[s] = epilogue(sum_r data[f(s, r)] * weight[g(s, r)])``
over spatial axes ``s`` and reduction axes ``r``, with affine index maps ``f`` and ``g``. Matmul, dense
and conv2d (groups, so depthwise too) differ only in their axes and index maps, so one lowering, one
schedule space and one feature extractor serve them all.

A :class:`Task` is the user-facing record (frozen, hashable, JSON round-trip, ``key`` for the database).
``Task.contraction()`` derives the axes and buffer accesses the rest of ``codegen`` works from.

Example:
    >>> from codegen.ops import matmul
    >>> t = matmul(64, 32, 16)
    >>> a, b = t.random_inputs(seed=0)
    >>> t.reference(a, b).shape
    (64, 32)
"""
from __future__ import annotations

import hashlib
import json
import math
import numbers
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from . import limits as _limits
from .ir import DTypes

ACTIVATIONS = (None, "relu", "relu6")
OPS = ("matmul", "dense", "conv2d", "conv2d_nchwc")  # the last: channel-blocked I/O (codegen.blocked)
#: ops whose contraction and reference live in another module, which registers them here on import
#: (``codegen.blocked``: ``conv2d_nchwc``), so this module imports none of them: op -> (contraction(task),
#: reference(task, arrays))
EXTERNAL_OPS: dict[str, tuple[Any, Any]] = {}
#: the precisions of ``dtype=``: float32 (default), float16 (storage; float32 accumulation), int8
#: (uint8 / int8 activations x int8 weights, int32 accumulation, per-output-channel weight scales)
PRECISIONS = ("float32", "float16", "int8")
#: the float16-accumulation variant of a float16 task (``dtypes=``; its accuracy: see :meth:`Task.tolerance`)
FP16_ACCUMULATE = DTypes("float16", "float16", "float16", "float16")


# ----------------------------------------------------------------------------------------------
# Contraction description (derived from a Task)
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Axis:
    """One iteration variable of a contraction."""

    name: str
    extent: int
    reduce: bool


@dataclass(frozen=True)
class Access:
    """A buffer read or written by the contraction, in its API (logical) layout.

    ``dims[d]`` is the index of dimension ``d`` as an affine sum of axes: a tuple of
    ``(axis_name, coefficient)`` pairs. ``shape`` is the logical shape (padded, for the data input).
    """

    buffer: str
    shape: tuple[int, ...]
    dims: tuple[tuple[tuple[str, int], ...], ...]

    def depends_on(self, axis: str) -> bool:
        return any(a == axis and c != 0 for dim in self.dims for a, c in dim)


@dataclass(frozen=True)
class Contraction:
    """Axes and accesses of one task. ``data`` is read through a padded copy when ``pad`` is non-zero."""

    axes: tuple[Axis, ...]
    data: Access
    weight: Access
    out: Access
    bias: Access | None
    data_api_shape: tuple[int, ...]
    pad: tuple[tuple[int, int], ...]  # (before, after) per data dim

    @property
    def spatial(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if not a.reduce)

    @property
    def reduction(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.reduce)

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(name)

    @property
    def reduction_size(self) -> int:
        return math.prod(a.extent for a in self.reduction)


# ----------------------------------------------------------------------------------------------
# Task
# ----------------------------------------------------------------------------------------------

def _int(v: Any, name: str) -> int:
    """``v`` as an int (numpy integers and floats holding one too); 2.5, "4" or a bool: a ValueError."""
    if not isinstance(v, (bool, np.bool_)) and isinstance(v, numbers.Real) and float(v).is_integer():
        return int(v)
    raise ValueError(f"{name} must be an integer, got {v!r}")


def _as_pair(v: int | tuple[int, int] | list[int], name: str) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"{name} must be an int or a pair of ints, got {v!r}")
        return _int(v[0], name), _int(v[1], name)
    return _int(v, name), _int(v, name)


def _as_pad(v: int | tuple[int, ...] | list[int]) -> tuple[int, int, int, int]:
    if isinstance(v, (tuple, list)):
        if len(v) == 2:
            return _int(v[0], "padding"), _int(v[1], "padding"), _int(v[0], "padding"), _int(v[1], "padding")
        if len(v) != 4:
            raise ValueError(f"padding must be an int, (pad_h, pad_w) or (top, left, bottom, right), got {v!r}")
        return tuple(_int(x, "padding") for x in v)  # type: ignore[return-value]
    return (_int(v, "padding"),) * 4  # type: ignore[return-value]


@dataclass(frozen=True)
class Task:
    """One tunable operator instance: op kind, shape parameters and fused epilogue.

    ``params`` is a sorted tuple of ``(name, value)`` pairs so the record hashes and serializes
    canonically. Build tasks with :func:`matmul`, :func:`dense`, :func:`conv2d`,
    :func:`depthwise_conv2d` rather than by hand.
    """

    op: str
    params: tuple[tuple[str, Any], ...]
    bias: bool = False
    act: str | None = None
    residual: bool = False
    dtype: str = "float32"
    #: element types per role (inputs, weights, accumulator, output; :class:`codegen.ir.DTypes`);
    #: ``None`` means those of ``dtype`` (:meth:`DTypes.of`), and is what equal roles normalize to, so
    #: the field stays out of the JSON (and the key) unless it says something ``dtype`` does not
    dtypes: DTypes | None = None
    #: int8 only: the activations (data) are int8 (True) or uint8 (False, the default)
    act_signed: bool = False
    #: int8 only: ``None`` (a float32, dequantized output) or ``"int8"`` (requantized with y_scale, y_zero_point)
    out_dtype: str | None = None
    #: fraction of zero weights (unstructured), in [0, 1); 0 is a dense task. The task holds the
    #: fraction only: the pattern comes from :meth:`random_inputs` (tuning) or the layer's real weights
    #: (``codegen.sparse_lower.with_weights``). Written to JSON only when non-zero (dense keys unchanged)
    sparsity: float = 0.0
    #: int8 only: 8 (weights in [-128, 127], the default) or 7 (weights in [-64, 63], onnxruntime's
    #: ``reduce_range``): 7-bit weights let AVX2 take four reduction steps per ``vpmaddubsw`` +
    #: ``vpmaddwd`` pair exactly (u8 x s7 pair sums fit int16: 2 * 255 * 64 <= 32767; see
    #: :func:`codegen.lower.int8_pairs`). Written to JSON only when 7 (other keys unchanged)
    weight_bits: int = 8

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown op {self.op!r}; supported: {', '.join(OPS)}")
        for flag in ("bias", "residual"):  # 0 / 1 (numpy bools too) as bools: one key per task
            v = getattr(self, flag)
            if isinstance(v, (bool, np.bool_)) or (isinstance(v, numbers.Integral) and v in (0, 1)):
                object.__setattr__(self, flag, bool(v))
            else:
                raise ValueError(f"{flag} must be a bool, got {v!r}")
        if self.act not in ACTIVATIONS:
            raise ValueError(f"act must be one of None, 'relu', 'relu6'; got {self.act!r}")
        if self.dtype not in PRECISIONS:
            raise ValueError(f"unknown dtype {self.dtype!r}; supported: {', '.join(PRECISIONS)}")
        if self.out_dtype in ("float32", None):
            object.__setattr__(self, "out_dtype", None)
        elif self.out_dtype != "int8" or self.dtype != "int8":
            raise ValueError(f"out_dtype={self.out_dtype!r}: only an int8 task takes out_dtype='int8' "
                             f"(or None / 'float32', a dequantized float32 output)")
        if not isinstance(self.act_signed, bool):
            raise ValueError(f"act_signed must be a bool, got {self.act_signed!r}")
        if self.act_signed and self.dtype != "int8":
            raise ValueError("act_signed=True applies to int8 tasks only (signed int8 activations)")
        if isinstance(self.weight_bits, bool) or self.weight_bits not in (7, 8):
            raise ValueError(f"weight_bits must be 8 or 7 (int8 weights in [-64, 63]), got {self.weight_bits!r}")
        if self.weight_bits == 7 and self.dtype != "int8":
            raise ValueError("weight_bits=7 applies to int8 tasks only (7-bit int8 weights)")
        if self.dtypes is not None:
            dts = DTypes(**self.dtypes) if isinstance(self.dtypes, dict) else self.dtypes
            if not isinstance(dts, DTypes):
                raise ValueError(f"dtypes must be a codegen.ir.DTypes, got {type(self.dtypes).__name__}")
            if dts == self._default_dtypes():
                object.__setattr__(self, "dtypes", None)
            elif self.dtype == "float16" and dts == FP16_ACCUMULATE:
                object.__setattr__(self, "dtypes", dts)
            else:
                raise ValueError(f"dtypes {dts} are not supported for dtype={self.dtype!r}; supported: "
                                 f"{self._default_dtypes()}"
                                 + (f" or {FP16_ACCUMULATE} (float16 accumulation)" if self.dtype == "float16" else ""))
        for k, v in self.params:
            vals = v if isinstance(v, tuple) else (v,)
            if any((not isinstance(x, int)) or isinstance(x, bool) for x in vals):
                raise ValueError(f"{self.op} parameter {k}={v!r} must be integer")
        self._check_sparsity()
        self.check_size()  # validates shapes, then sizes against codegen.limits (before any allocation)

    def _check_sparsity(self) -> None:
        """``sparsity`` is a fraction in [0, 1) of a float32 dense, matmul (no batch) or conv2d (groups 1)."""
        s = self.sparsity
        if isinstance(s, bool) or not isinstance(s, numbers.Real) or not math.isfinite(float(s)) \
                or not 0.0 <= float(s) < 1.0:
            raise ValueError(f"sparsity must be a fraction of zero weights in [0, 1), got {s!r}")
        object.__setattr__(self, "sparsity", float(s))
        if not s:
            return
        if self.dtype != "float32":
            raise ValueError(f"sparsity= needs dtype float32 (sparse kernels are float32), got dtype {self.dtype!r}")
        p = self.p
        if self.op == "matmul" and p.get("batch"):
            raise ValueError("sparsity= applies to a matmul without batch= (one weight matrix)")
        if self.op == "conv2d" and p.get("groups", 1) != 1:
            raise ValueError(f"sparsity= applies to conv2d with groups=1, got groups={p.get('groups')}")

    # ---- parameters ---------------------------------------------------------------------------
    @property
    def p(self) -> dict[str, Any]:
        return dict(self.params)

    # ---- identity -----------------------------------------------------------------------------
    def to_json(self) -> dict:
        """A JSON-safe dict; ``Task.from_json(t.to_json()) == t``."""
        d = {"op": self.op, "params": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.params},
             "bias": self.bias, "act": self.act, "residual": self.residual, "dtype": self.dtype}
        if self.dtypes is not None:  # never at its default: existing keys stay byte-identical
            d["dtypes"] = self.dtypes.to_json()
        if self.act_signed:  # int8 only, and only when set (keys of other tasks unchanged)
            d["act_signed"] = True
        if self.out_dtype is not None:
            d["out_dtype"] = self.out_dtype
        if self.sparsity:  # only when non-zero: keys of dense tasks stay byte-identical
            d["sparsity"] = self.sparsity
        if self.weight_bits != 8:  # int8 with 7-bit weights only
            d["weight_bits"] = self.weight_bits
        return d

    @staticmethod
    def from_json(d: dict) -> "Task":
        """Inverse of :meth:`to_json`. Byte and FLOP limits are not applied here (a stored task may have
        been made under raised limits); ``random_inputs`` and ``reference`` still check them."""
        params = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in d["params"].items()))
        lenient = {"max_buffer_bytes": None, "max_total_bytes": None, "max_flops": None}
        with _limits.override(**lenient):
            dts = DTypes.from_json(d["dtypes"]) if d.get("dtypes") else None
            return Task(d["op"], params, bool(d.get("bias", False)), d.get("act"), bool(d.get("residual", False)),
                        d.get("dtype", "float32"), dts, bool(d.get("act_signed", False)), d.get("out_dtype"), sparsity=float(d.get("sparsity", 0.0)),
                        weight_bits=int(d.get("weight_bits", 8)))

    def check_size(self, limits: "_limits.Limits | dict | None" = None, *, itemsize: int = 4) -> None:
        """Validate the shapes, then raise :class:`codegen.limits.SizeLimitError` if an extent, a buffer
        (inputs and output, ``itemsize`` bytes per element), all of them together, or the FLOPs exceed
        ``limits`` (default: :func:`codegen.limits.current`). Allocates nothing."""
        con = self.contraction()
        lim = _limits.resolve(limits)
        for a in con.axes:
            _limits.check_extent(f"axis {a.name}", a.extent, lim, what=self.name)
        names = self.input_names()
        buffers = list(zip(names, self.input_shapes())) + [("out", con.out.shape)]
        if con.data.shape != con.data_api_shape:
            buffers.append(("padded data", con.data.shape))
        _limits.check_buffers(buffers, lim, itemsize=itemsize, what=self.name)
        _limits.check_flops(self.flops, lim, what=self.name)

    def _default_dtypes(self) -> DTypes:
        if self.dtype == "int8":
            return DTypes("int8" if self.act_signed else "uint8", "int8", "int32", self.out_dtype or "float32")
        return DTypes.of(self.dtype)

    @property
    def buffer_dtypes(self) -> DTypes:
        """Element types per role: ``dtypes``, else those of ``dtype`` (int8: uint8 or int8 data by
        ``act_signed``, output float32 or ``out_dtype``)."""
        return self.dtypes if self.dtypes is not None else self._default_dtypes()

    @property
    def weight_range(self) -> tuple[int, int]:
        """int8 tasks: the inclusive range of the weights (``weight_bits`` 8: [-128, 127], 7: [-64, 63])."""
        return (-(1 << (self.weight_bits - 1)), (1 << (self.weight_bits - 1)) - 1)

    @property
    def quantized(self) -> bool:
        """An int8 task (int32 accumulation, scales and zero points among its inputs)."""
        return self.dtype == "int8"

    def tolerance(self, expected: np.ndarray | None = None) -> tuple[float, float]:
        """``(rtol, atol)`` of the output check for this precision (see
        :func:`codegen.measure_records.check_output`, whose absolute term also scales with sqrt(K) and
        the output type's epsilon).

        * float32: rtol 1e-4 (float32 sums of K products in another order);
        * float16, float32 accumulation: the inputs are exact float16 values, the products and sums are
          float32, only the final store rounds to float16: half an ulp, rtol 2**-11 (~4.9e-4); 1e-3;
        * float16 accumulation: every multiply-add rounds to float16 (11-bit significand), so the error
          of a K-term sum grows like K * 2**-11 in the worst case: rtol 1e-3, atol K * 2**-11 * max|ref|
          (``expected``: the reference, for its max; without it atol is that factor alone);
        * int8, float32 output: the int32 accumulation is exact; the dequantization
          ``acc * x_scale * w_scale + bias`` is a few float32 roundings: rtol 1e-5;
        * int8, int8 output: the requantized value may differ by one quantum where the float32
          dequantization lands next to a rounding tie: atol 1 (in output units).

        Example:
            >>> matmul(4, 4, 4, dtype="int8", out_dtype="int8").tolerance()
            (0.0, 1.0)
        """
        dts = self.buffer_dtypes
        if self.dtype == "int8":
            return (0.0, 1.0) if self.out_dtype == "int8" else (1e-5, 0.0)
        if self.dtype == "float16":
            k = self.contraction().reduction_size
            scale = float(np.abs(expected).max()) if expected is not None and np.size(expected) else 1.0
            return (1e-3, k * 2.0 ** -11 * scale) if dts.accumulator == "float16" else (1e-3, 0.0)
        return (1e-4, 0.0)

    @property
    def key(self) -> str:
        """Stable identifier of the workload (hash of the canonical JSON)."""
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def name(self) -> str:
        """Short human-readable name, e.g. ``conv2d_1x64x56x56_k64_3x3_s1_p1``."""
        p = self.p
        if self.op == "matmul":
            b = f"b{p['batch']}_" if p.get("batch") else ""
            s = f"matmul_{b}{p['m']}x{p['n']}x{p['k']}"
        elif self.op == "dense":
            s = f"dense_{p['n']}x{p['in']}_{p['out']}"
        elif self.op == "conv2d_nchwc":  # the NCHW twin's name with the layout spelled after the kind
            kind, _, rest = Task("conv2d", tuple(kv for kv in self.params if kv[0] != "block")).name.partition("_")
            s = f"{kind}_nchwc{p['block']}_{rest}"
        else:
            dw = p["groups"] == p["c"] and p["groups"] > 1
            kind = "dwconv2d" if dw else "conv2d"
            # a stride, padding or dilation that differs per side is spelled out in full (names of the square,
            # symmetric, undilated convs, and everything keyed on them, unchanged)
            stride, pad, dil = tuple(p["stride"]), tuple(p["pad"]), tuple(p.get("dilation", (1, 1)))
            s = (f"{kind}_{p['n']}x{p['c']}x{p['h']}x{p['w']}_k{p['k']}_{p['r']}x{p['s']}"
                 f"_s{'x'.join(map(str, stride)) if len(set(stride)) > 1 else stride[0]}"
                 f"_p{'x'.join(map(str, pad)) if len(set(pad)) > 1 else pad[0]}")
            if dil != (1, 1):
                s += f"_d{'x'.join(map(str, dil)) if len(set(dil)) > 1 else dil[0]}"
            if p["groups"] > 1 and not dw:
                s += f"_g{p['groups']}"
        if self.bias:
            s += "_bias"
        if self.residual:
            s += "_res"
        if self.act:
            s += f"_{self.act}"
        if self.dtype != "float32":  # float32 names (and everything keyed on them) unchanged
            s += {"float16": "_fp16", "int8": "_int8"}[self.dtype]
            s += "_acc16" if self.buffer_dtypes.accumulator == "float16" else ""
            s += "_s8" if self.act_signed else ""
            s += "_q8out" if self.out_dtype == "int8" else ""
            s += "_w7" if self.weight_bits == 7 else ""
        if self.sparsity:
            s += f"_sp{float(self.sparsity)!r}"  # every digit: 0.9999999 is not "_sp1"
        return s

    def __str__(self) -> str:
        return self.name

    # ---- shapes -------------------------------------------------------------------------------
    def contraction(self) -> Contraction:
        """Axes and accesses of this task (see module docstring)."""
        p = self.p
        if self.op in EXTERNAL_OPS:
            return EXTERNAL_OPS[self.op][0](self)
        if self.op in ("matmul", "dense"):
            if self.op == "matmul":
                batch = p.get("batch") or 0
                m, n, k = p["m"], p["n"], p["k"]
            else:
                batch, m, n, k = 0, p["n"], p["out"], p["in"]
            names = ("m", "n", "k") if self.op == "matmul" else ("n", "out", "in")  # the constructor's names
            for name, v in zip(names, (m, n, k)):
                if v < 1:
                    raise ValueError(f"{self.op}: {name} must be >= 1, got {v}")
            if "batch" in p and batch < 1:  # left out: no batch axis (0 was read as left out)
                raise ValueError(f"{self.op}: batch must be >= 1 (or left out), got {batch}")
            b = max(batch, 1)
            axes = (Axis("b", b, False), Axis("m", m, False), Axis("n", n, False), Axis("k", k, True))
            bd = ((("b", 1),),) if batch else ()
            data = Access("data", ((b,) if batch else ()) + (m, k), bd + ((("m", 1),), (("k", 1),)))
            if self.op == "matmul":
                weight = Access("weight", ((b,) if batch else ()) + (k, n), bd + ((("k", 1),), (("n", 1),)))
            else:
                weight = Access("weight", (n, k), ((("n", 1),), (("k", 1),)))
            out = Access("out", ((b,) if batch else ()) + (m, n), bd + ((("m", 1),), (("n", 1),)))
            bias = Access("bias", (n,), ((("n", 1),),)) if self.bias else None
            return Contraction(axes, data, weight, out, bias, data.shape, tuple((0, 0) for _ in data.shape))

        # conv2d, NCHW / OIHW
        n, c, h, w, kk = p["n"], p["c"], p["h"], p["w"], p["k"]
        r, s, g = p["r"], p["s"], p["groups"]
        (sh, sw), (dh, dw) = p["stride"], p["dilation"]
        pt, pl, pb, pr = p["pad"]
        for name, v in (("n", n), ("c", c), ("h", h), ("w", w), ("k (out_channels)", kk), ("r (kernel height)", r),
                        ("s (kernel width)", s), ("groups", g), ("stride", min(sh, sw)), ("dilation", min(dh, dw))):
            if v < 1:
                raise ValueError(f"conv2d: {name} must be >= 1, got {v}")
        if min(pt, pl, pb, pr) < 0:
            raise ValueError(f"conv2d: padding must be >= 0, got {p['pad']}")
        if c % g or kk % g:
            raise ValueError(f"conv2d: groups={g} must divide in channels c={c} and out channels k={kk}")
        hp, wp = h + pt + pb, w + pl + pr
        oh = (hp - dh * (r - 1) - 1) // sh + 1
        ow = (wp - dw * (s - 1) - 1) // sw + 1
        if oh < 1 or ow < 1:
            raise ValueError(f"conv2d: kernel {r}x{s} (dilation {dh}x{dw}) is larger than the padded input "
                             f"{hp}x{wp}")
        cg, kg = c // g, kk // g
        axes = (Axis("n", n, False), Axis("g", g, False), Axis("k", kg, False), Axis("y", oh, False),
                Axis("x", ow, False), Axis("c", cg, True), Axis("ry", r, True), Axis("rx", s, True))
        data = Access("data", (n, c, hp, wp),
                      ((("n", 1),), (("g", cg), ("c", 1)), (("y", sh), ("ry", dh)), (("x", sw), ("rx", dw))))
        weight = Access("weight", (kk, cg, r, s), ((("g", kg), ("k", 1)), (("c", 1),), (("ry", 1),), (("rx", 1),)))
        out = Access("out", (n, kk, oh, ow), ((("n", 1),), (("g", kg), ("k", 1)), (("y", 1),), (("x", 1),)))
        bias = Access("bias", (kk,), ((("g", kg), ("k", 1)),)) if self.bias else None
        return Contraction(axes, data, weight, out, bias, (n, c, h, w), ((0, 0), (0, 0), (pt, pb), (pl, pr)))

    def input_names(self) -> list[str]:
        """Names of the inputs in API (= kernel argument) order: data, weights, then bias, then
        residual; an int8 task then x_scale, x_zp, w_scales, and with ``out_dtype="int8"`` y_scale, y_zp."""
        names = ["data", "weight"] + (["bias"] if self.bias else []) + (["residual"] if self.residual else [])
        if self.quantized:
            names += ["x_scale", "x_zp", "w_scales"] + (["y_scale", "y_zp"] if self.out_dtype == "int8" else [])
        return names

    def input_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the inputs in API order (:meth:`input_names`); scales and zero points of one
        tensor have shape ``(1,)``, ``w_scales`` one per output channel."""
        con = self.contraction()
        table = {"data": con.data_api_shape, "weight": con.weight.shape, "residual": con.out.shape,
                 "bias": (con.out.shape[1] if self.op == "conv2d" else (
                     self.p["k"] if self.op == "conv2d_nchwc" else con.out.shape[-1]),),
                 "x_scale": (1,), "x_zp": (1,), "y_scale": (1,), "y_zp": (1,)}
        table["w_scales"] = table["bias"]
        return [tuple(table[n]) for n in self.input_names()]

    def input_dtypes(self) -> list[np.dtype]:
        """Element types of the inputs in API order (what :meth:`random_inputs` returns and the kernel
        reads): float32 tasks float32; float16 data, weights and residual float16, bias float32;
        int8 data uint8 / int8 (``act_signed``), weights int8, bias, residual and scales float32,
        zero points int32.

        Example:
            >>> [d.name for d in matmul(4, 4, 4, dtype="int8", bias=True).input_dtypes()]
            ['uint8', 'int8', 'float32', 'float32', 'int32', 'float32']
        """
        dts = self.buffer_dtypes
        return [np.dtype(dts.for_buffer(n)) for n in self.input_names()]

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.contraction().out.shape

    @property
    def flops(self) -> int:
        """Floating-point operations: 2 per multiply-add, plus one per epilogue op per output."""
        con = self.contraction()
        outputs = math.prod(a.extent for a in con.spatial)
        epi = int(self.bias) + int(self.residual) + (1 if self.act else 0)
        return 2 * outputs * con.reduction_size + epi * outputs

    # ---- numerics ------------------------------------------------------------------------------
    def random_inputs(self, seed: int = 0, *, limits: "_limits.Limits | dict | None" = None) -> list[np.ndarray]:
        """Random inputs in API order (:meth:`input_names`), of :meth:`input_dtypes`: float values
        uniform in [-1, 1) (float16: rounded to float16); int8 tasks: quantized data over the whole
        uint8 / int8 range, int8 weights in [-127, 127], x_scale in [0.01, 0.03), a zero point near
        the middle of the range (uint8) or near 0 (int8), weight scales in [0.002, 0.01); with an int8
        output, y_scale is chosen from the float result's range (so few outputs clip) and y_zp in [-8, 8].

        Raises :class:`codegen.limits.SizeLimitError` before allocating when the inputs (generated in
        float64, then cast) exceed ``limits``."""
        self.check_size(limits, itemsize=8)
        rng = np.random.default_rng(seed)
        shapes = dict(zip(self.input_names(), self.input_shapes()))
        dts = dict(zip(self.input_names(), self.input_dtypes()))
        out = {n: rng.uniform(-1.0, 1.0, size=s).astype(dts[n]) for n, s in shapes.items()
               if dts[n].kind == "f"}
        if self.quantized:
            lo, hi = (-128, 128) if self.act_signed else (0, 256)
            out["data"] = rng.integers(lo, hi, size=shapes["data"]).astype(dts["data"])
            wlo, whi = self.weight_range
            out["weight"] = rng.integers(max(wlo, -127), whi + 1, size=shapes["weight"]).astype(np.int8)
            out["x_scale"] = rng.uniform(0.01, 0.03, size=1).astype(np.float32)
            out["x_zp"] = rng.integers(-8, 9, size=1).astype(np.int32) + (0 if self.act_signed else 128)
            out["w_scales"] = rng.uniform(0.002, 0.01, size=shapes["w_scales"]).astype(np.float32)
            if self.out_dtype == "int8":
                out["y_scale"], out["y_zp"] = np.ones(1, np.float32), np.zeros(1, np.int32)
                probe = Task(self.op, self.params, self.bias, self.act, self.residual, "int8", None, self.act_signed,
                             weight_bits=self.weight_bits)
                y = probe.reference(*[out[n] for n in probe.input_names()])
                out["y_scale"][0] = max(float(np.abs(y).max()), 1e-6) / 120.0
                out["y_zp"][0] = rng.integers(-8, 9)
        if self.sparsity:  # zero weights (unstructured): the pattern of this seed
            out["weight"] = _sparsify(out["weight"], self.sparsity, seed)
        return [out[n] for n in self.input_names()]

    def _check_quant(self, named: dict[str, np.ndarray]) -> None:
        """Clear errors for unusable quantization parameters and out-of-range weights."""
        self.check_quant_params(named)
        check_weight_range(self, named["weight"])

    def check_quant_params(self, named: dict[str, np.ndarray]) -> None:
        """Clear errors for unusable quantization parameters (scales finite and > 0, zero points in
        the data's range): the same checks in :meth:`reference` and in a built kernel's call."""
        for n in ("x_scale", "w_scales", "y_scale"):
            if n in named:
                v = np.asarray(named[n], dtype=np.float64)
                if not (np.isfinite(v).all() and (v > 0).all()):
                    raise ValueError(f"{self.name}: {n} must be finite and > 0, got {v.ravel()[:4]}")
        lo, hi = (-128, 127) if self.act_signed else (0, 255)
        zp = int(np.asarray(named["x_zp"]).ravel()[0])
        if not lo <= zp <= hi:
            raise ValueError(f"{self.name}: x_zp={zp} is outside the data range [{lo}, {hi}]")
        if "y_zp" in named and not -128 <= int(np.asarray(named["y_zp"]).ravel()[0]) <= 127:
            raise ValueError(f"{self.name}: y_zp must be in [-128, 127]")

    def reference(self, *arrays: np.ndarray, limits: "_limits.Limits | dict | None" = None) -> np.ndarray:
        """Numpy reference output (computed in float64, returned as float32).

        Raises :class:`codegen.limits.SizeLimitError` before allocating when the float64 copies or the
        FLOPs exceed ``limits``."""
        self.check_size(limits, itemsize=8)
        shapes = self.input_shapes()
        if len(arrays) != len(shapes):
            raise ValueError(f"{self.name} ({self.dtype}) takes {len(shapes)} inputs "
                             f"({', '.join(self.input_names())}), got {len(arrays)}"
                             + ("; an int8 task needs its scales and zero points" if self.quantized else ""))
        for i, (a, s) in enumerate(zip(arrays, shapes)):
            if tuple(np.shape(a)) != tuple(s):
                raise ValueError(f"{self.name}: input {i} has shape {np.shape(a)}, expected {s}")
        if self.op in EXTERNAL_OPS:
            return EXTERNAL_OPS[self.op][1](self, list(arrays))
        named = dict(zip(self.input_names(), arrays))
        x, wt = (np.asarray(a, dtype=np.float64) for a in arrays[:2])
        rest = [named[n] for n in ("bias", "residual") if n in named]
        if self.quantized:
            self._check_quant(named)
            # (x - x_zp) in float64 is exact, and zero padding of it is the real zero
            x = x - float(np.asarray(named["x_zp"]).ravel()[0])
        p = self.p
        if self.op == "matmul":
            y = np.matmul(x, wt)
        elif self.op == "dense":
            y = x @ wt.T
        else:
            y = _conv2d_ref(x, wt, p)
        if self.quantized:  # dequantize: x_scale * w_scale[out channel] * (int32 sum of (x - zp) * w)
            ws = np.asarray(named["w_scales"], dtype=np.float64) * float(np.asarray(named["x_scale"]).ravel()[0])
            y = y * (ws.reshape(1, -1, 1, 1) if self.op == "conv2d" else ws)
        if self.bias:
            b = np.asarray(rest.pop(0), dtype=np.float64)
            y = y + (b.reshape(1, -1, 1, 1) if self.op == "conv2d" else b)
        if self.residual:
            y = y + np.asarray(rest.pop(0), dtype=np.float64)
        if self.act == "relu":
            y = np.maximum(y, 0.0)
        elif self.act == "relu6":
            y = np.clip(y, 0.0, 6.0)
        if self.out_dtype == "int8":  # requantize: round half to even, then the zero point, then saturate
            ys, yzp = float(np.asarray(named["y_scale"]).ravel()[0]), int(np.asarray(named["y_zp"]).ravel()[0])
            y = np.clip(np.round(y / ys) + yzp, -128, 127)
        return y.astype(np.float32)


def check_weight_range(task: Task, weight: np.ndarray) -> None:
    """A clear error when an int8 task's weights fall outside its :attr:`Task.weight_range` (7-bit
    weights: a kernel's u8 x s8 pair sums would saturate int16 and be wrong)."""
    if not task.quantized or task.weight_bits == 8:
        return
    w = np.asarray(weight)
    lo, hi = task.weight_range
    if w.size and (int(w.min()) < lo or int(w.max()) > hi):
        raise ValueError(f"{task.name}: weight_bits={task.weight_bits} needs weights in [{lo}, {hi}], got "
                         f"[{int(w.min())}, {int(w.max())}] (quantize them with 7 bits, e.g. onnxruntime's "
                         f"reduce_range, or use weight_bits=8)")


def _conv2d_ref(x: np.ndarray, w: np.ndarray, p: dict) -> np.ndarray:
    n, c, _, _ = x.shape
    kk, cg, r, s = w.shape
    g = p["groups"]
    (sh, sw), (dh, dw) = p["stride"], p["dilation"]
    pt, pl, pb, pr = p["pad"]
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    hp, wp = xp.shape[2:]
    oh = (hp - dh * (r - 1) - 1) // sh + 1
    ow = (wp - dw * (s - 1) - 1) // sw + 1
    kg = kk // g
    out = np.zeros((n, kk, oh, ow))
    for ry in range(r):
        for rx in range(s):
            patch = xp[:, :, ry * dh: ry * dh + sh * (oh - 1) + 1: sh, rx * dw: rx * dw + sw * (ow - 1) + 1: sw]
            patch = patch.reshape(n, g, cg, oh, ow)
            wk = w[:, :, ry, rx].reshape(g, kg, cg)
            out += np.einsum("ngchw,gkc->ngkhw", patch, wk, optimize=True).reshape(n, kk, oh, ow)
    return out


# ----------------------------------------------------------------------------------------------
# Constructors (the public fj.ops.* names)
# ----------------------------------------------------------------------------------------------

def _sparse(task: Task, sparsity: float) -> Task:
    """``task`` with ``sparsity`` (validated by :class:`Task`); the task itself when it is 0."""
    return task if not sparsity else replace(task, sparsity=sparsity)


def _sparsify(weight: np.ndarray, sparsity: float, seed: int) -> np.ndarray:
    """A copy of ``weight`` with exactly ``round(sparsity * size)`` entries zeroed, chosen uniformly by a
    stream of their own (``seed``), so the other entries keep the dense task's values."""
    out = np.array(weight, copy=True)
    zeros = int(round(sparsity * out.size))
    out.reshape(-1)[np.random.default_rng([int(seed), 0x5BA75E]).permutation(out.size)[:zeros]] = 0
    return out


def _fraction(text: str, spec: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"sparsity={text!r} is not a number (a fraction of zero weights in [0, 1); in {spec!r})") \
            from None


def _params(**kw: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(kw.items()))


def matmul(m: int, n: int, k: int, *, batch: int | None = None, bias: bool = False, act: str | None = None,
           residual: bool = False, dtype: str = "float32", act_signed: bool = False, out_dtype: str | None = None,
           sparsity: float = 0.0, weight_bits: int = 8, limits: "_limits.Limits | dict | None" = None) -> Task:
    """``C[M, N] = A[M, K] @ B[K, N]`` (``[batch, ...]`` on every operand when ``batch`` is given).

    ``B`` is treated as the weights (packed once at load, as at inference). ``dtype`` is "float32",
    "float16" or "int8" (then ``act_signed`` and ``out_dtype``; see :class:`Task`); every constructor
    takes the same three keywords.

    Example:
        >>> matmul(512, 512, 512).flops
        268435456
    """
    mnk = {"m": _int(m, "m"), "n": _int(n, "n"), "k": _int(k, "k")}
    params = _params(**mnk) if batch is None else _params(**mnk, batch=_int(batch, "batch"))
    with _limits.override(limits):
        return _sparse(Task("matmul", params, bias, act, residual, dtype, None, act_signed, out_dtype,
                            weight_bits=weight_bits), sparsity)


def dense(n: int, in_features: int, out_features: int, *, bias: bool = False, act: str | None = None,
          residual: bool = False, dtype: str = "float32", act_signed: bool = False, out_dtype: str | None = None,
          sparsity: float = 0.0, weight_bits: int = 8, limits: "_limits.Limits | dict | None" = None) -> Task:
    """``y[N, OUT] = x[N, IN] @ W.T + b`` with ``W`` of shape ``[OUT, IN]``.

    Example:
        >>> dense(1, 4096, 1000, bias=True).input_shapes()
        [(1, 4096), (1000, 4096), (1000,)]
    """
    with _limits.override(limits):
        return _sparse(Task("dense", _params(n=_int(n, "n"), **{"in": _int(in_features, "in_features")},
                                           out=_int(out_features, "out_features")), bias, act,
                    residual, dtype, None, act_signed, out_dtype, weight_bits=weight_bits), sparsity)


def conv2d(n: int, c: int, h: int, w: int, *, out_channels: int, kernel: int | tuple[int, int] = 3,
           stride: int | tuple[int, int] = 1, padding: int | tuple[int, ...] = 0,
           dilation: int | tuple[int, int] = 1, groups: int = 1, bias: bool = False, act: str | None = None,
           residual: bool = False, dtype: str = "float32", act_signed: bool = False, out_dtype: str | None = None,
           sparsity: float = 0.0, weight_bits: int = 8, limits: "_limits.Limits | dict | None" = None) -> Task:
    """2-D convolution, NCHW input, OIHW weights ``[out_channels, c // groups, kh, kw]``.

    ``padding`` is an int, ``(pad_h, pad_w)`` or ``(top, left, bottom, right)``.

    Example:
        >>> t = conv2d(1, 64, 56, 56, out_channels=64, kernel=3, padding=1, act="relu")
        >>> t.output_shape
        (1, 64, 56, 56)
    """
    r, s = _as_pair(kernel, "kernel")
    with _limits.override(limits):
        return _sparse(Task("conv2d", _params(n=_int(n, "n"), c=_int(c, "c"), h=_int(h, "h"), w=_int(w, "w"),
                                      k=_int(out_channels, "out_channels"), r=r, s=s,
                                      stride=_as_pair(stride, "stride"), pad=_as_pad(padding),
                                      dilation=_as_pair(dilation, "dilation"), groups=_int(groups, "groups")),
                    bias, act, residual, dtype, None, act_signed, out_dtype, weight_bits=weight_bits), sparsity)


def depthwise_conv2d(n: int, c: int, h: int, w: int, *, kernel: int | tuple[int, int] = 3,
                     stride: int | tuple[int, int] = 1, padding: int | tuple[int, ...] = 0,
                     dilation: int | tuple[int, int] = 1, multiplier: int = 1, bias: bool = False,
                     act: str | None = None, residual: bool = False, dtype: str = "float32",
                     act_signed: bool = False, out_dtype: str | None = None, weight_bits: int = 8,
                     sparsity: float = 0.0, limits: "_limits.Limits | dict | None" = None) -> Task:
    """Depthwise convolution: ``conv2d`` with ``groups = c`` and ``c * multiplier`` output channels.

    Example:
        >>> depthwise_conv2d(1, 256, 28, 28, kernel=3, padding=1).input_shapes()[1]
        (256, 1, 3, 3)
    """
    if _int(multiplier, "multiplier") < 1:
        raise ValueError(f"depthwise_conv2d: multiplier must be >= 1, got {multiplier}")
    return conv2d(n, c, h, w, out_channels=c * multiplier, kernel=kernel, stride=stride, padding=padding,
                  dilation=dilation, groups=c, bias=bias, act=act, residual=residual, dtype=dtype,
                  act_signed=act_signed, out_dtype=out_dtype, weight_bits=weight_bits, sparsity=sparsity, limits=limits)


# ----------------------------------------------------------------------------------------------
# Command-line operator specs: "conv2d:n=1,c=64,h=56,w=56,k=64,r=3,stride=1,pad=1"
# ----------------------------------------------------------------------------------------------

_PRECISION_KEYS = {"dtype", "act_signed", "out_dtype", "weight_bits"}  # every op takes them (dtype=int8,act_signed=1,...)
_SPEC_KEYS = {
    "matmul": {"m", "n", "k", "batch", "bias", "act", "residual"},
    "dense": {"n", "in", "out", "bias", "act", "residual"},
    "conv2d": {"n", "c", "h", "w", "k", "r", "s", "stride", "pad", "dilation", "groups", "bias", "act", "residual"},
    "depthwise_conv2d": {"n", "c", "h", "w", "r", "s", "stride", "pad", "dilation", "multiplier", "bias", "act",
                         "residual"},
}
for _op, _keys in _SPEC_KEYS.items():  # sparse kernels: sparsity=0.9
    _keys |= _PRECISION_KEYS | ({"sparsity"} if _op != "depthwise_conv2d" else set())


def parse_spec(spec: str) -> Task:
    """Parse a command-line operator spec ``KIND:key=value,...`` into a Task.

    Example:
        >>> parse_spec("matmul:m=128,n=64,k=32").name
        'matmul_128x64x32'
    """
    kind, _, rest = spec.strip().partition(":")
    kind = kind.strip()
    if kind not in _SPEC_KEYS:
        raise ValueError(f"unknown op kind {kind!r} in spec {spec!r}; supported: {', '.join(_SPEC_KEYS)}")
    kv: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, val = item.partition("=")
        if not eq:
            raise ValueError(f"spec item {item!r} is not key=value (in {spec!r})")
        if key.strip() not in _SPEC_KEYS[kind]:
            raise ValueError(f"unknown key {key!r} for {kind}; valid keys: {', '.join(sorted(_SPEC_KEYS[kind]))}")
        if key.strip() in kv:
            raise ValueError(f"{kind}: {key.strip()}= is given twice in {spec!r}")
        kv[key.strip()] = val.strip()

    def num(name: str, default: int | None = None) -> int:
        if name not in kv:
            if default is None:
                raise ValueError(f"{kind} spec needs {name}= (got {spec!r})")
            return default
        try:
            return int(kv[name])
        except ValueError:
            raise ValueError(f"{kind}: {name}={kv[name]!r} is not an integer") from None

    def yes(name: str) -> bool:
        v = kv.get(name, "0").lower()
        if v not in ("0", "false", "no", "off", "", "1", "true", "yes", "on"):
            raise ValueError(f"{kind}: {name}={kv[name]!r} is not a yes/no value (1/0, true/false, yes/no, on/off)")
        return v in ("1", "true", "yes", "on")

    flag = {"bias": yes("bias"), "residual": yes("residual"),
            "act": (kv.get("act") or None) if kv.get("act") not in ("none", "None") else None,
            "dtype": kv.get("dtype", "float32"),
            "act_signed": yes("act_signed"),
            "out_dtype": kv.get("out_dtype") or None}
    if "weight_bits" in kv:
        flag["weight_bits"] = num("weight_bits")
    if "sparsity" in kv:
        flag["sparsity"] = _fraction(kv["sparsity"], spec)
    if kind == "matmul":
        return matmul(num("m"), num("n"), num("k"), batch=num("batch") if "batch" in kv else None, **flag)
    if kind == "dense":
        return dense(num("n", 1), num("in"), num("out"), **flag)
    r = num("r", 3)
    common = dict(kernel=(r, num("s", r)), stride=num("stride", 1), padding=num("pad", 0),
                  dilation=num("dilation", 1), **flag)
    if kind == "conv2d":
        return conv2d(num("n", 1), num("c"), num("h"), num("w"), out_channels=num("k"), groups=num("groups", 1),
                      **common)
    return depthwise_conv2d(num("n", 1), num("c"), num("h"), num("w"), multiplier=num("multiplier", 1), **common)
