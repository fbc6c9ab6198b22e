"""Stage ① importers of the spatial ops real exporters add (see ``felixjax.onnx_ops``): Resize / Upsample as
per-axis tap tables, ConvTranspose as zero insertion plus a Conv, and the lifting of 1-D convolution and
pooling to 2-D with a unit height."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from onnx import TensorProto

from felixjax.graph_passes import Node
from felixjax.onnx_ops import _node, _tmp

# ---- Resize / Upsample ---------------------------------------------------------------------------

def resize_taps(in_size: int, out_size: int, scale: float, mode: str, ctm: str, nearest_mode: str,
                cubic_a: float = -0.75, exclude_outside: bool = False, antialias: bool = False,
                roi: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The 1-D resize of one axis as taps: ``y[o] = sum_t weight[o, t] * x[index[o, t]]`` (and rows that are
    the extrapolation value), computed by onnx's reference resize on the identity matrix (exact semantics)."""
    from onnx.reference.ops import op_resize as R

    if ctm == "tf_half_pixel_for_nn":  # opset 11-12 (tf2onnx's TF nearest resize; onnx's reference lacks it)
        return _tf_nearest_taps(in_size, out_size, scale, nearest_mode), np.ones((out_size, 1)), None
    if mode == "nearest":
        def coeffs(r, s):
            return R._nearest_coeffs(r, mode=nearest_mode)
    elif mode == "cubic":
        f = R._cubic_coeffs_antialias if antialias else R._cubic_coeffs

        def coeffs(r, s):
            return f(r, s, A=cubic_a)
    else:
        coeffs = R._linear_coeffs_antialias if antialias else R._linear_coeffs
    w = R._interpolate_1d_along_axis(np.eye(in_size), 0, scale, out_size, coeffs, roi=list(roi) if roi else None,
                                     extrapolation_value=np.nan, coordinate_transformation_mode=ctm,
                                     exclude_outside=exclude_outside)
    extrapolated = np.isnan(w).any(axis=1)
    w = np.where(np.isnan(w), 0.0, w)
    taps = max(1, int((w != 0).sum(axis=1).max()))
    order = np.argsort(w == 0, axis=1, kind="stable")[:, :taps]   # nonzero columns first, in index order
    index = order.astype(np.int64)
    weight = np.take_along_axis(w, order, axis=1)
    return index, weight, (extrapolated if extrapolated.any() else None)


def _tf_nearest_taps(in_size: int, out_size: int, scale: float, nearest_mode: str) -> np.ndarray:
    """Nearest taps of ``tf_half_pixel_for_nn``: output ``o`` reads ``(o + 0.5) / scale``, rounded by
    ``nearest_mode``, clamped to the input.

    Example:
        >>> _tf_nearest_taps(4, 8, 2.0, "floor").ravel().tolist()
        [0, 0, 1, 1, 2, 2, 3, 3]
    """
    x = (np.arange(out_size) + 0.5) / scale
    frac = x - np.floor(x)
    if nearest_mode == "floor":
        i = np.floor(x)
    elif nearest_mode == "ceil":
        i = np.ceil(x)
    elif nearest_mode == "round_prefer_ceil":
        i = np.where(frac == 0.5, np.ceil(x), np.round(x))
    else:  # round_prefer_floor
        i = np.where(frac == 0.5, np.floor(x), np.round(x))
    return np.clip(i, 0, in_size - 1).astype(np.int64).reshape(-1, 1)


def _resize(ctx: Any) -> list[Node]:
    x = ctx.input(0)
    xs = ctx.shape(x)
    rank = len(xs)
    a = ctx.attrs
    mode = a.get("mode", "nearest")
    mode = "linear" if mode == "bilinear" else mode
    if mode not in ("nearest", "linear", "cubic"):
        ctx.fail(f"mode={mode!r} is not supported (supported: nearest, linear, cubic)")
    roi = None
    legacy = ctx.op == "Upsample" or ctx.opset < 11
    if legacy:  # nearest: floor when upsampling, ceil when downsampling an axis (onnx's tests, onnxruntime)
        ctm, nearest_mode = "asymmetric", "floor"
        if "scales" in a:
            scales = [float(s) for s in a["scales"]]
        elif "height_scale" in a:
            scales = [1.0, 1.0, float(a["height_scale"]), float(a["width_scale"])]
        else:
            scales = [float(s) for s in ctx.const(ctx.input(1), "scales").reshape(-1)]
        sizes, axes, policy = None, list(range(rank)), "stretch"
        extrap, cubic_a, exclude, antialias = 0.0, -0.75, False, False
        if mode == "cubic":
            ctx.fail("mode='cubic' needs opset 11 or newer")
    else:
        ctm = a.get("coordinate_transformation_mode", "half_pixel")
        nearest_mode = a.get("nearest_mode", "round_prefer_floor")
        extrap, cubic_a = float(a.get("extrapolation_value", 0.0)), float(a.get("cubic_coeff_a", -0.75))
        exclude, antialias = bool(a.get("exclude_outside", 0)), bool(a.get("antialias", 0))
        policy = a.get("keep_aspect_ratio_policy", "stretch")
        axes = [ctx.axis(int(v), rank, "axes entry") for v in a.get("axes", range(rank))]
        scales = sizes = None
        if ctx.input(2) and ctx.const(ctx.input(2), "scales").size:
            scales = [float(s) for s in ctx.consts[ctx.input(2)].reshape(-1)]
        if ctx.input(3) and ctx.const(ctx.input(3), "sizes").size:
            sizes = [int(s) for s in ctx.consts[ctx.input(3)].reshape(-1)]
        if ctm == "tf_crop_and_resize":
            r = [float(v) for v in ctx.const(ctx.input(1), "roi").reshape(-1)]
            if len(r) != 2 * len(axes):
                ctx.fail(f"roi has {len(r)} entries, expected {2 * len(axes)}")
            roi = {ax: (r[k], r[k + len(axes)]) for k, ax in enumerate(axes)}
    known = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
             "tf_crop_and_resize", "tf_half_pixel_for_nn")
    if ctm not in known:
        ctx.fail(f"coordinate_transformation_mode={ctm!r} is not supported (supported: {', '.join(known)})")
    if ctm == "tf_half_pixel_for_nn" and mode != "nearest":
        ctx.fail(f"coordinate_transformation_mode='tf_half_pixel_for_nn' with mode={mode!r} is not supported (it is "
                 f"for nearest)")
    if nearest_mode not in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
        ctx.fail(f"nearest_mode={nearest_mode!r} is not supported")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        ctx.fail(f"keep_aspect_ratio_policy={policy!r} is not supported")
    full_scale, full_out = [1.0] * rank, list(xs)
    if sizes is not None:
        if len(sizes) != len(axes):
            ctx.fail(f"sizes has {len(sizes)} entries, expected {len(axes)}")
        for ax, s in zip(axes, sizes):
            full_out[ax], full_scale[ax] = s, s / xs[ax]
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            scale = pick(full_scale[ax] for ax in axes)
            for ax in axes:
                full_scale[ax], full_out[ax] = scale, int(scale * xs[ax] + 0.5)
    elif scales is not None:
        if len(scales) != len(axes):
            ctx.fail(f"scales has {len(scales)} entries, expected {len(axes)}")
        for ax, s in zip(axes, scales):
            if s <= 0:
                ctx.fail(f"scale {s} must be positive")
            full_scale[ax], full_out[ax] = s, int(s * xs[ax])
    else:
        ctx.fail("needs scales or sizes")
    if min(full_out) <= 0:
        ctx.fail(f"the output shape {tuple(full_out)} is empty")
    taps = []
    for ax in range(rank):
        axis_roi = roi.get(ax) if roi else None
        if math.isclose(full_scale[ax], 1.0) and full_out[ax] == xs[ax] and (
                axis_roi is None or (math.isclose(axis_roi[0], 0.0) and math.isclose(axis_roi[1], 1.0))):
            continue
        if roi is not None and axis_roi is None:
            axis_roi = (0.0, 1.0)
        if xs[ax] * full_out[ax] > 1 << 26:  # the tap tables come from an (out x in) matrix
            ctx.fail(f"resizing axis {ax} from {xs[ax]} to {full_out[ax]} is too large (in x out > 2**26)")
        nearest = "ceil" if legacy and full_scale[ax] < 1 else nearest_mode
        index, weight, extra = resize_taps(xs[ax], full_out[ax], full_scale[ax], mode, ctm, nearest, cubic_a,
                                           exclude, antialias, axis_roi)
        taps.append((ax, index, weight, extra))
    if not taps:
        return [_node(ctx, "Identity", [x])]
    return [_node(ctx, "Resize", [x], {"taps": tuple(taps), "extrapolation_value": extrap,
                                       "shape": tuple(full_out)})]


# ---- ConvTranspose ---------------------------------------------------------------------------------

def _conv_transpose(ctx: Any) -> list[Node]:
    x, w, b = ctx.input(0), ctx.input(1), ctx.input(2)
    xs, ws = ctx.shape(x), ctx.shape(w)
    if len(xs) != 4:
        ctx.fail(f"only 2-D transposed convolution (4-D NCHW input) is supported; the input is {len(xs)}-D")
    g = int(ctx.attrs.get("group", 1))
    if len(ws) != 4 or g < 1:
        ctx.fail(f"weights {ws} with group={g}: 2-D transposed convolution needs 4-D weights and group >= 1")
    cin, cout_g, kh, kw = ws
    if cin != xs[1] or cin % g:
        ctx.fail(f"weights {ws} do not fit input {xs} with group={g}")
    kernel = (kh, kw)
    if tuple(int(k) for k in ctx.attrs.get("kernel_shape", kernel)) != kernel:
        ctx.fail(f"kernel_shape does not match the weights {ws}")
    s, d = ctx.pair("strides", 1), ctx.pair("dilations", 1)
    op = ctx.pair("output_padding", 0)
    auto = ctx.attrs.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER") or "output_shape" in ctx.attrs and auto != "VALID":
        out = [int(v) for v in ctx.attrs["output_shape"]][-2:] if "output_shape" in ctx.attrs else \
            [xs[2] * s[0], xs[3] * s[1]]
        pads_b, pads_e = [], []
        for i in range(2):  # the spec's split of the total padding (given pads are ignored, as onnxruntime does)
            total = s[i] * (xs[2 + i] - 1) + op[i] + (kernel[i] - 1) * d[i] + 1 - out[i]
            if total <= -s[i]:  # an input one larger would give it (onnxruntime refuses too)
                ctx.fail(f"output_shape {out} is more than stride - 1 past the size the input gives "
                         f"({out[i] + total} on axis {i})")
            small, big = total // 2, total - total // 2
            if total <= 0:  # an output past the natural one (up to stride - 1 more) grows at the end
                pads_b.append(0)
                pads_e.append(total)
            else:  # SAME_UPPER: the larger half at the end; SAME_LOWER and NOTSET: at the start
                pads_b.append(small if auto == "SAME_UPPER" else big)
                pads_e.append(big if auto == "SAME_UPPER" else small)
    elif auto == "VALID":
        pads_b, pads_e = [0, 0], [0, 0]
    elif auto == "NOTSET":
        p = [int(v) for v in ctx.attrs.get("pads", [0, 0, 0, 0])]
        if len(p) != 4:
            ctx.fail(f"pads={p} must have 4 entries (2-D spatial only)")
        pads_b, pads_e = p[:2], p[2:]
    else:
        ctx.fail(f"auto_pad={auto!r} is not supported")
    n, c, h, wd = xs
    out_hw = [s[i] * (xs[2 + i] - 1) + op[i] + (kernel[i] - 1) * d[i] + 1 - pads_b[i] - pads_e[i] for i in range(2)]
    if min(out_hw) <= 0:
        ctx.fail(f"the output would be empty ({out_hw})")
    nodes = []
    cur, cur_shape = x, (n, c, h, wd)
    if s != (1, 1):   # zero insertion: (n,c,h,1,w,1) -> pad to (n,c,h,sh,w,sw) -> (n,c,h*sh,w*sw)
        r1 = _tmp(ctx, "x6", (n, c, h, 1, wd, 1))
        r2 = _tmp(ctx, "x6z", (n, c, h, s[0], wd, s[1]))
        cur_shape = (n, c, h * s[0], wd * s[1])
        r3 = _tmp(ctx, "zeros_inserted", cur_shape)
        zero = ctx.new_const("zero", np.float32(0.0))
        nodes += [_node(ctx, "Reshape", [x], {"shape": (n, c, h, 1, wd, 1)}, [r1]),
                  _node(ctx, "Pad", [r1, zero], {"pads": ((0, 0), (0, 0), (0, 0), (0, s[0] - 1), (0, 0), (0, s[1] - 1)),
                                                 "mode": "constant"}, [r2]),
                  _node(ctx, "Reshape", [r2], {"shape": cur_shape}, [r3])]
        cur = r3
    begin = [d[i] * (kernel[i] - 1) - pads_b[i] for i in range(2)]
    end = [d[i] * (kernel[i] - 1) - pads_e[i] + op[i] - (s[i] - 1) for i in range(2)]
    if min(begin + end) < 0:  # crop first; the Conv pads the rest
        crop = [(min(0, begin[i]), min(0, end[i])) for i in range(2)]
        cur_shape = (n, c) + tuple(cur_shape[2 + i] + crop[i][0] + crop[i][1] for i in range(2))
        cropped = _tmp(ctx, "cropped", cur_shape)
        zero = ctx.new_const("zero", np.float32(0.0))
        nodes.append(_node(ctx, "Pad", [cur, zero], {"pads": ((0, 0), (0, 0)) + tuple(crop), "mode": "constant"},
                           [cropped]))
        cur = cropped
    conv_pads = (max(0, begin[0]), max(0, begin[1]), max(0, end[0]), max(0, end[1]))
    # weights (cin, cout/g, kh, kw) -> (cout, cin/g, kh, kw), spatially flipped
    cout = cout_g * g
    w5 = _tmp(ctx, "w5", (g, cin // g, cout_g, kh, kw))
    wt = _tmp(ctx, "w5t", (g, cout_g, cin // g, kh, kw))
    w4 = _tmp(ctx, "w4", (cout, cin // g, kh, kw))
    wf = _tmp(ctx, "w_flipped", (cout, cin // g, kh, kw))
    nodes += [_node(ctx, "Reshape", [w], {"shape": (g, cin // g, cout_g, kh, kw)}, [w5]),
              _node(ctx, "Transpose", [w5], {"perm": (0, 2, 1, 3, 4)}, [wt]),
              _node(ctx, "Reshape", [wt], {"shape": (cout, cin // g, kh, kw)}, [w4]),
              _node(ctx, "Slice", [w4], {"slices": ((0, cout, 1), (0, cin // g, 1), (kh - 1, None, -1),
                                                    (kw - 1, None, -1))}, [wf])]
    attrs = {"kernel": kernel, "strides": (1, 1), "dilations": d, "groups": g, "pads": conv_pads}
    # the output's shape as computed here: onnx's shape inference drops its spatial dims where output_shape is
    # smaller than the input (onnxruntime runs such a node)
    ctx.types[ctx.outputs[0]] = (ctx.types.get(ctx.outputs[0], (TensorProto.FLOAT, None))[0], (n, cout, *out_hw))
    return nodes + [_node(ctx, "Conv", [cur, wf] + ([b] if b else []), attrs)]


# ---- 1-D convolution and pooling: lifted to 2-D with a unit height -----------------------------------

_LIFT_ATTRS = {"kernel_shape": 1, "strides": 1, "dilations": 1, "output_padding": 0, "output_shape": 1}


def lift_1d(importer: Any) -> Any:
    """Wrap a 2-D importer (Conv, ConvTranspose, MaxPool, AveragePool) so a 3-D (N, C, L) input runs as
    (N, C, 1, L): attributes get a unit leading spatial entry, data and weights a unit height, and the
    output is reshaped back."""

    def run(ctx: Any) -> list[Node]:
        x = ctx.input(0)
        xs = ctx.shape(x)
        if len(xs) != 3:
            return importer(ctx)
        for key, unit in _LIFT_ATTRS.items():
            if key in ctx.attrs:
                v = [int(a) for a in ctx.attrs[key]]
                ctx.attrs[key] = ([unit] + v) if len(v) == 1 else v
        if "pads" in ctx.attrs and len(ctx.attrs["pads"]) == 2:
            p = [int(a) for a in ctx.attrs["pads"]]
            ctx.attrs["pads"] = [0, p[0], 0, p[1]]
        nodes = []
        x4 = _tmp(ctx, "x4", (xs[0], xs[1], 1, xs[2]))
        ctx.shapes[x4] = (xs[0], xs[1], 1, xs[2])
        nodes.append(_node(ctx, "Reshape", [x], {"shape": ctx.shapes[x4]}, [x4]))
        inputs = [x4] + list(ctx.inputs[1:])
        if ctx.op in ("Conv", "ConvTranspose"):
            w = ctx.input(1)
            ws = ctx.shape(w)
            w4s = (ws[0], ws[1], 1, ws[2])
            if w in ctx.consts:
                inputs[1] = ctx.new_const("w4", ctx.consts[w].reshape(w4s))
            else:
                inputs[1] = _tmp(ctx, "w4", w4s)
                ctx.shapes[inputs[1]] = w4s
                nodes.append(_node(ctx, "Reshape", [w], {"shape": w4s}, [inputs[1]]))
        out = ctx.outputs[0]
        ys = ctx.out_shape(out)
        y4 = _tmp(ctx, "y4", (ys[0], ys[1], 1, ys[2]))
        ctx.inputs, ctx.outputs = inputs, [y4] + list(ctx.outputs[1:])
        nodes += importer(ctx)
        return nodes + [_node(ctx, "Reshape", [y4], {"shape": ys}, [out])]

    return run


SPATIAL_IMPORTERS = {"Resize": _resize, "Upsample": _resize, "ConvTranspose": lift_1d(_conv_transpose)}
