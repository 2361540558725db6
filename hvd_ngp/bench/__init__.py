"""Benchmarks that print a table, write JSON and append a dated section to docs/BENCHMARKS.md.

    python -m hvd_ngp.bench throughput --scene data/nerf_synthetic/lego
"""
