"""Lint, format and types, held by tools (issue 47): ``ruff check`` (pyproject.toml's rules) on the package and the
tests, ``ruff format --check`` on the files already in ruff's format (FORMATTED), and ``mypy`` on the package
(pyproject.toml's [tool.mypy], every module checked). docs/linting.md: how to fix a finding."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10: mypy's own dependency tomli reads TOML the same way
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent

#: what ``ruff format --check`` holds: the whole tree (formatted once on 2026-12-06, docs/linting.md)
FORMATTED = ["hvd_ngp", "tests"]

RUFF_CHECK = ("ruff", "check", "--no-cache", "--output-format", "concise")
RUFF_FORMAT_CHECK = ("ruff", "format", "--check", "--no-cache")


def tool(*args: str, stdin: str | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``python -m ruff|mypy ARGS`` from the repository root (its pyproject.toml), output captured."""
    module = args[0]
    try:
        __import__(module)
    except ImportError:
        pytest.fail(f"{module} is not installed: pip install -r scripts/requirements.txt")
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, input=stdin, capture_output=True, text=True, env=env, timeout=300
    )


def test_ruff_check_passes():
    proc = tool(*RUFF_CHECK, "hvd_ngp", "tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_formatted_files_stay_formatted():
    missing = [f for f in FORMATTED if not (ROOT / f).exists()]
    assert not missing, f"FORMATTED names files that do not exist: {missing}"
    proc = tool(*RUFF_FORMAT_CHECK, *FORMATTED)
    assert proc.returncode == 0, proc.stdout + proc.stderr + "\nrun: ruff format FILE (docs/linting.md)"


def test_mypy_passes():
    """The whole package under pyproject.toml's settings (cache: .mypy_cache, so a rerun takes seconds)."""
    proc = tool("mypy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found" in proc.stdout and "hvd_ngp" not in proc.stdout.split("Success")[0]


def test_mypy_checks_every_module():
    """No type debt: pyproject.toml leaves no module of the package out of ``mypy`` and switches no error off for
    part of it (an override with ``ignore_errors``, ``disable_error_code`` or imports followed silently, an
    ``exclude``); a finding is fixed or silenced on its line (docs/linting.md)."""
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["packages"] == ["hvd_ngp"] and "exclude" not in mypy and not mypy.get("ignore_errors"), mypy
    escapes = [
        override["module"]
        for override in mypy.get("overrides", [])
        if override.get("ignore_errors")
        or override.get("disable_error_code")
        or override.get("follow_imports") in ("skip", "silent")
    ]
    assert not escapes, f"modules left out of mypy in pyproject.toml: {escapes}"


@pytest.mark.parametrize(
    "source, rule",
    [
        ("import os\n", "F401"),  # an unused import
        ("import sys\nimport os\n\nprint(os, sys)\n", "I001"),  # imports out of order
        ("def f(x):\n    return x == None\n", "E711"),  # comparison to None
        ("x = 1 \n", "W291"),  # trailing whitespace
    ],
)
def test_ruff_check_catches_a_new_finding(source, rule):
    """The configured rules fire on a file of the package (read from stdin: nothing is written)."""
    proc = tool(*RUFF_CHECK, "--stdin-filename", "hvd_ngp/observe/new_module.py", "-", stdin=source)
    assert proc.returncode == 1 and rule in proc.stdout, proc.stdout + proc.stderr


def test_format_check_catches_an_unformatted_file():
    proc = tool(*RUFF_FORMAT_CHECK, "--stdin-filename", "hvd_ngp/new_module.py", "-", stdin="x = {'a':1}\n")
    assert proc.returncode == 1, proc.stdout + proc.stderr


def test_mypy_catches_a_new_type_error(tmp_path):
    """pyproject.toml's mypy settings flag an Optional used unchecked, an unused ``type: ignore`` and one that
    names no error code."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "bad.py").write_text(
        "def size(x: list[int] | None) -> int:\n    return len(x)\n\n\n"
        "y: int = 1  # type: ignore[assignment]\n"
        'z: int = "1"  # type: ignore\n'
    )
    config, cache = str(ROOT / "pyproject.toml"), str(tmp_path / "cache")
    proc = tool("mypy", "--config-file", config, "--cache-dir", cache, "-p", "pkg", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert 'bad.py:2: error: Argument 1 to "len" has incompatible type "list[int] | None"' in proc.stdout, proc.stdout
    assert 'bad.py:5: error: Unused "type: ignore" comment' in proc.stdout, proc.stdout
    assert 'bad.py:6: error: "type: ignore" comment without error code' in proc.stdout, proc.stdout
