"""``python -m hvd_ngp.launch`` (hvd-ngp-launch): the cluster launcher; its code is ``hvd_ngp.tools.launch``."""

from hvd_ngp.tools.launch import cli

if __name__ == "__main__":
    cli()
