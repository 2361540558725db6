"""Progress bars on long renders: shown at once when stderr is a terminal, else only once a render has run
for ``LOG_DELAY_S`` seconds (a log file gets no bar for short renders)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")

#: seconds a render runs before a progress bar appears when stderr is not a terminal
LOG_DELAY_S = 5.0


def progress_delay() -> float:
    """0 when stderr is a terminal, else ``LOG_DELAY_S``."""
    isatty = getattr(sys.stderr, "isatty", None)
    return 0.0 if isatty is not None and isatty() else LOG_DELAY_S


def progress(items: Iterable[T], desc: str, unit: str, show: bool = True, total: int | None = None) -> Iterable[T]:
    """``items`` under a tqdm bar on stderr (``show`` False: ``items`` as they are, e.g. on ranks other than 0)."""
    if not show:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit=unit, total=total, delay=progress_delay(), file=sys.stderr, leave=False)
