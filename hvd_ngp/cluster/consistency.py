"""Every rank must train with the same settings: one collective at start compares them.

A setting that differs between ranks (an ``HVD_NGP_N_STEPS`` exported on one node only, another
config file on a node, another copy of the scene) makes the ranks run different collectives later,
and the job hangs until the watchdog. ``agree_on_settings`` gathers each rank's resolved settings
(``{name: value}``, values JSON-like) with one allgather and raises the same ``ConfigError`` on every
rank, before training, naming each differing setting with its value on each group of ranks.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from ..errors import ConfigError
from . import dist

#: settings shown in full in the message; the rest of a long list is counted
SHOWN = 6


def canonical(value: Any) -> str:
    """A value as a stable string (dicts with sorted keys), so equal settings compare equal."""
    return json.dumps(value, sort_keys=True, default=str)


def differences(per_rank: list[Mapping[str, str]]) -> list[str]:
    """``"name: 'a' on rank(s) 0, 'b' on rank(s) 1"`` for each setting whose value is not the same on every
    rank (a setting missing on a rank counts as ``<unset>``)."""
    names = sorted(set().union(*per_rank))
    found = []
    for name in names:
        groups: dict[str, list[int]] = {}
        for rank, settings in enumerate(per_rank):
            groups.setdefault(settings.get(name, "<unset>"), []).append(rank)
        if len(groups) > 1:
            parts = [f"{value[:80]} on rank(s) {','.join(map(str, ranks))}" for value, ranks in groups.items()]
            found.append(f"{name}: " + ", ".join(parts))
    return found


def agree_on_settings(settings: Mapping[str, Any], what: str = "settings") -> None:
    """Collective (one allgather): raise ``ConfigError`` on every rank when any setting differs between ranks."""
    mine = {name: canonical(value) for name, value in settings.items()}
    if not dist.communicating():
        return
    diff = differences(dist.allgather_object(mine, name="consistency.settings"))
    if diff:
        more = f" (and {len(diff) - SHOWN} more)" if len(diff) > SHOWN else ""
        raise ConfigError(
            f"the ranks disagree on {len(diff)} {what}{more}, so they would not run the same "
            f"collectives; give every rank the same command line, HVD_NGP_* environment, config and "
            f"scene: " + "; ".join(diff[:SHOWN])
        )
