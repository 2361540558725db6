"""``python -m hvd_ngp.viewer._probe_child``: the child process that ``probe.ProbeProcess`` starts (``probe.main``),
not a user tool."""

from ..errors import run_cli
from .probe import main

if __name__ == "__main__":
    run_cli(main, prog="hvd_ngp.viewer._probe_child")
