"""Benchmarks that print a table and write JSON where ``--json``/``--out_dir`` say; ``--markdown FILE`` also appends
a dated section with the command to FILE (never by default: docs/BENCHMARKS.md is edited by hand).

    python -m hvd_ngp.bench throughput --scene data/nerf_synthetic/lego
"""
