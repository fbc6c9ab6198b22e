"""The architecture's rules, enforced (docs/ARCHITECTURE.md): an ast walk of every import in
felixjax/, codegen/ and costmodels/ — no import cycles (function-level imports count), codegen and
costmodels never import felixjax, strategies import nothing from felixjax but the context interface,
no module over 800 lines, and pipeline.py exists. Plus the "add a strategy" walkthrough, done once."""
import ast
from pathlib import Path

import numpy as np

import felixjax as fj

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("felixjax", "codegen", "costmodels")
MAX_LINES = 800


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules imported anywhere in the file (top level, functions, TYPE_CHECKING alike)."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, set(mods)) for name, path in mods.items()}


def _package_imports_are_not_cycles(graph):
    # "import felixjax.x" also runs felixjax/__init__; only edges between modules count here, and a
    # package's __init__ re-exporting its modules is not a dependency of those modules on it
    return {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    graph = _package_imports_are_not_cycles(_graph())
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_codegen_and_costmodels_never_import_felixjax():
    bad = {m: sorted(d for d in deps if d.split(".")[0] == "felixjax")
           for m, deps in _graph().items() if m.split(".")[0] in ("codegen", "costmodels")}
    assert {m: d for m, d in bad.items() if d} == {}


def test_codegen_never_imports_jax():
    for name, path in _modules().items():
        if name.split(".")[0] != "codegen":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            assert not any(m.split(".")[0] in ("jax", "flax", "optax") for m in mods), name


def test_strategies_import_only_the_context_from_felixjax():
    allowed = {"felixjax", "felixjax.context", "felixjax.strategies"}
    for name, deps in _graph().items():
        if name.startswith("felixjax.strategies"):
            inner = {d for d in deps if d.startswith("felixjax")}
            assert inner <= allowed | {d for d in inner if d.startswith("felixjax.strategies")}, (name, inner)


def test_no_module_over_800_lines():
    long = {name: n for name, p in _modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def _calls(path: Path) -> set[str]:
    return {f"{n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, 'id', '')}("
            for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)}


def test_every_benchmark_script_parses_its_arguments():
    """``python benchmarks/X.py --help`` shows a usage line and measures nothing: every script run as a
    program builds an argparse parser, its own or benchmarks.shape_probe_args' (two probes once ran their whole
    measurement on ``--help``)."""
    scripts = [p for p in (ROOT / "benchmarks").glob("*.py") if '__name__ == "__main__"' in p.read_text()]
    assert len(scripts) > 40
    bare = sorted(p.name for p in scripts if not {"ArgumentParser(", "shape_probe_args("} & set(_calls(p)))
    assert bare == []


def test_pipeline_calls_the_stages():
    from felixjax import pipeline

    for fn in ("tune_task", "tune_model", "build_model"):
        assert callable(getattr(pipeline, fn))
    assert fj.tune is pipeline.tune_task and fj.tune_model is pipeline.tune_model


# ----------------------------------------------------------------------------------------------
# Walkthrough "add a strategy" (docs/ARCHITECTURE.md), done once: one class, one decorator
# ----------------------------------------------------------------------------------------------

def test_walkthrough_add_a_strategy():
    from felixjax.strategies import SearchContext, register, registered
    from felixjax.strategies.base import _REGISTRY, fresh
    from felixjax.testing import ReplayRunner

    @register("greedy_test")
    class GreedyByModel:
        """Sample 8x more random configs than asked, keep the ones the shared cost model likes best."""

        name = "greedy_test"
        batch_size = 8

        def propose(self, ctx: SearchContext, n: int) -> list:
            names = sorted(ctx.spaces)
            pool = fresh(ctx, [ctx.spaces[names[int(ctx.rng.integers(len(names)))]].sample(ctx.rng)
                               for _ in range(8 * n)], 8 * n)
            scores = ctx.scorer.score(pool)
            return [pool[i] for i in np.argsort(-scores)[:n]]

        def update(self, ctx: SearchContext, records: list) -> None:
            ctx.scorer.update(records)

    try:
        assert "greedy_test" in registered()
        res = fj.tune(fj.ops.matmul(32, 48, 16), strategy="greedy_test", trials=16, progress=False, retime=0,
                      measurer=lambda t, tg: ReplayRunner.from_oracle(t, tg))
        assert len(res.history) == 16 and res.best.ok
    finally:
        _REGISTRY.pop("greedy_test", None)
