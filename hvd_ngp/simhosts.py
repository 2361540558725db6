"""``python -m hvd_ngp.simhosts``: simulated hosts for multi-node tests, kept at its old command; the code is
``hvd_ngp.testing.simhosts``."""

from hvd_ngp.errors import run_cli
from hvd_ngp.testing.simhosts import main

if __name__ == "__main__":
    run_cli(main, prog="simhosts")
