"""Helpers shared by the tests and the benchmarks (benchmarks put tests/ on sys.path)."""
