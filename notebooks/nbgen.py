"""Shared by the notebook generators (notebooks/make_NN.py): cells -> a reproducible notebook."""
from __future__ import annotations

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

#: The first code cell of every notebook imports felixjax this way (``sys`` and ``Path`` imported
#: before it), so a notebook runs from a checkout that is not pip-installed too.
IMPORT_FELIXJAX = '''try:
    import felixjax as fj
except ImportError:  # a checkout that is not pip-installed: put the repository on the path
    root = Path.cwd()
    while not (root / "felixjax").is_dir() and root != root.parent:
        root = root.parent
    sys.path.insert(0, str(root))
    import felixjax as fj
'''


def build_notebook(cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    """A v4 notebook of ``("md" | "code", source)`` cells with stable ids (regenerating is a no-op)."""
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.cells = [new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells]
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"
    return nb


def write_notebook(nb: nbformat.NotebookNode, path) -> None:
    nbformat.validate(nb)
    nbformat.write(nb, path)
    print(f"wrote {path}")
