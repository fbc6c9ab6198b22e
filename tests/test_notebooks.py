"""Every notebooks/*.ipynb executes headless from top to bottom (kernel python3, repository root as cwd,
FELIXJAX_NOTEBOOK_QUICK=1: a notebook that reads it runs its cells on CI-size budgets)."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    # every cell runs; a notebook that reads it (03) runs them on smaller budgets (the kernel inherits it)
    monkeypatch.setenv("FELIXJAX_NOTEBOOK_QUICK", "1")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()  # raises CellExecutionError with the failing cell's traceback
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors


def _sources(nb) -> list[tuple[str, str, str]]:
    """What a generator decides: every cell's id, type and source (outputs come from a real run)."""
    return [(c.get("id", ""), c.cell_type, c.source) for c in nb.cells]


def test_notebooks_are_generated_and_current():
    """A notebook with a generator (notebooks/make_NN.py, naming it NOTEBOOK) has the cells it writes
    (committed notebooks also carry the outputs of a run: ``python notebooks/execute.py``)."""
    nbformat = pytest.importorskip("nbformat")
    import importlib.util

    for gen in sorted((ROOT / "notebooks").glob("make_*.py")):
        spec = importlib.util.spec_from_file_location(gen.stem, gen)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.NOTEBOOK.exists(), f"run python {gen.relative_to(ROOT)}"
        committed = nbformat.read(module.NOTEBOOK, as_version=4)
        assert _sources(committed) == _sources(module.build()), f"rerun python {gen.relative_to(ROOT)}"
