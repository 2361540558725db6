"""mkdocs hook (mkdocs.yml: hooks): fills the configuration page's marker line with the option tables that
hvd_ngp.tools.config_reference generates from the trainer's parser, so the site never lists a stale flag."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def on_page_markdown(markdown: str, page, config, files) -> str:
    if str(ROOT) not in sys.path:  # this checkout's hvd_ngp, whatever the venv has installed
        sys.path.insert(0, str(ROOT))
    from hvd_ngp.tools import config_reference

    return config_reference.fill(markdown)
