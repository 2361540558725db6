"""``python -m hvd_ngp.render``: the render tool; its code is ``hvd_ngp.tools.render``."""

from hvd_ngp.tools.render import cli

cli()
