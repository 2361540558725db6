"""``python -m hvd_ngp.bench <benchmark> [options]``: dispatches to ``hvd_ngp.bench.<benchmark>``."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

from ..errors import run_cli

HELPERS = ("report", "inference")  # modules other benchmarks use; no ``main`` of their own


def available() -> list[str]:
    """The benchmarks: the package's modules, less the private ones (ranks' scripts) and the helpers."""
    here = Path(__file__).parent
    return sorted(
        m.name for m in pkgutil.iter_modules([str(here)]) if not m.name.startswith("_") and m.name not in HELPERS
    )


def cli(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = available()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in names:
        print(
            f"usage: python -m hvd_ngp.bench {{{','.join(names)}}} [options]   (--help after a name for its options)",
            file=sys.stderr,
        )
        sys.exit(0 if argv and argv[0] in ("-h", "--help") else 2)
    module = importlib.import_module(f"hvd_ngp.bench.{argv[0]}")
    run_cli(module.main, argv[1:], prog=f"python -m hvd_ngp.bench {argv[0]}")


if __name__ == "__main__":
    cli()
