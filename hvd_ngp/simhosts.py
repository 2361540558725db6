"""``python -m hvd_ngp.simhosts`` (``hvd-ngp-simhosts``): simulated hosts for multi-node tests, kept at its old
command; the code is ``hvd_ngp.testing.simhosts``."""

from hvd_ngp.testing.simhosts import cli

if __name__ == "__main__":
    cli()
