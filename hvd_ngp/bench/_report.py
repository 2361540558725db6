"""Benchmark output: aligned text tables for the terminal, Markdown sections for docs/BENCHMARKS.md."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Sequence

BENCHMARKS_HEADER = ("# Benchmarks\n\nEvery section below was appended by the command it shows "
                     "(`python -m hvd_ngp.bench ...`), on the machine it names. Newest last.\n")


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def append_section(path: str | Path, title: str, body: str) -> None:
    """Append ``## <UTC date> <title>`` and ``body`` to a Markdown file (created with a header)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = path.read_text() if path.exists() else BENCHMARKS_HEADER
    path.write_text(text.rstrip("\n") + f"\n\n## {stamp} — {title}\n\n{body.strip()}\n")


def fmt(value: float | None, spec: str, unit: str = "", missing: str = "n/a") -> str:
    return missing if value is None else f"{value:{spec}}{unit}"
