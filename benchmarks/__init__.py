"""Benchmarks that write their own tables into docs/BENCHMARKS.md (run them as scripts)."""
