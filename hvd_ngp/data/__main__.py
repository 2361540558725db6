"""``python -m hvd_ngp.data info SCENE``: the data-info tool; its code is ``hvd_ngp.tools.data_info``."""

from hvd_ngp.tools.data_info import cli

cli()
