"""Export of a generated network as a standalone folder (model.c, model.h, main.c, Makefile,
weights.bin, README.txt) that builds with ``make`` and nothing but a C compiler."""
from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .emission import NetSource

_MAKEFILE = """\
# Builds the felixjax network with nothing but a C compiler: `make` (demo program and shared library).
# Drop -fopenmp to build single-threaded. The kernels use the SIMD width of the machine they were
# generated for (see README.txt): -march=native there is fastest; float32 kernels build for any -march.
CFLAGS ?= -O3 -march=native -fopenmp -ffp-contract=fast -fno-trapping-math
LDLIBS = -lm

all: demo libmodel.so

model.o: model.c model.h
\t$(CC) $(CFLAGS) -std=gnu11 -fPIC -c -o $@ model.c

demo: main.c model.h model.o
\t$(CC) $(CFLAGS) -std=gnu11 -o $@ main.c model.o $(LDLIBS)

libmodel.so: model.o
\t$(CC) $(CFLAGS) -shared -o $@ model.o $(LDLIBS)

clean:
\trm -f demo libmodel.so model.o

.PHONY: all clean
"""

#: the top of the exported model.c and main.c: what a user's own flags need (``-std=c11``, ``-Werror``)
_PRELUDE = """\
#if defined(__STRICT_ANSI__) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L  /* clock_gettime under -std=c99 / -std=c11 (POSIX: Linux, macOS, BSD) */
#endif
#if defined(__GNUC__)  /* generated code: warnings that tell its user nothing */
#pragma GCC diagnostic ignored "-Wunknown-pragmas"  /* #pragma omp without -fopenmp: one thread */
#pragma GCC diagnostic ignored "-Wunused-variable"
#pragma GCC diagnostic ignored "-Wunused-function"  /* clang: static inline helpers a network does not use */
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wunused-local-typedefs"
#pragma GCC diagnostic ignored "-Wpsabi"  /* vectors passed between static helpers, never across the ABI */
#endif
#endif
"""

_MAIN_C = _PRELUDE + r"""/* Demo: run the network once on inputs read from a file, write the outputs to a file.
 *
 *   ./demo weights.bin inputs.bin outputs.bin [repeats]
 *
 * inputs.bin: every input in order, raw little-endian float32, row-major; outputs.bin likewise.
 * With repeats > 0, also prints the mean latency of that many runs. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "model.h"

static float* read_floats(const char* path, long count) {
    FILE* f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); return NULL; }
    float* buf = (float*)malloc(sizeof(float) * (size_t)(count > 0 ? count : 1));
    size_t got = buf ? fread(buf, sizeof(float), (size_t)count, f) : 0;
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (!buf || got != (size_t)count || extra) {
        fprintf(stderr, "%s: expected exactly %ld float32 values\n", path, count);
        free(buf);
        return NULL;
    }
    return buf;
}

int main(int argc, char** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s weights.bin inputs.bin outputs.bin [repeats]\n", argv[0]);
        return 2;
    }
    long n_in = 0, n_out = 0;
    for (int k = 0; k < FJ_MODEL_NUM_INPUTS; ++k) n_in += fj_model_input_floats[k];
    for (int k = 0; k < FJ_MODEL_NUM_OUTPUTS; ++k) n_out += fj_model_output_floats[k];
    float* weights = read_floats(argv[1], FJ_MODEL_WEIGHT_FLOATS);
    if (weights && !fj_model_weights_match(weights)) {
        fprintf(stderr, "%s: not the weights.bin written with this model.c (its weights are packed for "
                        "this build's schedules)\n", argv[1]);
        return 1;
    }
    float* inputs = read_floats(argv[2], n_in);
    float* outputs = (float*)malloc(sizeof(float) * (size_t)(n_out > 0 ? n_out : 1));
    if (!weights || !inputs || !outputs) return 1;
    const float* in_ptrs[FJ_MODEL_NUM_INPUTS > 0 ? FJ_MODEL_NUM_INPUTS : 1];
    float* out_ptrs[FJ_MODEL_NUM_OUTPUTS];
    long off = 0;
    for (int k = 0; k < FJ_MODEL_NUM_INPUTS; ++k) { in_ptrs[k] = inputs + off; off += fj_model_input_floats[k]; }
    off = 0;
    for (int k = 0; k < FJ_MODEL_NUM_OUTPUTS; ++k) { out_ptrs[k] = outputs + off; off += fj_model_output_floats[k]; }
    if (fj_model_init(weights) || fj_model_run(in_ptrs, out_ptrs)) { fprintf(stderr, "run failed\n"); return 1; }
    long repeats = argc > 4 ? atol(argv[4]) : 0;
    if (repeats > 0) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (long i = 0; i < repeats; ++i) fj_model_run(in_ptrs, out_ptrs);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        printf("%.6f ms per run (%ld runs)\n", 1e3 * s / (double)repeats, repeats);
    }
    FILE* f = fopen(argv[3], "wb");
    if (!f || fwrite(outputs, sizeof(float), (size_t)n_out, f) != (size_t)n_out) {
        fprintf(stderr, "cannot write %s\n", argv[3]);
        return 1;
    }
    fclose(f);
    free(weights); free(inputs); free(outputs);
    return 0;
}
"""


#: what ``export(prefix=)`` takes: a C identifier
C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _write(path: Path, content: str | bytes) -> None:
    """Write a file of the export as a new file moved into place: a link left in the folder (a shared /tmp/out)
    is replaced, never written through to the file it points at."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # O_EXCL: a new file
    with os.fdopen(fd, "w" if isinstance(content, str) else "wb") as f:
        f.write(content)
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)  # mkstemp makes it 0600; the export's files are ordinary ones
    os.replace(tmp, path)


def _c_comment_text(name: str) -> str:
    """A model's tensor name as safe text inside a C comment (no ``*/``, no control characters).

    Example:
        >>> _c_comment_text("a*/b\\n")
        'a??b?'
    """
    return re.sub(r"[^A-Za-z0-9_.:;,#@+=\-\[\]()<> ]", "?", name)[:80]


def export(net: NetSource, directory: str | os.PathLike, *, readme: str = "",
           names: tuple[Sequence[str], Sequence[str]] | None = None, prefix: str = "fj_model_") -> Path:
    """Write a standalone folder: model.c, model.h, main.c (a demo reading / writing raw float32 files),
    Makefile, weights.bin and README.txt. ``make`` in that folder builds ``demo`` and ``libmodel.so``.
    ``names``: the model's input and output names, written beside their shapes in model.h. ``prefix``:
    of every external symbol (``fj_model_run`` ...) and, upper-cased, of the header's macros and guard,
    so that two exported networks link into one program (``prefix="det_"``: ``det_run``, ``DET_STEPS``).

    Returns the folder path.
    """
    if not C_IDENTIFIER.fullmatch(prefix) or prefix.startswith("_"):  # _init: the C runtime's (reserved names)
        raise ValueError(f"prefix must be a C identifier not starting with '_', such as 'det_' (got {prefix!r})")

    def named(text: str) -> str:  # every external symbol starts fj_model_, every macro FJ_MODEL_
        return text.replace("fj_model_", prefix).replace("FJ_MODEL_", prefix.upper())

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _write(d / "model.c", named(_PRELUDE + '#include "model.h"\n' + net.source))
    header = net.header
    for kind, group in zip(("input", "output"), names or ((), ())):
        for k, name in enumerate(group):  # " *   input 0: float32 ..." -> " *   input 0 "x": float32 ..."
            header = header.replace(f" *   {kind} {k}: ", f" *   {kind} {k} \"{_c_comment_text(name)}\": ", 1)
    _write(d / "model.h", named(header))
    _write(d / "main.c", named(_MAIN_C))
    _write(d / "Makefile", _MAKEFILE)
    _write(d / "weights.bin", np.asarray(net.weights[: net.memory.weight_floats], dtype="<f4").tobytes())
    shapes = "\n".join([f"  input {k}: {list(s)}" for k, s in enumerate(net.input_shapes)]
                       + [f"  output {k}: {list(s)}" for k, s in enumerate(net.output_shapes)])
    _write(d / "README.txt",
        (readme.rstrip() + "\n\n" if readme else "")
        + "A felixjax whole-network build. Build with `make` (needs a GNU C compiler, gcc: the kernels use its vector\n"
        "extensions and builtins; clang builds some networks, and model.c stops with an #error where it cannot;\n"
        "POSIX for clock_gettime; OpenMP optional: `make CFLAGS=\"-O3 -march=native\"` builds it single-threaded).\n"
        "Your own flags work too (-std=c11, -Wall -Wextra -Werror, -ffast-math).\n\n"
        "  make\n  ./demo weights.bin inputs.bin outputs.bin [repeats]\n\n"
        "inputs.bin / outputs.bin: all inputs / outputs in order, raw little-endian float32, row-major.\n"
        f"Tensors:\n{shapes}\n\n"
        "weights.bin is packed for this model.c's schedules (layouts differ from the ONNX file's and between\n"
        f"builds): use it only with this model.c ({prefix}weights_match checks; the demo refuses another).\n"
        f"Threads: OMP_NUM_THREADS, else every core ({prefix}set_threads sets the calling thread's count).\n\n"
        f"Link model.c into your program and see model.h for the interface ({prefix}init, {prefix}run).\n")
    return d
