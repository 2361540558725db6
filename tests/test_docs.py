"""The docs: a README that fits on a screen and links to pages that exist, an option reference generated from the
trainer's parser, and a site that `mkdocs build --strict` builds (issue 47)."""

from __future__ import annotations

import argparse
import functools
import http.server
import importlib.util
import os
import re
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT

from hvd_ngp.config import build_parser
from hvd_ngp.errors import ConfigError
from hvd_ngp.tools import config_reference
from hvd_ngp.tools.config_reference import MARKER, reference


def _row(text: str, option: str) -> str:
    """The reference's table row of ``option``."""
    rows = [line for line in text.splitlines() if line.startswith(f"| `{option}`")]
    assert len(rows) == 1, f"{option}: {len(rows)} rows"
    return rows[0]


def _cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]


def test_readme_fits_on_a_screen_and_its_links_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert "docs/configuration.md" in local and "docs/BENCHMARKS.md" in local
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"
    assert "## Scaling out" in readme and "**Measured**" in readme and "**Projected**" in readme


def test_reference_lists_every_option_of_the_parser_with_its_default_and_variable():
    parser = build_parser()
    text = reference(parser)
    for title, actions in config_reference.groups(parser):
        assert f"### {title[0].upper() + title[1:]}" in text
        for action in actions:
            cells = _cells(_row(text, action.option_strings[0]))
            assert len(cells) == 4, cells
            option, default, env, meaning = cells
            if action.choices:
                assert all(str(c) in option for c in action.choices)
            if isinstance(action.default, (int, float)) and not isinstance(action.default, bool):
                assert default == f"`{action.default}`", (action.dest, default)
            if action.dest != "config":
                assert env == f"`HVD_NGP_{action.option_strings[0].lstrip('-').upper()}`"
            assert meaning, f"{action.dest} has no help text"
    assert "(default: 100)" not in _row(text, "--log_every")  # the default column says it, not the help text again
    assert "~/.cache/hvd_ngp/scenes" in _row(text, "--scene_cache")  # no engineer's home folder in the docs


def test_a_flag_added_to_the_parser_appears_in_the_reference():
    parser = build_parser()
    before = reference(parser)
    group = parser.add_argument_group("a new group")
    group.add_argument(
        "--zz_new_flag", type=int, default=7, choices=(7, 8), help="added by the test: 100%% new, <x> | y"
    )
    group.add_argument("--zz_switch", action="store_true", help="a switch")
    text = reference(parser)
    assert "--zz_new_flag" not in before and "### A new group" in text
    option, default, env, meaning = _cells(_row(text, "--zz_new_flag"))
    assert option == "`--zz_new_flag` {7, 8}" and default == "`7`" and env == "`HVD_NGP_ZZ_NEW_FLAG`"
    assert meaning == "added by the test: 100% new, &lt;x&gt; \\| y"  # %-expanded, no HTML tag, no stray column
    assert _cells(_row(text, "--zz_switch"))[1] == "off"


def test_fill_replaces_the_marker_and_the_cli_names_a_bad_page(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--only", default="a", help="the only option")
    page = f"# Options\n\n{MARKER}\n\nafter\n"
    filled = config_reference.fill(page, parser)
    assert MARKER not in filled and "| `--only` | `a` | - | the only option |" in filled and filled.endswith("after\n")
    assert config_reference.fill("no marker\n", parser) == "no marker\n"
    (tmp_path / "page.md").write_text(page)
    config_reference.main(["--page", str(tmp_path / "page.md"), "--out", str(tmp_path / "out.md")])
    assert "| `--n_steps` |" in (tmp_path / "out.md").read_text()
    (tmp_path / "plain.md").write_text("# nothing to fill\n")
    with pytest.raises(ConfigError, match=r"plain\.md: no marker line"):
        config_reference.main(["--page", str(tmp_path / "plain.md")])
    with pytest.raises(ConfigError, match=r"absent\.md: cannot read the page"):
        config_reference.main(["--page", str(tmp_path / "absent.md")])


def test_configuration_page_carries_the_marker():
    assert MARKER in (ROOT / "docs" / "configuration.md").read_text()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The docs site, built once by `mkdocs build --strict` (skipped where mkdocs is not installed)."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs-material is not installed (scripts/setup.sh installs it: scripts/requirements.txt)")
    out = tmp_path_factory.mktemp("docs") / "site"
    # no --quiet: mkdocs then drops the warnings before --strict counts them, and a broken link passes
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _options() -> list[str]:
    return [a.option_strings[0] for a in build_parser()._actions if a.option_strings and a.option_strings[0] != "-h"]


def test_mkdocs_build_strict(site):
    html = (site / "configuration" / "index.html").read_text()
    assert "config-reference" not in html  # the marker was filled in
    missing = [o for o in _options() if f"<code>{o}</code>" not in html]
    assert not missing, f"the built configuration page lacks {missing}"
    for page in (
        "install",
        "first-run",
        "your-own-capture",
        "scaling",
        "operations",
        "monitoring",
        "troubleshooting",
        "look-at-your-result",
        "BENCHMARKS",
        "ARCHITECTURE",
    ):
        assert (site / page / "index.html").is_file(), page


def test_the_configuration_page_in_chromium(site, tmp_path):
    """Served over HTTP and opened in headless Chromium as a reader would: the theme's styles apply, every option
    is a row of a rendered table, and the screenshot is not blank."""
    from hvd_ngp.viewer.browser import HeadlessChromium, find_chromium

    exe = find_chromium()
    if exe is None:
        pytest.skip("no Chromium installed (scripts/setup.sh with HVD_NGP_BROWSER=1: apt-get install chromium)")
    import cv2
    import numpy as np

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with HeadlessChromium(1200, 900, executable=exe) as browser:
            browser.open(f"http://127.0.0.1:{server.server_address[1]}/configuration/")
            deadline = time.monotonic() + 30
            while browser.evaluate("document.readyState") != "complete" and time.monotonic() < deadline:
                time.sleep(0.2)
            header = browser.evaluate("getComputedStyle(document.querySelector('.md-header')).backgroundColor")
            assert header not in (None, "", "rgba(0, 0, 0, 0)"), f"the theme's stylesheet did not apply: {header}"
            rows = browser.evaluate("""Array.from(document.querySelectorAll('article table tbody tr'))
                .filter(r => r.getBoundingClientRect().height > 0)
                .map(r => r.querySelector('td code') ? r.querySelector('td code').textContent : '')""")
            shown = [r for r in rows if r.startswith("--")]
            assert sorted(shown) == sorted(_options()), set(shown) ^ set(_options())
            browser.evaluate(
                "document.evaluate(\"//code[text()='--n_steps']\", document, null, 9, null)"
                ".singleNodeValue.scrollIntoView()"
            )
            png = browser.screenshot()
        (tmp_path / "configuration.png").write_bytes(png)
        shot = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_GRAYSCALE)
        assert shot.shape[1] == 1200 and shot.std() > 10, f"blank page? {tmp_path / 'configuration.png'}"
    finally:
        server.shutdown()
        server.server_close()
