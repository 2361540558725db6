"""Command lines on top of the library: ``render`` (``python -m hvd_ngp.render``), ``data_info``
(``python -m hvd_ngp.data info``) and ``launch`` (``hvd-ngp-launch``)."""
