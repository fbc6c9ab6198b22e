"""Named sets of operators for comparisons and benchmarks (one place; the CLI and benchmarks use it).

Example:
    >>> from felixjax.suites import suite
    >>> [t.name for t in suite("ops")][:2]
    ['matmul_512x512x512', 'matmul_1024x1024x1024']
"""
from __future__ import annotations

from codegen.ops import Task, parse_spec

SUITES: dict[str, tuple[str, ...]] = {
    # the op suite of the gradient-vs-genetic comparison (issue 4, docs/BENCHMARKS.md)
    "ops": (
        "matmul:m=512,n=512,k=512",
        "matmul:m=1024,n=1024,k=1024",
        "conv2d:n=1,c=64,h=56,w=56,k=64,r=3,pad=1",
        "conv2d:n=1,c=128,h=28,w=28,k=128,r=3,pad=1",
        "conv2d:n=1,c=256,h=14,w=14,k=256,r=1",
        "depthwise_conv2d:n=1,c=256,h=28,w=28,r=3,pad=1",
        "dense:n=1,in=4096,out=1000",
    ),
    # shapes nobody designed on (issues 14 and 15): judge new ideas here, never tune the design on them
    "fresh": (
        "matmul:m=257,n=96,k=384",
        "depthwise_conv2d:n=1,c=96,h=112,w=112,r=3,stride=2,pad=1",
        "conv2d:n=1,c=256,h=14,w=14,k=1024,r=1",
        "conv2d:n=1,c=128,h=17,w=17,k=128,r=3,pad=1",
        "dense:n=1,in=1280,out=1000",
        "conv2d:n=1,c=3,h=128,w=128,k=32,r=5,stride=2,pad=2",
    ),
    # a hypothesis test (issue 15, session 63): pooled over 18 new seeds per op (sessions 60-62) the gradient search's
    # lead over genetic@32 was on the depthwise convs and the large GEMV, so these are new shapes of those two
    # families, fixed before any search ran on them (depthwise from MobileNetV2 / EfficientNet blocks, two GEMVs)
    "dw_gemv": (
        "depthwise_conv2d:n=1,c=32,h=112,w=112,r=3,pad=1",
        "depthwise_conv2d:n=1,c=144,h=56,w=56,r=3,stride=2,pad=1",
        "depthwise_conv2d:n=1,c=384,h=14,w=14,r=3,pad=1",
        "depthwise_conv2d:n=1,c=240,h=28,w=28,r=5,pad=2",
        "dense:n=1,in=3072,out=768",
        "dense:n=1,in=2560,out=1000",
    ),
    # calibrating tuner thresholds (issue 19's cost-aware options): neither the op suite nor "fresh"
    "calibration": (
        "matmul:m=384,n=768,k=256",
        "conv2d:n=1,c=32,h=112,w=112,k=64,r=3,pad=1",
        "conv2d:n=1,c=512,h=7,w=7,k=512,r=3,pad=1",
        "depthwise_conv2d:n=1,c=128,h=56,w=56,r=3,pad=1",
        "dense:n=1,in=2048,out=512",
    ),
}


def suite(name: str) -> list[Task]:
    """The tasks of a named suite (``felixjax compare --suite NAME``)."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; available: {', '.join(sorted(SUITES))}")
    return [parse_spec(s) for s in SUITES[name]]
