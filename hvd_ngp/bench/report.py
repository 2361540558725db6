"""Shared output of the benchmarks: a plain-text table, a JSON file, a dated markdown section."""

from __future__ import annotations

import datetime as _dt
import json
import shlex
import sys
from pathlib import Path

from ..errors import ConfigError


def table(rows: list[dict], columns: list[str]) -> str:
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    return "\n".join([line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in cells)])


def write_json(path: str | Path, data: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))


def append_markdown(path: str | Path, title: str, body: str, argv: list[str] | None = None) -> None:
    """Append a dated section with the exact command that produced it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    command = "python -m hvd_ngp.bench " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = "" if path.exists() else "# Benchmarks\n\nMeasured results, newest last. Each section names the command.\n"
    with path.open("a") as f:
        f.write(f"{header}\n## {title} ({stamp})\n\n`{command}`\n\n{body}\n")


def comma_list(text: str, kind, flag: str, error: type[Exception] = ConfigError) -> list:
    """``--flag a,b,c`` as a list of ``kind`` (int or float; blanks skipped); a bad item raises ``error``
    naming the flag."""
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        what = "integers" if kind is int else "numbers"
        raise error(f"--{flag} expects comma-separated {what}, got {text!r}") from None
