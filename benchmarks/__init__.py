"""Benchmarks that write their own tables into docs/BENCHMARKS.md (run them as scripts)."""


def shape_probe_args(doc: str, shapes, argv=None):
    """The command line of a shape-set probe (``--shapes`` one of ``shapes``, ``--threads``, ``--rounds``),
    parsed; ``doc``'s first line is its description."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--shapes", choices=sorted(shapes), default="designed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    return ap.parse_args(argv)
