"""``python -m hvd_ngp.bench <name> [options]``: run one benchmark (imported only when asked for)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

from ..errors import ConfigError, run_cli


def available() -> list[str]:
    """Subcommands: the package's modules that do not start with an underscore."""
    return sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])
                  if not m.name.startswith("_"))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    names = available()
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m hvd_ngp.bench {{{','.join(names)}}} [options]  (--help after a name for its options)")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in names:
        raise ConfigError(f"unknown benchmark {name!r} (available: {', '.join(names)})")
    return importlib.import_module(f"{__package__}.{name}").main(rest)


if __name__ == "__main__":
    run_cli(main, prog="hvd_ngp.bench")
