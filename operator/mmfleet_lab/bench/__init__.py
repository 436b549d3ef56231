"""Benchmarks: measured, printed as a table, and written to docs/benchmarks.md with their command."""
