"""hvd_ngp.observe."""
