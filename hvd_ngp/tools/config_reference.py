"""The trainer's options as a Markdown reference, generated from its argument parser.

``python -m hvd_ngp.tools.config_reference`` prints it; ``--out FILE`` writes it. The docs site builds its
configuration page from it (scripts/mkdocs_hooks.py), so the page lists exactly what
``python -m hvd_ngp.train --help`` accepts: one table per argparse group (in the parser's order), each row
the option, its values, its default, its ``HVD_NGP_*`` environment variable and its help text.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from typing import Sequence

from ..errors import ConfigError, run_cli
from ..options import options_from

#: where the generated tables go in a page (docs/configuration.md); the docs hook replaces this line
MARKER = "<!-- config-reference: generated from hvd_ngp.config.build_parser -->"

_HOME = os.path.expanduser("~")


def _cell(text: str) -> str:
    """Text safe inside one Markdown table cell: no pipes, no HTML tags, no line breaks, no stray emphasis."""
    text = " ".join(str(text).split())
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")


def _default(action: argparse.Action) -> str:
    """The default as a user types it: home folders as ``~``, flags as off, unset options as a dash."""
    value = action.default
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "on" if value else "off"
    if value is None or value == argparse.SUPPRESS:
        return "-"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) if value else "-"
    text = str(value)
    if _HOME and _HOME != os.sep and text.startswith(_HOME):
        text = "~" + text[len(_HOME) :]
    return f"`{text}`" if "`" not in text else _cell(text)


def _env_var(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """configargparse's automatic variable (prefix + option name, upper case); '-' for plain argparse."""
    prefix = getattr(parser, "_auto_env_var_prefix", None)
    longs = [o for o in action.option_strings if o.startswith("--")]
    if prefix is None or not longs or getattr(action, "is_config_file_arg", False):
        return "-"
    return "`" + (prefix + longs[0].lstrip("-")).replace("-", "_").upper() + "`"


def _option(action: argparse.Action) -> str:
    """``--flag`` with its values (choices) or its metavar."""
    names = ", ".join(f"`{o}`" for o in action.option_strings)
    if action.choices:
        return f"{names} {{{', '.join(str(c) for c in action.choices)}}}"
    if action.nargs == 0:
        return names
    if action.metavar:
        metavar = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
        return f"{names} {_cell(metavar)}"
    return names


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text with argparse's %-substitutions done, flags written as code."""
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    text = argparse.HelpFormatter(parser.prog)._expand_help(action)  # without "(default: ...)": a column says it
    text = _cell(text)
    return re.sub(r"(?<![\w`-])(--[a-z][a-z0-9_-]*)", r"`\1`", text)


def groups(parser: argparse.ArgumentParser) -> list[tuple[str, list[argparse.Action]]]:
    """(title, options) for every argparse group that has an option besides --help, in the parser's order."""
    out = []
    for group in parser._action_groups:
        actions = [
            a
            for a in group._group_actions
            if a.option_strings and a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)
        ]
        if actions:
            title = "general" if group.title in (None, "options", "optional arguments") else group.title
            out.append((title, actions))
    return out


def reference(parser: argparse.ArgumentParser | None = None) -> str:
    """Markdown: one section per argparse group, one table row per option."""
    if parser is None:
        from ..config import build_parser

        parser = build_parser()
    lines = []
    for title, actions in groups(parser):
        lines += [
            f"### {title[0].upper() + title[1:]}",
            "",
            "| option | default | environment | meaning |",
            "|---|---|---|---|",
        ]
        lines += [f"| {_option(a)} | {_default(a)} | {_env_var(parser, a)} | {_help(parser, a)} |" for a in actions]
        lines.append("")
    return "\n".join(lines)


def fill(page: str, parser: argparse.ArgumentParser | None = None) -> str:
    """The page with its marker line replaced by the reference (the page unchanged when it has no marker)."""
    return page.replace(MARKER, reference(parser)) if MARKER in page else page


@dataclass(frozen=True)
class ReferenceOptions:
    """The command line: where the reference goes (``out``) and which page it fills (``page``; '': none)."""

    out: str
    page: str


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m hvd_ngp.tools.config_reference", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="", help="write the Markdown here instead of printing it")
    p.add_argument("--page", default="", help="a page with the marker line: print (or --out) it filled in")
    opts = options_from(ReferenceOptions, p.parse_args(argv))
    if opts.page:
        try:
            with open(opts.page, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise ConfigError(f"{opts.page}: cannot read the page ({exc.strerror})") from None
        if MARKER not in text:
            raise ConfigError(f"{opts.page}: no marker line {MARKER!r} to fill in")
        text = fill(text)
    else:
        text = reference()
    if opts.out:
        try:
            with open(opts.out, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise ConfigError(f"{opts.out}: cannot write the reference ({exc.strerror})") from None
    else:
        print(text)


def cli() -> None:
    run_cli(main, prog="hvd_ngp.tools.config_reference")


if __name__ == "__main__":
    cli()
