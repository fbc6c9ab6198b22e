"""Low-precision benchmark (issue 16): fp32 / fp16 / int8 kernels, default and tuned, next to onnxruntime.

A table in the form of the DLAS study: for a 3x3 conv, a 1x1 conv, a depthwise conv, a batch-1 dense
layer and a transformer-style matmul, at 1 and 2 threads,

* ours, per dtype: the default schedule (``Space.default()`` of the default sketch) and the best of
  ``--trials`` candidates tuned at that dtype (``fj.tune``, same strategy and trials for every dtype);
* onnxruntime: fp32, int8 (``onnxruntime.quantization.quantize_static``, QOperator: QLinearConv /
  QLinearMatMul, per-channel int8 weights, uint8 activations; its graph quantizes the float input
  and dequantizes the output, ours takes the quantized input and dequantizes in the epilogue) and
  fp16 (``onnxruntime.transformers.float16``) where the CPU provider runs it;

``speedup`` is against our tuned fp32 at the same thread count; ``expected`` is the FLOP ratio as in
DLAS (1.0 for a change of dtype; the sparse rows of ``benchmarks/sparse.py`` carry their own and are
merged with ``--merge rows.json``); ``achieved/expected`` is their ratio. Every contender's output is
checked against ``Task.reference`` (within ``Task.tolerance`` for ours, 5e-2 of the output's range
for onnxruntime's quantized and fp16 models) before timing. All contenders of a layer and thread
count are timed interleaved (``felixjax.baselines.time_interleaved``); compare ratios within a run.

Usage:
    python benchmarks/lowp.py --quick                  # smoke run: tiny layers, 4 random trials, 1 thread
    python benchmarks/lowp.py --trials 64 --threads 1,2 --out results/lowp.json
    python benchmarks/lowp.py --merge results/sparse.json   # add the sparse / pruned rows to the table
    python benchmarks/lowp.py --trials 0 --threads 1 --layers conv1x1,conv3x3,matmul --dtypes int8,int8_w7 --cpu-time
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
try:
    import felixjax  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import felixjax as fj  # noqa: E402
from codegen import ops  # noqa: E402
from codegen.build import build  # noqa: E402
from codegen.lower import Plan, lower  # noqa: E402
from codegen.measure import TimingProtocol, load_kernel_library  # noqa: E402
from codegen.measure_records import check_output  # noqa: E402
from codegen.renderers.c import render  # noqa: E402
from codegen.runtime import use_threads
from codegen.space import Space, default_sketch  # noqa: E402
from codegen.target import Target  # noqa: E402
from felixjax import baselines  # noqa: E402

DTYPES = ("float32", "float16", "int8", "int8_w7")
# "int8_w7": int8 with 7-bit weights (Task.weight_bits=7, onnxruntime's reduce_range, which its int8 model
# here uses too): the AVX2 vpmaddubsw groups-of-four path (codegen.lower.int8_pairs)
ROW_KEYS = ("layer", "variant", "dtype", "threads", "ms", "speedup", "expected", "achieved_over_expected", "note")


def layers(quick: bool) -> dict[str, callable]:
    """Layer name -> ``f(dtype) -> Task`` (compute-bound: conv3x3, conv1x1, matmul)."""
    if quick:
        return {"conv3x3": lambda d: ops.conv2d(1, 16, 14, 14, out_channels=16, kernel=3, padding=1, dtype=d),
                "conv1x1": lambda d: ops.conv2d(1, 32, 14, 14, out_channels=16, kernel=1, dtype=d),
                "dwconv3x3": lambda d: ops.depthwise_conv2d(1, 32, 14, 14, kernel=3, padding=1, dtype=d),
                "dense_b1": lambda d: ops.dense(1, 128, 64, dtype=d),
                "matmul": lambda d: ops.matmul(32, 64, 64, dtype=d)}
    return {"conv3x3": lambda d: ops.conv2d(1, 64, 56, 56, out_channels=64, kernel=3, padding=1, dtype=d),
            "conv1x1": lambda d: ops.conv2d(1, 256, 28, 28, out_channels=128, kernel=1, dtype=d),
            "dwconv3x3": lambda d: ops.depthwise_conv2d(1, 128, 56, 56, kernel=3, padding=1, dtype=d),
            "dense_b1": lambda d: ops.dense(1, 1024, 1024, dtype=d),
            "matmul": lambda d: ops.matmul(128, 768, 768, dtype=d)}


class OurKernel:
    """A built kernel on prepared buffers of its own dtypes, timed by the library's C loop ``fj_time``."""

    def __init__(self, plan: Plan, arrays: list[np.ndarray], threads: int):
        b = build(render(plan))
        if b.status != "ok":
            raise RuntimeError(f"{plan.space.task.name}: build failed: {b.error}")
        self.lib, self.threads, self.plan = load_kernel_library(b.lib_path), threads, plan
        self.bufs = [np.ascontiguousarray(a) for a in plan.kernel_inputs(list(arrays))]
        self.out = np.empty(plan.space.task.output_shape, dtype=plan.arg_dtypes()[-1])
        self.ws = np.zeros(plan.workspace_bytes + 64, np.uint8)
        ws = self.ws[-self.ws.ctypes.data % 64:]
        ptrs = [b.ctypes.data for b in self.bufs] + [self.out.ctypes.data, ws.ctypes.data]
        self.ptrs = (ctypes.c_void_p * len(ptrs))(*ptrs)

    def timeit(self, number: int) -> float:
        use_threads(self.lib.fj_set_threads, self.threads)  # (recorded: the kernels' own calls see it)
        return float(self.lib.fj_time(self.ptrs, int(number)))

    def __call__(self) -> None:
        self.timeit(1)


class OrtModel:
    """An onnxruntime session on a float input (fp32, its int8 quantization, or its fp16 conversion)."""

    def __init__(self, model, feeds: dict[str, np.ndarray], threads: int):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        self.session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        self.feeds = feeds

    def __call__(self):
        return self.session.run(None, self.feeds)[0]


def ort_variants(task32: ops.Task, arrays32: list[np.ndarray], threads: int) -> dict[str, tuple]:
    """name -> (callable, note): onnxruntime fp32, int8 (QOperator) and fp16, or the reason one does not run."""
    out: dict[str, tuple] = {}
    model = baselines.onnx_model(task32, arrays32)
    x = np.ascontiguousarray(arrays32[0], np.float32)
    out["float32"] = (OrtModel(model, {"x": x}, threads), "")
    try:
        import onnx
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.items = iter([{"x": x}])

            def get_next(self):
                return next(self.items, None)

        with tempfile.TemporaryDirectory() as tmp:
            src, dst = Path(tmp) / "f32.onnx", Path(tmp) / "q8.onnx"
            onnx.save(model, src)
            # reduce_range: 7-bit weights, as onnxruntime advises on AVX2 / AVX512 without VNNI (its u8 x s8
            # vpmaddubsw kernels saturate int16 pairs otherwise: 26% error measured on the 3x3 conv here)
            quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QOperator, per_channel=True,
                            reduce_range=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
            q = onnx.load(dst)
        ops_used = sorted({n.op_type for n in q.graph.node})
        out["int8"] = (OrtModel(q, {"x": x}, threads), "+".join(ops_used))
    except Exception as e:  # noqa: BLE001 - reported in the table
        out["int8"] = (None, f"does not run: {type(e).__name__}: {str(e)[:80]}")
    try:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        m16 = convert_float_to_float16(model, keep_io_types=True)
        out["float16"] = (OrtModel(m16, {"x": x}, threads), "fp16 graph, fp32 I/O")
    except Exception as e:  # noqa: BLE001
        out["float16"] = (None, f"does not run: {type(e).__name__}: {str(e)[:80]}")
    return out


def tuned_config(task: ops.Task, target: Target, args, threads: int):
    # one run per thread count (the database also keys records by thread count since b33f6e3; before,
    # a 2-thread tuning resumed, and reused, the 1-thread one)
    res = fj.tune(task, target, strategy=args.strategy, trials=args.trials, db=args.db, seed=0, threads=threads,
                  run=f"lowp:{threads}t", progress=False, protocol=TimingProtocol.quick() if args.quick else None)
    best = res.best
    if best is None:  # a busy machine marks every timing "noisy": take the fastest checked one anyway
        timed = [r for r in res.history if r.status in ("ok", "noisy") and r.latency_s == r.latency_s]
        if not timed:
            raise RuntimeError(f"{task.name}: no valid kernel in {args.trials} trials ({res.status_counts()})")
        best = min(timed, key=lambda r: r.latency_s)
    return best.config


def make_task(make, dtype: str) -> ops.Task:
    """The layer at ``dtype`` (``"int8_w7"``: int8 with 7-bit weights)."""
    if dtype == "int8_w7":
        return dataclasses.replace(make("int8"), weight_bits=7)
    return make(dtype)


def _cpu_timer(c):
    """A block timer of ``c`` in process CPU time (``number`` calls -> seconds)."""
    def run(number: int) -> float:
        t0 = time.process_time()
        if isinstance(c, OurKernel):
            c.timeit(number)
        else:
            for _ in range(number):
                c()
        return time.process_time() - t0
    return run


def bench_layer(name: str, make, threads: int, args, target: Target) -> list[dict]:
    rows, contenders, meta = [], {}, {}
    flops = make("float32").flops
    for dtype in args.dtypes:
        task = make_task(make, dtype)
        arrays = task.random_inputs(seed=0)
        ref = task.reference(*arrays)
        rtol, atol = task.tolerance(ref)
        configs = {"default": Space(task, default_sketch(task, target), target).default()}
        if args.trials:
            configs["tuned"] = tuned_config(task, target, args, threads)
        for variant, cfg in configs.items():
            k = OurKernel(lower(Space(task, cfg.sketch, target), cfg), arrays, threads)
            k()
            ok, msg = check_output(k.out, ref, task.contraction().reduction_size, rtol, atol=atol)
            if not ok:
                raise AssertionError(f"{task.name} {variant}: {msg}")
            contenders[f"ours {variant} {dtype}"] = k
            meta[f"ours {variant} {dtype}"] = (variant, dtype, cfg.sketch)
    task32 = make("float32")
    arrays32 = task32.random_inputs(seed=0)
    ref32 = task32.reference(*arrays32)
    for dtype, (c, note) in ort_variants(task32, arrays32, threads).items():
        if c is None:
            rows.append(dict(layer=name, variant="onnxruntime", dtype=dtype, threads=threads, ms=None, speedup=None,
                             expected=1.0, achieved_over_expected=None, note=note))
            continue
        y = np.asarray(c(), np.float64)
        err = float(np.abs(y - ref32).max() / max(np.abs(ref32).max(), 1e-12))
        if err > (1e-4 if dtype == "float32" else 5e-2):
            raise AssertionError(f"onnxruntime {dtype} on {name}: relative error {err:.3g}")
        contenders[f"onnxruntime {dtype}"] = c
        meta[f"onnxruntime {dtype}"] = ("onnxruntime", dtype, f"{note} (err {err:.1e})".strip())
    if args.cpu_time:  # process CPU time per block (1 thread: what a busy machine's other jobs do not inflate)
        times = baselines.time_blocks({k: _cpu_timer(c) for k, c in contenders.items()}, rounds=args.rounds,
                                      min_time_s=0.02 if args.quick else 0.1, pause_s=0.02 if args.quick else 0.1)
    else:
        times = baselines.time_interleaved(contenders, rounds=args.rounds, min_time_s=0.02 if args.quick else 0.1,
                                           pause_s=0.02 if args.quick else 0.1)
    med = {k: float(np.median(v)) for k, v in times.items()}
    ref_key = "ours tuned float32" if "ours tuned float32" in med else "ours default float32"
    for key, s in med.items():
        variant, dtype, note = meta[key]
        speed = med[ref_key] / s
        rows.append(dict(layer=name, variant=variant, dtype=dtype, threads=threads, ms=s * 1e3, speedup=speed,
                         expected=1.0, achieved_over_expected=speed / 1.0,
                         note=f"{note}; {flops / s / 1e9:.1f} GOP/s"))
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| layer | threads | variant | dtype | ms | speedup vs our tuned fp32 | expected (FLOP ratio) | "
             "achieved / expected | note |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(rows, key=lambda r: (r["layer"], r["threads"], r["variant"], r["dtype"])):
        f = (lambda v, p: "-" if v is None else f"{v:.{p}f}")
        lines.append(f"| {r['layer']} | {r['threads']} | {r['variant']} | {r['dtype']} | {f(r['ms'], 3)} | "
                     f"{f(r['speedup'], 2)} | {f(r['expected'], 2)} | {f(r['achieved_over_expected'], 2)} | "
                     f"{r.get('note', '')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny layers, 4 random trials, 1 thread, 2 rounds")
    ap.add_argument("--threads", default=None, help="comma-separated thread counts (default 1,2; --quick: 1)")
    ap.add_argument("--trials", type=int, default=None, help="tuning trials per dtype (0: default schedules only)")
    ap.add_argument("--strategy", default=None, help="tuning strategy (default gradient; --quick: random)")
    ap.add_argument("--layers", default=None, help="comma-separated subset of the layers")
    ap.add_argument("--dtypes", default=",".join(DTYPES),
                    help=f"comma-separated subset of our dtypes (default all: {','.join(DTYPES)}; float32 is "
                         f"always run, the speedup reference)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--cpu-time", action="store_true",
                    help="time in process CPU time, not wall time (1 thread only; for a busy shared machine)")
    ap.add_argument("--db", default=None, help="tuning database (default: lowp.db beside --out, else results/lowp.db)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--merge", action="append", default=[], help="JSON rows of another benchmark (sparse.py)")
    args = ap.parse_args(argv)
    if args.db is None:  # with --out, nothing is written into the checkout
        args.db = str(Path(args.out).parent / "lowp.db") if args.out else str(ROOT / "results" / "lowp.db")
    args.trials = (4 if args.quick else 64) if args.trials is None else args.trials
    args.strategy = args.strategy or ("random" if args.quick else "gradient")
    args.rounds = args.rounds or (2 if args.quick else 5)
    if args.trials < 0 or args.rounds < 1:
        print("lowp.py: --trials must be >= 0 and --rounds >= 1", file=sys.stderr)
        return 2
    try:
        threads = [int(t) for t in (args.threads or ("1" if args.quick else "1,2")).split(",")]
    except ValueError:
        print(f"lowp.py: --threads {args.threads!r} is not a comma-separated list of integers", file=sys.stderr)
        return 2
    args.dtypes = ["float32"] + [d for d in args.dtypes.split(",") if d and d != "float32"]
    if bad := [d for d in args.dtypes if d not in DTYPES]:
        print(f"lowp.py: unknown dtype(s) {bad}; valid: {', '.join(DTYPES)}", file=sys.stderr)
        return 2
    if args.cpu_time and threads != [1]:
        print("lowp.py: --cpu-time needs --threads 1 (CPU time sums the threads)", file=sys.stderr)
        return 2
    all_layers = layers(args.quick)
    chosen = args.layers.split(",") if args.layers else list(all_layers)
    if unknown := [n for n in chosen if n not in all_layers]:
        print(f"lowp.py: unknown layer(s) {unknown}; valid: {', '.join(all_layers)}", file=sys.stderr)
        return 2
    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    target = Target.cpu()
    rows: list[dict] = []
    for path in args.merge:
        rows += [r for r in json.loads(Path(path).read_text()) if set(ROW_KEYS) <= set(r)]
    for th in threads:
        for name in chosen:
            rows += bench_layer(name, all_layers[name], th, args, target.__class__.cpu(cores=th))
            print(f"{name} at {th} thread(s) done", file=sys.stderr, flush=True)
    print(f"machine: {target.name}, {target.simd_lanes} fp32 lanes, avx512_fp16={target.avx512_fp16}, "
          f"avx512_vnni={target.avx512_vnni}; strategy {args.strategy}, {args.trials} trials per dtype; load average "
          f"{os.getloadavg()[0]:.2f} at the end; {'process CPU time' if args.cpu_time else 'wall time'}")
    print(table(rows))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
