"""CUDA kernels for felixjax (issue 18): GPU spec tables, the GPU sketch, the CUDA renderer, nvcc
builds, CPU emulation of the emitted source, and the GPU simulator.

Modules:
    specs     published spec tables ("a100", "h100", "a10g", "orin", "a6000")
    space     the ``cuda_tiled`` sketch: block / vthread / thread / inner tiles, split reduction,
              shared-memory staging with cooperative fetch, unroll; constraints; ``Geometry``
    render    the CUDA dialect table and renderer (a real ``.cu`` kernel)
    nvcc      ``nvcc -cubin`` through argument lists; ``ptxas -v`` read back (or an estimate)
    emulate   the emitted ``.cu`` compiled as C++ with a shim and run on the CPU (threads as fibers)
    sim       the analytic GPU simulator (occupancy, waves, traffic, coalescing, banks, latency hiding)

Only numpy and the standard library are imported (the ``codegen`` rule).
"""
