"""``python -m hvd_ngp.doctor``: the environment doctor, kept at its old command; the code is ``hvd_ngp.observe.doctor``."""

from hvd_ngp.observe.doctor import cli

if __name__ == "__main__":
    cli()
