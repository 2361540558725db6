"""hvd_ngp.tools."""
