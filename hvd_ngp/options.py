"""A parsed command line as a frozen, typed dataclass.

argparse stays the parser; ``options_from`` copies its Namespace into the tool's options dataclass field by
field, once, and the rest of the tool reads the dataclass (issue 47: no module past the parser reads a
Namespace). A field without a value, or (for a tool's own parser) a value without a field, is a bug in the
tool, so it raises ``TypeError`` naming both sides instead of leaving a default to hide the drift.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def options_from(cls: type[T], ns: argparse.Namespace, *, subset: bool = False) -> T:
    """``cls`` (a dataclass) with every field taken from ``ns`` by name.

    ``subset``: ``ns`` may hold values that no field takes (one group of a larger parser's flags);
    otherwise every value of ``ns`` must have a field.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    values: dict[str, Any] = vars(ns)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    missing = [n for n in names if n not in values]
    extra = [] if subset else sorted(set(values) - set(names))
    if missing or extra:
        raise TypeError(
            f"{cls.__name__} does not match the parsed options: "
            f"fields without a value {missing or 'none'}, values without a field {extra or 'none'}"
        )
    return cls(**{n: values[n] for n in names})


def option_dests(parser: argparse.ArgumentParser) -> set[str]:
    """The Namespace names ``parser`` fills (its actions' ``dest``), ``--help`` and the like left out."""
    return {a.dest for a in parser._actions if a.dest is not argparse.SUPPRESS and a.dest != "help"}


def command_options(ns: argparse.Namespace, dest: str, commands: Mapping[str, type[T]]) -> T:
    """The options of the sub-command that ``ns[dest]`` names (``add_subparsers(dest=dest)``), as its class in
    ``commands``; the class has a field ``dest`` too, so each option class matches its sub-parser exactly."""
    return options_from(commands[vars(ns)[dest]], ns)
