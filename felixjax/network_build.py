"""Building a whole model: choose each task's schedule (given, tuned, default), turn the fused graph
into a ``codegen.netbuild.NetSpec``, compile one C library (:class:`CompiledModel`)."""
from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from codegen import netbuild
from codegen.build import DEFAULT_FLAGS
from codegen.lower import Plan, lower
from codegen.ops import Task
from codegen.space import Config, Space
from codegen.spaces import default_config
from codegen.sparse_lower import SparsePlan, with_weights
from codegen.target import Target
from codegen.winograd import VARIANTS as WINOGRAD_VARIANTS

from .database import NETWORK_PREFIX, UPPER_BOUND, Database
from .errors import UnsupportedModelError
from .graph_passes import Graph
from .onnx_import import Model, load_onnx
from .quantize import quantize_weights
from .sparsify import layer_weights


def _as_model(model: Model | str | os.PathLike | bytes | Any) -> Model:
    return model if isinstance(model, Model) else load_onnx(model)


@dataclass(frozen=True)
class Schedule:
    """The schedule one task is built with: ``source`` is ``"tuned"`` (best database record),
    ``"given"`` (passed in ``configs``) or ``"default"`` (``Space.default()`` of ``default_sketch``)."""

    task: Task
    weight: int
    config: Config
    source: str
    latency_s: float | None = None
    note: str = ""
    #: a tuned record chosen although this version's default schedule of the task was never measured
    #: in the database (defaults change between versions): the record may be slower than the default
    stale: bool = False


def graph_to_spec(graph: Graph, plans: Mapping[Task, Plan]) -> netbuild.NetSpec:
    """The neutral ``codegen.netbuild`` description of a fused graph: value ids for inputs, constants and
    node outputs; one step per node (anchors become kernel steps with their plans).

    Raises:
        UnsupportedModelError: a node the C build cannot run (names the node and its op).
    """
    ids: dict[str, int] = {}
    values: list[netbuild.Value] = []

    def add(name: str, kind: str, data: np.ndarray | None = None, dtype: str = "float32",
            shape: tuple | None = None) -> int:
        ids[name] = len(values)
        shape = shape or (tuple(graph.shapes[name]) if name in graph.shapes else tuple(np.shape(data)))
        values.append(netbuild.Value(shape, kind, data, dtype))
        return ids[name]

    for name in graph.inputs:
        add(name, "input")

    def value(name: str, node_label: str) -> int | None:
        if not name:
            return None
        if name not in ids:
            if name not in graph.constants:
                raise UnsupportedModelError(f"node {node_label!r} reads {name!r}, which nothing produces")
            data = np.asarray(graph.constants[name])
            if data.dtype != np.float32:
                data = data.astype(np.float32)
            add(name, "const", data)
        return ids[name]

    steps = []
    for node in graph.nodes:
        ins = tuple(value(i, node.name) for i in node.inputs)
        outs = []
        for o in node.outputs:
            if not o:
                outs.append(None)
                continue
            if o in ids:
                raise UnsupportedModelError(f"node {node.name!r} ({node.op}) writes {o!r}, which already exists")
            outs.append(add(o, "temp"))
        if node.is_anchor:
            plan = plans[node.task]
            if isinstance(plan, SparsePlan):  # weights compiled into the kernel: this layer's own
                plan = with_weights(plan, layer_weights(graph, node))
            before, kernel_outs, after = len(steps), tuple(outs), []
            if node.task.quantized:
                ins = _int8_inputs(graph, node, ins, add, steps)
            if node.task.dtype == "float16":
                ins, kernel_outs, after = _float16_io(graph, node, ins, kernel_outs, add, steps)
            steps.append(netbuild.Step("kernel", ins, kernel_outs, plan=plan, label=node.name))
            steps.extend(after)
            assert len(steps) - before == node_steps(node), node.name
        elif node.op in netbuild.CHEAP_OPS:
            steps.append(netbuild.Step(node.op, ins, tuple(outs), dict(node.attrs), label=node.name))
        else:
            raise UnsupportedModelError(f"node {node.name!r} (op {node.op}): the C build has no kernel for it; "
                                        f"supported: {', '.join(netbuild.CHEAP_OPS)} and the anchors")
    outputs = tuple(value(o, "graph output") for o in graph.outputs)
    return netbuild.NetSpec(tuple(values), tuple(ids[i] for i in graph.inputs), outputs, tuple(steps))


def _int8_inputs(graph: Graph, node: Any, ins: tuple, add: Any, steps: list) -> tuple:
    """An int8 anchor's kernel inputs (data, weight, [bias], [residual], x_scale, x_zp, w_scales): its
    float32 input quantized to uint8 by a new ``quantize`` step, its weights quantized per output channel
    (:mod:`felixjax.quantize`; packed at load), the scales and zero point as constants."""
    q = node.attrs.get("quant")
    if q is None:
        raise UnsupportedModelError(f"node {node.name!r} is an int8 task without calibrated input parameters "
                                    "(mark int8 layers with felixjax.quantize.with_precisions)")
    if node.inputs[1] not in graph.constants:
        raise UnsupportedModelError(f"node {node.name!r}: an int8 layer needs constant weights")
    x8 = add(f"{node.name}/uint8", "temp", dtype="uint8", shape=tuple(graph.shapes[node.inputs[0]]))
    steps.append(netbuild.Step("quantize", (ins[0],), (x8,), dict(q), label=f"{node.name}/quantize"))
    wq, ws = quantize_weights(node.task, graph.constants[node.inputs[1]])
    xs = add(f"{node.name}/x_scale", "const", np.array([q["scale"]], np.float32))
    zp = add(f"{node.name}/x_zp", "const", np.array([q["zero_point"]], np.int32), "int32")
    return (x8, add(f"{node.name}/w_int8", "const", wq)) + ins[2:] + (xs, zp, add(f"{node.name}/w_scales", "const", ws))


def node_steps(node: Any) -> int:
    """How many steps :func:`graph_to_spec` makes of a graph node (a layer's profile time is their sum):
    1 (a cheap op, a float32 anchor); an int8 anchor 2 (``quantize``, kernel); a float16 anchor 3, or 4
    with a residual (``to_float16`` of its data [and of its residual], kernel, ``to_float32``).

    Example:
        >>> from codegen import ops
        >>> from felixjax.graph_passes import Node
        >>> node_steps(Node("conv2d", ("x", "w", "b"), ("y",), {"task": ops.conv2d(1, 8, 6, 6, out_channels=8,
        ...            bias=True, dtype="float16")}))
        3
    """
    if not node.is_anchor:
        return 1
    if node.task.quantized:
        return 2
    return 3 + int(node.task.residual) if node.task.dtype == "float16" else 1


def _float16_io(graph: Graph, node: Any, ins: tuple, outs: tuple, add: Any, steps: list) -> tuple[tuple, tuple, list]:
    """A float16 anchor's kernel inputs and outputs. Its float32 data (and residual: the float16 task
    reads it as float16) become float16 values by new ``to_float16`` steps (appended to ``steps``); its
    weights stay the float32 constant, converted to float16 once, when the packed weights are made at
    load; its bias stays float32 (the kernel adds it to the float32 accumulator). Returns ``(kernel
    inputs, (float16 output,), [the to_float32 step that writes the node's float32 output])``."""
    task = node.task
    if node.inputs[1] not in graph.constants:
        raise UnsupportedModelError(f"node {node.name!r}: a float16 layer needs constant weights")
    ins = list(ins)
    for k, (name, dtype, shape) in enumerate(zip(task.input_names(), task.input_dtypes(), task.input_shapes())):
        if k != 1 and dtype == np.float16:
            h = add(f"{node.name}/{name}_float16", "temp", dtype="float16", shape=tuple(shape))
            steps.append(netbuild.Step("to_float16", (ins[k],), (h,), label=f"{node.name}/{name}_to_float16"))
            ins[k] = h
    y16 = add(f"{node.name}/out_float16", "temp", dtype="float16", shape=tuple(task.output_shape))
    return tuple(ins), (y16,), [netbuild.Step("to_float32", (y16,), outs, label=f"{node.name}/to_float32")]


def _open_db(db: str | os.PathLike | Database | None) -> tuple[Database | None, bool]:
    if db is None or isinstance(db, Database):
        return db, False
    db = os.path.expanduser(db) if isinstance(db, str) else db
    if str(db) != ":memory:" and not os.path.exists(db):
        raise FileNotFoundError(f"{db}: no such database")
    return Database(db, readonly=True), True  # build only reads: works on read-only files


def default_config_for(task: Task, target: Target, *, winograd: bool = True) -> Config:
    """The schedule an untuned build of ``task`` uses (:func:`codegen.spaces.default_config`; on a GPU target its
    CUDA sketch's: a CPU config there was re-timed at the end of a GPU tune_model, a compile_error each time)."""
    return default_config(task, target, winograd=winograd)


def is_winograd(sketch: str) -> bool:
    """Whether a config of sketch ``sketch`` (a name, padded variants included) runs a Winograd algorithm."""
    return sketch.split(".")[0] in WINOGRAD_VARIANTS


def choose_schedules(model: Model, target: Target, *, db: str | os.PathLike | Database | None = None,
                     configs: Mapping[Task, Config] | None = None, threads: int | None = None,
                     winograd: bool = True) -> list[Schedule]:
    """The schedule of every distinct task: ``configs`` first, then the database's best record timed at
    ``threads`` threads (default: the target's cores), else at the nearest other thread count (noted),
    then the default schedule of :func:`~codegen.space.default_sketch` (also where a stored config no
    longer lowers). Where a task has end-of-run re-timings (``retime:<run>`` rows: the best configs and
    the default timed again side by side), the fastest of each run's newest re-timing is its best record (or a
    config re-timed only noisy below it, as :meth:`Database.best` says): the
    fastest single measurement of a noisy run is too often a lucky one (where that re-timing's run measured more
    after it, one cut short, the note says so: the same tune run again re-times it). An in-network choice
    (``retime:network:<run>``, ``tune_model(in_network=...)``: the schedule whose layers ran fastest inside a
    whole build) comes before both; the newest one counts. A tuned record is ``stale`` where the task's
    current default schedule appears in none of its records (a newer default than the one the run
    measured): ``fj.tune_model(model, db=..., trials=0)`` re-times both side by side. ``winograd=False``: no
    Winograd schedule, for inputs with outliers (README, "The schedule space"): the best record of another
    sketch, else the direct default (``configs`` are taken as given)."""
    database, own = _open_db(db)
    want = int(threads or target.cores)
    skip = () if winograd else tuple(WINOGRAD_VARIANTS)
    # thread counts to look up, the one asked for first, then the nearest others
    counts = sorted(range(1, max(want, target.cores) + 1), key=lambda n: (abs(n - want), n))
    out = []
    try:
        for task, weight in model.tasks:
            default = default_config_for(task, target, winograd=winograd)
            cfg, source, lat, note = default, "default", None, ""
            rec = None
            if database is not None and not (configs and task in configs):
                for n in counts:
                    at = target.at_threads(n)
                    retimed = database.best(task, at, retimed=True, exclude_sketches=skip)
                    choice = database.network_choice(task, at, exclude_sketches=skip)
                    rec = choice or retimed or database.best(task, at, exclude_sketches=skip)
                    if rec is not None:
                        note = "" if n == want else f"tuned at {n} thread(s), built for {want}"
                        run = retimed.run.removeprefix("retime:") if retimed is not None else ""
                        if choice is None and rec is retimed and (database.newest_id(task, at, run)
                                                                  > database.newest_id(task, at, retimed.run)):
                            # kept (one lucky timing must not displace it), but its run measured more since
                            note = (note + "; " if note else "") + (f"run {run} measured more after its last "
                                                                    f"re-timing (cut short, or retime=0): tune it "
                                                                    f"again to re-time")
                        break
            stale = False
            if configs and task in configs:
                cfg, source = configs[task], "given"
            elif rec is not None:
                cfg, source, lat = rec.config, "tuned", rec.latency_s
                if rec.run.startswith(NETWORK_PREFIX):
                    note = (note + "; " if note else "") + "chosen by its layers' time inside a network"
                if rec.result.error == UPPER_BOUND:  # Database.best's as_bound: below every clean config
                    note = (note + "; " if note else "") + "timed only on a busy machine: its time is an upper bound"
                stale = cfg != default and all(r.config != default for r in database.records(
                    task, rec.target_key, retimes=True))
                if stale:
                    note = (note + "; " if note else "") + "this version's default schedule was never measured"
            if source != "default":
                try:
                    lower(Space(task, cfg.sketch, target), cfg)
                except (ValueError, KeyError) as e:
                    cfg, source, lat, note = default, "default", None, f"stored config rejected: {e}"
            out.append(Schedule(task, weight, cfg, source, lat, note, stale))
    finally:
        if own:
            database.close()
    return out


def _shape_or_none(x: Any) -> tuple | None:
    """``np.shape(x)``, or None for a ragged sequence (arrays of several shapes: several inputs)."""
    try:
        return np.shape(x)
    except ValueError:
        return None


class CompiledModel:
    """A model compiled into one C library: ``exe(x) -> numpy``, ``exe.export(dir)``.

    ``x`` is one array (single-input models), a sequence in input order or a dict by input name; the
    result is the output array, or a list in output order when the model has several outputs.
    """

    def __init__(self, model: Model, target: Target, schedules: list[Schedule], net: netbuild.NetSource,
                 library: netbuild.NetLibrary):
        self.model, self.target, self.schedules = model, target, schedules
        self.net, self.library = net, library

    @property
    def source(self) -> str:
        """The generated C source (``model.c``)."""
        return self.net.source

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.model.input_names

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.model.output_names

    def _inputs(self, x: Any) -> list[np.ndarray]:
        names = self.model.input_names
        if isinstance(x, (list, tuple)) and len(names) == 1 and (
                _shape_or_none(x) == tuple(self.net.input_shapes[0])
                or len(x) != 1 and not all(hasattr(a, "shape") for a in x)):
            x = [x]  # nested lists holding the one input's values, not a list of inputs (arrays: inputs)
        elif not isinstance(x, (list, tuple, Mapping)) and (hasattr(x, "__array__") or hasattr(x, "shape")):
            x = [x]  # one array of any kind: numpy, JAX, torch on the CPU, ...
        if isinstance(x, Mapping):
            unknown = set(x) - set(names)
            if unknown:
                raise ValueError(f"unknown inputs {sorted(unknown)}; the model takes {list(names)}")
            missing = [n for n in names if n not in x]
            if missing:
                raise ValueError(f"missing inputs {missing}; the model takes {list(names)}")
            x = [x[n] for n in names]
        x = list(x)
        if len(x) != len(names):
            raise ValueError(f"the model takes {len(names)} inputs {list(names)}, got {len(x)}")
        out = []
        for name, a, shape in zip(names, x, self.net.input_shapes):
            if np.iscomplexobj(a):  # numpy's cast drops the imaginary part with only a warning
                raise ValueError(f"input {name!r} is complex ({np.asarray(a).dtype}); the model takes real values")
            a = np.require(np.asarray(a, dtype=np.float32), requirements="C")  # keeps 0-d arrays 0-d
            if a.shape != tuple(shape):
                raise ValueError(f"input {name!r} has shape {a.shape}, the model expects {tuple(shape)}")
            out.append(a)
        return out

    def run(self, x: Any) -> list[np.ndarray]:
        """All outputs, as a list in output order (fresh arrays every call)."""
        lib = self.library
        shapes = lib._in_shapes
        if (type(x) is np.ndarray and len(shapes) == 1 and x.dtype == np.float32 and x.shape == shapes[0]
                and x.flags.c_contiguous):  # the common call: one ready array, checked once, no copies
            return lib.call_fast((x,))
        return lib.call_fast(self._inputs(x))

    def __call__(self, *inputs: Any) -> np.ndarray | list[np.ndarray]:
        # exe(a, b): the inputs in order, as exe([a, b]); exe() for a model whose inputs are all pinned values
        x = inputs[0] if len(inputs) == 1 else list(inputs)
        y = self.library.call_one(x)  # one ready array in, one out: the short path (None: anything else)
        if y is not None:
            return y
        outs = self.run(x)
        return outs[0] if len(outs) == 1 else outs

    def check(self, x: Any = None, *, rtol: float = 1e-3) -> float:
        """Run on ``x`` (random normal inputs when None) and compare every output with the model's numpy
        reference (:meth:`Model.run_numpy`, the same precisions); returns the largest error relative to
        the reference output's largest finite magnitude (equal infinities and NaN on both sides agree, any
        other NaN fails), or raises ``RuntimeError`` above ``rtol`` (what ``felixjax build``
        checks before it exports)."""
        if x is None:
            rng = np.random.default_rng(0)
            x = [rng.standard_normal(s).astype(np.float32) for s in self.net.input_shapes]
        ins = self._inputs(x)
        ref = self.model.run_numpy(ins)
        worst = 0.0
        for k, (y, r) in enumerate(zip(self.run(ins), ref if isinstance(ref, list) else [ref])):
            big = float(np.abs(r[np.isfinite(r)]).max()) if np.isfinite(r).any() else 0.0
            agree = (np.isinf(r) & (y == r)) | (np.isnan(y) & np.isnan(r))  # the same inf, or NaN on both sides
            y, r = np.where(agree, 0.0, y), np.where(agree, 0.0, r)
            e = float(np.abs(y - r).max()) / max(big, 1e-30) if np.size(r) else 0.0
            if not e <= rtol:  # NaN too
                raise RuntimeError(f"output {k} ({self.output_names[k]!r}) of the build differs from the numpy "
                                   f"reference: {e:.2g} of its largest value (rtol {rtol:g})")
            worst = max(worst, e)
        return worst

    def timeit(self, x: Any = None, *, number: int = 10) -> float:
        """Seconds per run, averaged over ``number`` runs timed in C (random inputs when ``x`` is None)."""
        if x is None:
            rng = np.random.default_rng(0)
            x = [rng.standard_normal(s).astype(np.float32) for s in self.net.input_shapes]
        ins = self._inputs(x)
        outs = self.library.new_outputs()
        return self.library.timeit(ins, outs, number) / number

    def set_threads(self, n: int) -> None:
        """OpenMP threads of later runs, from any Python thread (OpenMP keeps the count per calling thread: each
        run sets it where it differs). Calls from several threads run one at a time (one arena)."""
        self.library.set_threads(n)

    def profile(self, x: Any = None, *, number: int = 10) -> list[dict]:
        """Where the time goes: one row per graph node (``name``, ``op``: the task name for anchors,
        ``ms`` averaged over ``number`` runs with every step timed in C), in execution order. An int8
        layer's time includes the step that quantizes its input, a float16 layer's the steps that convert
        its data (and residual) to float16 and its output back to float32 (:func:`node_steps`)."""
        if x is None:
            rng = np.random.default_rng(0)
            x = [rng.standard_normal(s).astype(np.float32) for s in self.net.input_shapes]
        secs = iter(self.library.profile(self._inputs(x), number=number))
        return [{"name": n.name, "op": n.task.name if n.is_anchor else n.op,
                 "ms": 1e3 * float(sum(next(secs) for _ in range(node_steps(n))))}
                for n in self.model.graph.nodes]

    def layer_report(self, x: Any = None, *, number: int = 10) -> str:
        """Per layer (graph node) of the C build: how it runs (``tuned``: a task kernel with a tuned or
        given schedule, ``default``: a task kernel with the default schedule, ``generic``: a generic C
        kernel of a cheap op), its time (``profile``) and its share of the network's time, then the
        shares by kind. What ``felixjax build --report`` prints."""
        from codegen.measure_records import disturbed, longest_wait_s, run_delays

        before, wall, cpu = run_delays(), time.perf_counter(), time.process_time()
        rows = self.profile(x, number=number)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        waited = longest_wait_s(before, run_delays())
        by_task = {s.task: s for s in self.schedules}
        total = sum(r["ms"] for r in rows) or 1e-30
        kinds: dict[str, float] = {"tuned": 0.0, "default": 0.0, "generic": 0.0}
        lines = [f"{'layer':<32} {'runs as':<8} {'op / task':<46} {'ms':>9} {'share':>7}"]
        for node, r in zip(self.model.graph.nodes, rows):
            kind = "generic"
            if node.is_anchor:
                kind = "default" if by_task[node.task].source == "default" else "tuned"
            kinds[kind] += r["ms"]
            shown = node.name if node.name.isprintable() else repr(node.name)  # no terminal escapes from a model
            lines.append(f"{shown[:32]:<32} {kind:<8} {r['op'][:46]:<46} {r['ms']:>9.4g} "
                         f"{100 * r['ms'] / total:>6.1f}%")
        lines.append(f"total {total:.4g} ms (each step timed on its own: above one untimed run, exe.timeit): "
                     + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in kinds.items()))
        if disturbed(wall, cpu, waited_s=waited):  # the same test as a tuning timing's (`noisy`)
            lines.append(f"note: these timings were disturbed (another process took the CPU: {wall:.3f} s wall, "
                         f"{cpu:.3f} s CPU" + (f", a thread waited {waited:.3f} s for a CPU" if waited else "") +
                         "); profile on a quiet machine or with fewer threads")
        return "\n".join(lines)

    def export(self, directory: str | os.PathLike, *, prefix: str = "fj_model_") -> Path:
        """Write a standalone folder (model.c, model.h, main.c, Makefile, weights.bin, README.txt) that
        builds with ``make`` and only a C compiler. ``prefix``: of the C symbols (``fj_model_run`` ...)
        and, upper-cased, of the header's macros, so that two exported networks link into one program."""
        lines = [f"Model: {self.model.name}; inputs {list(self.model.input_names)}, outputs "
                 f"{list(self.model.output_names)} (in this order in inputs.bin / outputs.bin).", "Schedules:"]
        lines += [f"  {s.task.name} x{s.weight}: {s.source} ({s.config.sketch})" for s in self.schedules]
        t = self.target
        isa = {16: "AVX-512", 8: "AVX2 / AVX", 4: "SSE / NEON"}.get(t.simd_lanes, f"{t.simd_lanes}-lane SIMD")
        lines.append(f"Generated for {t.kind} {t.name or ''}: {t.simd_lanes} float32 lanes ({isa}), "
                     f"{t.vector_registers} vector registers{', VNNI' if t.avx512_vnni else ''}"
                     f"{', AVX-512 FP16' if t.avx512_fp16 else ''}.")
        macros, march = self.net.needs
        if macros:  # their intrinsics need the units (model.c stops with an #error without them)
            lines.append(f"Its int8 / float16 kernels use these vector units' intrinsics ({', '.join(macros)}): "
                         f"compile it with -march=native on such a CPU, or `make CFLAGS=\"-O3 {march} -fopenmp\"`.")
        else:
            lines.append("Its kernels are float32 only: it compiles for any -march (gcc splits vectors wider than "
                         "the -march's registers: the same numbers, slower).")
        lines.append("For speed on another CPU build with a Target describing it, e.g. "
                     "fj.Target.cpu(simd_lanes=8, vector_registers=16, avx512_vnni=False) for AVX2.")
        return netbuild.export(self.net, directory, readme="\n".join(lines),
                               names=(self.model.input_names, self.model.output_names), prefix=prefix)

    def summary(self) -> str:
        """Schedules, memory and code size of the build, one line each."""
        tuned = sum(s.source != "default" for s in self.schedules)
        lines = [f"{self.model.name}: {self.net.steps} steps, {len(self.schedules)} tasks ({tuned} tuned, "
                 f"{len(self.schedules) - tuned} default), arena {self.net.arena_bytes / 2**20:.2f} MiB, "
                 f"weights {self.net.weight_bytes / 2**20:.2f} MiB, {self.net.source.count(chr(10))} lines of C"]
        for s in self.schedules:
            lat = f", {s.latency_s * 1e3:.4g} ms measured" if s.latency_s is not None else ""
            lines.append(f"  {s.task.name} x{s.weight}: {s.source} {s.config.sketch}{lat}"
                         + (f" ({s.note})" if s.note else ""))
        return "\n".join(lines)

    def __repr__(self) -> str:
        tuned = sum(s.source != "default" for s in self.schedules)
        return f"CompiledModel({self.model.name}, {len(self.schedules)} tasks, {tuned} tuned)"
