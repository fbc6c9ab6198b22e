"""The CUDA dialect and renderer: a ``cuda_tiled`` config -> a real ``.cu`` kernel (float32).

Every CUDA-specific spelling lives in one table, :class:`CudaDialect` (kernel qualifier, launch
bounds, thread and block indices, block size, shared memory, barrier, unroll pragmas, FMA, min/max,
restrict); :func:`render` writes the kernel of any contraction (matmul, dense, conv2d with groups,
strides, dilation and padding) from a :class:`~codegen.cuda.space.Geometry` with it. Swapping the
table (``dataclasses.replace(CUDA, ...)``) changes the emitted source and nothing else, which is how
the tests plant a bug and watch the CPU emulation (``codegen.cuda.emulate``) catch it.

The kernel (one 1-D grid of 1-D blocks; the launch is in :class:`CudaKernel`):

1. ``blockIdx.x`` / ``threadIdx.x`` are split into per-axis block and thread indices (last spatial
   axis fastest);
2. each thread zeroes ``prod(S1 * S3)`` accumulators (registers after unrolling);
3. for each outer reduction step: when staged, the block copies its data and weight boxes into
   ``__shared__`` arrays (cooperative fetch: element ``e = threadIdx.x + j * blockDim.x``; padding
   reads as 0) between two barriers; then the inner reduction loop (``#pragma unroll <unroll>``)
   accumulates ``data * weight`` for every owned output (fully unrolled loops over vthreads and
   inner tiles);
4. the epilogue adds bias and residual, applies the activation and stores.

Example:
    >>> from codegen.ops import matmul
    >>> from codegen.target import Target
    >>> from codegen.cuda.space import CudaSpace
    >>> sp = CudaSpace(matmul(64, 64, 64), Target.cuda_sim("a100"))
    >>> k = render(sp, sp.default())
    >>> "__global__" in k.source and "__syncthreads();" in k.source, k.block
    (True, 256)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ops import Access
from ..space import Config
from .space import CudaSpace, Geometry

KERNEL_NAME = "fj_cuda_kernel"


@dataclass(frozen=True)
class CudaDialect:
    """Every target-specific spelling of the CUDA renderer."""

    name: str = "cuda"
    kernel_qualifier: str = 'extern "C" __global__'
    launch_bounds: str = "__launch_bounds__({threads})"
    restrict: str = "__restrict__"
    thread_index: str = "threadIdx.x"
    block_index: str = "blockIdx.x"
    block_threads: str = "blockDim.x"
    shared: str = "__shared__"
    barrier: str = "__syncthreads();"
    unroll: str = "#pragma unroll {n}"
    full_unroll: str = "#pragma unroll"
    fma: str = "fmaf({a}, {b}, {c})"
    fmax: str = "fmaxf({a}, {b})"
    fmin: str = "fminf({a}, {b})"
    zero: str = "0.0f"
    index_type: str = "int"


CUDA = CudaDialect()


@dataclass(frozen=True)
class CudaKernel:
    """An emitted kernel and its launch: ``grid`` blocks of ``block`` threads, ``smem_bytes`` static
    shared memory; ``args`` are the buffer parameters in order (inputs in API order, then ``out``)."""

    source: str
    grid: int
    block: int
    smem_bytes: int
    args: tuple[str, ...]
    name: str = KERNEL_NAME


def _affine(dim: tuple[tuple[str, int], ...], coord: dict[str, str]) -> str:
    terms = []
    for a, c in dim:
        if c == 0:
            continue
        terms.append(coord[a] if c == 1 else f"{c} * {coord[a]}")
    return " + ".join(terms) or "0"


def _strides(shape: tuple[int, ...]) -> list[int]:
    out, s = [], 1
    for n in reversed(shape):
        out.append(s)
        s *= n
    return out[::-1]


def _flat(parts: list[str], shape: tuple[int, ...]) -> str:
    terms = []
    for p, st in zip(parts, _strides(shape)):
        if p == "0":
            continue
        terms.append(f"({p})" if st == 1 else f"({p}) * {st}")
    return " + ".join(terms) or "0"


def render(space: CudaSpace, cfg: Config, dialect: CudaDialect = CUDA) -> CudaKernel:
    """The ``.cu`` source and launch of ``cfg`` (validated first)."""
    space.validate(cfg)
    return _Writer(space, space.geometry(cfg), dialect).kernel()


class _Writer:
    def __init__(self, space: CudaSpace, geo: Geometry, d: CudaDialect):
        self.sp, self.g, self.d = space, geo, d
        self.con = space.con
        self.task = space.task
        self.lines: list[str] = []
        # spatial axes with an index to compute: referenced by a buffer, or split (a non-batched matmul's
        # batch axis is neither: no variables for it, which nvcc would warn about as never referenced)
        bufs = [self.con.data, self.con.weight, self.con.out] + ([self.con.bias] if self.task.bias else [])
        used = {a for acc in bufs for dim in acc.dims for a, c in dim if c}
        self.axes = [a for a in geo.spatial if a in used
                     or max(geo.blocks[a], geo.threads[a], geo.vthreads[a], geo.inner[a]) > 1]
        self.depth = 0

    def emit(self, line: str = "") -> None:
        self.lines.append("  " * self.depth + line if line else "")

    def open(self, line: str) -> None:
        self.emit((line + " {") if line else "{")
        self.depth += 1

    def close(self) -> None:
        self.depth -= 1
        self.emit("}")

    # ---- pieces ----------------------------------------------------------------------------------
    def args(self) -> list[str]:
        names = ["data", "weight"]
        if self.task.bias:
            names.append("bias")
        if self.task.residual:
            names.append("residual")
        return names + ["out"]

    def global_load(self, acc: Access, coord: dict[str, str], name: str) -> str:
        """``name[...]`` at the global coordinates ``coord``; padded data reads 0 outside the input."""
        parts = [_affine(dim, coord) for dim in acc.dims]
        if name != "data" or not any(b or a for b, a in self.con.pad):
            return f"{name}[{_flat(parts, acc.shape)}]"
        api = self.con.data_api_shape
        conds, real = [], []
        for p, (before, after), n, full in zip(parts, self.con.pad, api, acc.shape):
            q = f"({p} - {before})" if before else f"({p})"
            real.append(q)
            if before:
                conds.append(f"{q} >= 0")
            if after:
                conds.append(f"{q} < {n}")
        addr = _flat(real, api)
        return f"(({' && '.join(conds)}) ? data[{addr}] : {self.d.zero})" if conds else f"data[{addr}]"

    def kernel(self) -> CudaKernel:
        g, d, con = self.g, self.d, self.con
        it = d.index_type
        args = self.args()
        params = []
        for a in args:
            const = "" if a == "out" else "const "
            params.append(f"{const}float* {d.restrict} {a}")
        self.emit(f"// felixjax cuda_tiled kernel for {self.task.name}")
        self.emit(f"// launch: grid ({g.n_blocks}, 1, 1), block ({g.n_threads}, 1, 1), "
                  f"static shared memory {g.smem_bytes} bytes")
        self.emit(f"// tiles: {', '.join(f'{a}={g.blocks[a]}x{g.vthreads[a]}x{g.threads[a]}x{g.inner[a]}' for a in g.spatial)}"
                  f"; reduction: {', '.join(f'{a}={g.red_outer[a]}x{g.red_inner[a]}' for a in g.reduce)}"
                  f"; staged {int(g.staged)}; unroll {g.unroll}")
        bounds = d.launch_bounds.format(threads=g.n_threads)
        self.open(f"{d.kernel_qualifier} void {bounds} {KERNEL_NAME}({', '.join(params)})")
        # 1. block and thread indices (last spatial axis fastest)
        self.emit(f"{it} fj_b = {d.block_index};")
        self.emit(f"{it} fj_t = {d.thread_index};")
        for a in reversed(self.axes):
            self.emit(f"const {it} b_{a} = fj_b % {g.blocks[a]}; fj_b /= {g.blocks[a]};")
            self.emit(f"const {it} t_{a} = fj_t % {g.threads[a]}; fj_t /= {g.threads[a]};")
        for a in self.axes:  # origin of the block tile and of this thread's first element, per axis
            self.emit(f"const {it} o_{a} = b_{a} * {g.block_tile[a]};")
            self.emit(f"const {it} l_{a} = t_{a} * {g.inner[a]};")
        n_acc = g.outputs_per_thread
        self.emit(f"float acc[{n_acc}];")
        self.emit(d.full_unroll)
        self.emit(f"for ({it} p = 0; p < {n_acc}; ++p) acc[p] = {d.zero};")
        if g.staged:
            for b in ("data", "weight"):
                self.emit(f"{d.shared} float sh_{b}[{g.box_elems(b)}];")
        # 2. reduction steps
        for r in g.reduce:
            self.open(f"for ({it} ro_{r} = 0; ro_{r} < {g.red_outer[r]}; ++ro_{r})")
        if g.staged:
            self.fetch("data", con.data)
            self.fetch("weight", con.weight)
            self.emit(d.barrier)
        for k, r in enumerate(g.reduce):
            if k == len(g.reduce) - 1:
                self.emit(d.unroll.format(n=g.unroll))
            self.open(f"for ({it} ri_{r} = 0; ri_{r} < {g.red_inner[r]}; ++ri_{r})")
        self.element_loops()
        local = {a: f"(l_{a} + v_{a} * {g.threads[a] * g.inner[a]} + i_{a})" for a in g.spatial}
        local.update({r: f"ri_{r}" for r in g.reduce})
        glob = {a: f"(o_{a} + {local[a]})" for a in g.spatial}
        glob.update({r: f"(ro_{r} * {g.red_inner[r]} + ri_{r})" for r in g.reduce})
        if g.staged:
            x = f"sh_data[{_flat([_affine(dim, local) for dim in con.data.dims], g.boxes['data'])}]"
            w = f"sh_weight[{_flat([_affine(dim, local) for dim in con.weight.dims], g.boxes['weight'])}]"
        else:
            x = self.global_load(con.data, glob, "data")
            w = self.global_load(con.weight, glob, "weight")
        self.emit(f"acc[{self.acc_index()}] = {d.fma.format(a=x, b=w, c=f'acc[{self.acc_index()}]')};")
        self.close_elements()
        for _ in g.reduce:
            self.close()
        if g.staged:
            self.emit(d.barrier)
        for _ in g.reduce:
            self.close()
        # 3. epilogue
        self.element_loops()
        self.emit(f"float y = acc[{self.acc_index()}];")
        oparts = [_affine(dim, glob) for dim in con.out.dims]
        oaddr = _flat(oparts, con.out.shape)
        if self.task.bias:
            self.emit(f"y += bias[{_affine(con.bias.dims[0], glob)}];")
        if self.task.residual:
            self.emit(f"y += residual[{oaddr}];")
        if self.task.act == "relu":
            self.emit(f"y = {d.fmax.format(a='y', b=d.zero)};")
        elif self.task.act == "relu6":
            self.emit(f"y = {d.fmin.format(a=d.fmax.format(a='y', b=d.zero), b='6.0f')};")
        self.emit(f"out[{oaddr}] = y;")
        self.close_elements()
        self.close()
        return CudaKernel("\n".join(self.lines) + "\n", g.n_blocks, g.n_threads, g.smem_bytes, tuple(args))

    def element_loops(self) -> None:
        g, d = self.g, self.d
        self.open("")  # one scope per element nest (closed by close_elements)
        for a in self.axes:
            for lvl, n in (("v", g.vthreads[a]), ("i", g.inner[a])):
                if n == 1:
                    self.emit(f"const {d.index_type} {lvl}_{a} = 0;")
                    continue
                self.emit(d.full_unroll)
                self.open(f"for ({d.index_type} {lvl}_{a} = 0; {lvl}_{a} < {n}; ++{lvl}_{a})")

    def close_elements(self) -> None:
        g = self.g
        for a in g.spatial:
            for n in (g.vthreads[a], g.inner[a]):
                if n > 1:
                    self.close()
        self.close()

    def acc_index(self) -> str:
        g = self.g
        expr = "0"
        for a in g.spatial:
            for lvl, n in (("v", g.vthreads[a]), ("i", g.inner[a])):
                if n == 1:
                    continue
                expr = f"{lvl}_{a}" if expr == "0" else f"({expr}) * {n} + {lvl}_{a}"
        return expr

    def fetch(self, buf: str, acc: Access) -> None:
        """Cooperative fetch of one box into shared memory (all threads, strided by the block size)."""
        g, d = self.g, self.d
        it = d.index_type
        box = g.boxes[buf]
        self.open(f"for ({it} e = {d.thread_index}; e < {math.prod(box)}; e += {d.block_threads})")
        self.emit(f"{it} rem = e;")
        coords = []
        for k in reversed(range(len(box))):
            self.emit(f"const {it} q{k} = rem % {box[k]}; rem /= {box[k]};")
        for k, dim in enumerate(acc.dims):
            origin = {a: (f"o_{a}" if a in g.block_tile else f"ro_{a} * {g.red_inner[a]}") for a, _ in dim}
            coords.append(f"{_affine(dim, origin)} + q{k}")
        if buf == "data" and any(b or a for b, a in self.con.pad):
            # reuse global_load's padding logic on precomputed padded coordinates
            self.emit(f"sh_{buf}[e] = {self._padded_load(coords)};")
        else:
            self.emit(f"sh_{buf}[e] = {buf}[{_flat(coords, acc.shape)}];")
        self.close()

    def _padded_load(self, coords: list[str]) -> str:
        api = self.con.data_api_shape
        conds, real = [], []
        for p, (before, after), n in zip(coords, self.con.pad, api):
            q = f"({p} - {before})" if before else f"({p})"
            real.append(q)
            if before:
                conds.append(f"{q} >= 0")
            if after:
                conds.append(f"{q} < {n}")
        return f"(({' && '.join(conds)}) ? data[{_flat(real, api)}] : {self.d.zero})"
