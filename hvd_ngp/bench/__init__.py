"""Benchmarks: ``python -m hvd_ngp.bench <name> [options]``.

Each subcommand is a module of this package with ``main(argv) -> int`` (modules starting with ``_``
are helpers). ``scaling``: throughput, efficiency, communication share, GPU utilization, energy and
time-to-PSNR for several rank counts, with a raw allreduce ceiling measured in the same run.
"""
