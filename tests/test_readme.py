"""The README's two commands are the ones CI and users run."""

from __future__ import annotations

import re

from conftest import ROOT

TRAIN = "bash scripts/setup.sh && .venv/bin/horovodrun -np 2 -H localhost:2 .venv/bin/python -m hvd_ngp.train"
TEST = "HVD_NGP_BROWSER=1 bash scripts/setup.sh && bash scripts/test.sh"


def test_readme_holds_both_commands_and_ci_runs_the_test_command():
    readme = (ROOT / "README.md").read_text()
    assert TRAIN in readme and TEST in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^" + re.escape(TEST) + r"$", ci, flags=re.M)
