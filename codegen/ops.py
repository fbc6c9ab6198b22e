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
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import limits as _limits
from .ir import DTypes

ACTIVATIONS = (None, "relu", "relu6")
OPS = ("matmul", "dense", "conv2d")


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

def _as_pair(v: int | tuple[int, int] | list[int], name: str) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"{name} must be an int or a pair of ints, got {v!r}")
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _as_pad(v: int | tuple[int, ...] | list[int]) -> tuple[int, int, int, int]:
    if isinstance(v, (tuple, list)):
        if len(v) == 2:
            return int(v[0]), int(v[1]), int(v[0]), int(v[1])
        if len(v) != 4:
            raise ValueError(f"padding must be an int, (pad_h, pad_w) or (top, left, bottom, right), got {v!r}")
        return tuple(int(x) for x in v)  # type: ignore[return-value]
    return (int(v),) * 4  # type: ignore[return-value]


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

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown op {self.op!r}; supported: {', '.join(OPS)}")
        if self.act not in ACTIVATIONS:
            raise ValueError(f"act must be one of None, 'relu', 'relu6'; got {self.act!r}")
        if self.dtype != "float32":
            raise ValueError(f"dtype {self.dtype!r} is not supported yet; supported: float32 (float16 and int8 "
                             f"with int32 accumulation come with low-precision kernels)")
        if self.dtypes is not None:
            dts = DTypes(**self.dtypes) if isinstance(self.dtypes, dict) else self.dtypes
            if not isinstance(dts, DTypes):
                raise ValueError(f"dtypes must be a codegen.ir.DTypes, got {type(self.dtypes).__name__}")
            if dts != DTypes.of(self.dtype):
                raise ValueError(f"dtypes {dts} are not supported yet; supported: float32 for every role "
                                 f"(low-precision kernels come later)")
            object.__setattr__(self, "dtypes", None)
        for k, v in self.params:
            vals = v if isinstance(v, tuple) else (v,)
            if any((not isinstance(x, int)) or isinstance(x, bool) for x in vals):
                raise ValueError(f"{self.op} parameter {k}={v!r} must be integer")
        self.check_size()  # validates shapes, then sizes against codegen.limits (before any allocation)

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
                        d.get("dtype", "float32"), dts)

    def check_size(self, limits: "_limits.Limits | dict | None" = None, *, itemsize: int = 4) -> None:
        """Validate the shapes, then raise :class:`codegen.limits.SizeLimitError` if an extent, a buffer
        (inputs and output, ``itemsize`` bytes per element), all of them together, or the FLOPs exceed
        ``limits`` (default: :func:`codegen.limits.current`). Allocates nothing."""
        con = self.contraction()
        lim = _limits.resolve(limits)
        for a in con.axes:
            _limits.check_extent(f"axis {a.name}", a.extent, lim, what=self.name)
        names = ["data", "weight"] + (["bias"] if self.bias else []) + (["residual"] if self.residual else [])
        buffers = list(zip(names, self.input_shapes())) + [("out", con.out.shape)]
        if con.data.shape != con.data_api_shape:
            buffers.append(("padded data", con.data.shape))
        _limits.check_buffers(buffers, lim, itemsize=itemsize, what=self.name)
        _limits.check_flops(self.flops, lim, what=self.name)

    @property
    def buffer_dtypes(self) -> DTypes:
        """Element types per role: ``dtypes``, else those of ``dtype``."""
        return self.dtypes if self.dtypes is not None else DTypes.of(self.dtype)

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
        else:
            dw = p["groups"] == p["c"] and p["groups"] > 1
            kind = "dwconv2d" if dw else "conv2d"
            s = (f"{kind}_{p['n']}x{p['c']}x{p['h']}x{p['w']}_k{p['k']}_{p['r']}x{p['s']}"
                 f"_s{p['stride'][0]}_p{p['pad'][0]}")
            if p["groups"] > 1 and not dw:
                s += f"_g{p['groups']}"
        if self.bias:
            s += "_bias"
        if self.residual:
            s += "_res"
        if self.act:
            s += f"_{self.act}"
        return s

    def __str__(self) -> str:
        return self.name

    # ---- shapes -------------------------------------------------------------------------------
    def contraction(self) -> Contraction:
        """Axes and accesses of this task (see module docstring)."""
        p = self.p
        if self.op in ("matmul", "dense"):
            if self.op == "matmul":
                batch = p.get("batch") or 0
                m, n, k = p["m"], p["n"], p["k"]
            else:
                batch, m, n, k = 0, p["n"], p["out"], p["in"]
            for name, v in (("m", m), ("n", n), ("k", k)):
                if v < 1:
                    raise ValueError(f"{self.op}: {name} must be >= 1, got {v}")
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
        for name, v in (("n", n), ("c", c), ("h", h), ("w", w), ("k", kk), ("r", r), ("s", s), ("groups", g),
                        ("stride", min(sh, sw)), ("dilation", min(dh, dw))):
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

    def input_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the inputs in API order: data, weights, then bias, then residual."""
        con = self.contraction()
        shapes = [con.data_api_shape, con.weight.shape]
        if self.bias:
            shapes.append(con.bias.shape)  # type: ignore[union-attr]
        if self.residual:
            shapes.append(con.out.shape)
        return shapes

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
        """Random float32 inputs in API order (data, weights, bias, residual), uniform in [-1, 1).

        Raises :class:`codegen.limits.SizeLimitError` before allocating when the inputs (generated in
        float64, then cast) exceed ``limits``."""
        self.check_size(limits, itemsize=8)
        rng = np.random.default_rng(seed)
        return [rng.uniform(-1.0, 1.0, size=s).astype(np.float32) for s in self.input_shapes()]

    def reference(self, *arrays: np.ndarray, limits: "_limits.Limits | dict | None" = None) -> np.ndarray:
        """Numpy reference output (computed in float64, returned as float32).

        Raises :class:`codegen.limits.SizeLimitError` before allocating when the float64 copies or the
        FLOPs exceed ``limits``."""
        self.check_size(limits, itemsize=8)
        shapes = self.input_shapes()
        if len(arrays) != len(shapes):
            raise ValueError(f"{self.name} takes {len(shapes)} inputs (data, weights"
                             f"{', bias' if self.bias else ''}{', residual' if self.residual else ''}), "
                             f"got {len(arrays)}")
        for i, (a, s) in enumerate(zip(arrays, shapes)):
            if tuple(np.shape(a)) != tuple(s):
                raise ValueError(f"{self.name}: input {i} has shape {np.shape(a)}, expected {s}")
        x, wt = (np.asarray(a, dtype=np.float64) for a in arrays[:2])
        rest = list(arrays[2:])
        p = self.p
        if self.op == "matmul":
            y = np.matmul(x, wt)
        elif self.op == "dense":
            y = x @ wt.T
        else:
            y = _conv2d_ref(x, wt, p)
        if self.bias:
            b = np.asarray(rest.pop(0), dtype=np.float64)
            y = y + (b.reshape(1, -1, 1, 1) if self.op == "conv2d" else b)
        if self.residual:
            y = y + np.asarray(rest.pop(0), dtype=np.float64)
        if self.act == "relu":
            y = np.maximum(y, 0.0)
        elif self.act == "relu6":
            y = np.clip(y, 0.0, 6.0)
        return y.astype(np.float32)


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

def _params(**kw: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(kw.items()))


def matmul(m: int, n: int, k: int, *, batch: int | None = None, bias: bool = False, act: str | None = None,
           residual: bool = False, limits: "_limits.Limits | dict | None" = None) -> Task:
    """``C[M, N] = A[M, K] @ B[K, N]`` (``[batch, ...]`` on every operand when ``batch`` is given).

    ``B`` is treated as the weights (packed once at load, as at inference).

    Example:
        >>> matmul(512, 512, 512).flops
        268435456
    """
    params = _params(m=int(m), n=int(n), k=int(k)) if not batch else _params(m=int(m), n=int(n), k=int(k),
                                                                             batch=int(batch))
    with _limits.override(limits):
        return Task("matmul", params, bias, act, residual)


def dense(n: int, in_features: int, out_features: int, *, bias: bool = False, act: str | None = None,
          residual: bool = False, limits: "_limits.Limits | dict | None" = None) -> Task:
    """``y[N, OUT] = x[N, IN] @ W.T + b`` with ``W`` of shape ``[OUT, IN]``.

    Example:
        >>> dense(1, 4096, 1000, bias=True).input_shapes()
        [(1, 4096), (1000, 4096), (1000,)]
    """
    with _limits.override(limits):
        return Task("dense", _params(n=int(n), **{"in": int(in_features)}, out=int(out_features)), bias, act,
                    residual)


def conv2d(n: int, c: int, h: int, w: int, *, out_channels: int, kernel: int | tuple[int, int] = 3,
           stride: int | tuple[int, int] = 1, padding: int | tuple[int, ...] = 0,
           dilation: int | tuple[int, int] = 1, groups: int = 1, bias: bool = False, act: str | None = None,
           residual: bool = False, limits: "_limits.Limits | dict | None" = None) -> Task:
    """2-D convolution, NCHW input, OIHW weights ``[out_channels, c // groups, kh, kw]``.

    ``padding`` is an int, ``(pad_h, pad_w)`` or ``(top, left, bottom, right)``.

    Example:
        >>> t = conv2d(1, 64, 56, 56, out_channels=64, kernel=3, padding=1, act="relu")
        >>> t.output_shape
        (1, 64, 56, 56)
    """
    r, s = _as_pair(kernel, "kernel")
    with _limits.override(limits):
        return Task("conv2d", _params(n=int(n), c=int(c), h=int(h), w=int(w), k=int(out_channels), r=r, s=s,
                                      stride=_as_pair(stride, "stride"), pad=_as_pad(padding),
                                      dilation=_as_pair(dilation, "dilation"), groups=int(groups)),
                    bias, act, residual)


def depthwise_conv2d(n: int, c: int, h: int, w: int, *, kernel: int | tuple[int, int] = 3,
                     stride: int | tuple[int, int] = 1, padding: int | tuple[int, ...] = 0,
                     dilation: int | tuple[int, int] = 1, multiplier: int = 1, bias: bool = False,
                     act: str | None = None, residual: bool = False,
                     limits: "_limits.Limits | dict | None" = None) -> Task:
    """Depthwise convolution: ``conv2d`` with ``groups = c`` and ``c * multiplier`` output channels.

    Example:
        >>> depthwise_conv2d(1, 256, 28, 28, kernel=3, padding=1).input_shapes()[1]
        (256, 1, 3, 3)
    """
    return conv2d(n, c, h, w, out_channels=c * multiplier, kernel=kernel, stride=stride, padding=padding,
                  dilation=dilation, groups=c, bias=bias, act=act, residual=residual, limits=limits)


# ----------------------------------------------------------------------------------------------
# Command-line operator specs: "conv2d:n=1,c=64,h=56,w=56,k=64,r=3,stride=1,pad=1"
# ----------------------------------------------------------------------------------------------

_SPEC_KEYS = {
    "matmul": {"m", "n", "k", "batch", "bias", "act", "residual"},
    "dense": {"n", "in", "out", "bias", "act", "residual"},
    "conv2d": {"n", "c", "h", "w", "k", "r", "s", "stride", "pad", "dilation", "groups", "bias", "act", "residual"},
    "depthwise_conv2d": {"n", "c", "h", "w", "r", "s", "stride", "pad", "dilation", "multiplier", "bias", "act",
                         "residual"},
}


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

    flag = {"bias": kv.get("bias", "0") not in ("0", "false", "False", ""),
            "residual": kv.get("residual", "0") not in ("0", "false", "False", ""),
            "act": (kv.get("act") or None) if kv.get("act") not in ("none", "None") else None}
    if kind == "matmul":
        return matmul(num("m"), num("n"), num("k"), batch=num("batch", 0) or None, **flag)
    if kind == "dense":
        return dense(num("n", 1), num("in"), num("out"), **flag)
    r = num("r", 3)
    common = dict(kernel=(r, num("s", r)), stride=num("stride", 1), padding=num("pad", 0),
                  dilation=num("dilation", 1), **flag)
    if kind == "conv2d":
        return conv2d(num("n", 1), num("c"), num("h"), num("w"), out_channels=num("k"), groups=num("groups", 1),
                      **common)
    return depthwise_conv2d(num("n", 1), num("c"), num("h"), num("w"), multiplier=num("multiplier", 1), **common)
