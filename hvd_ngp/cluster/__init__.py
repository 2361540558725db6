"""hvd_ngp.cluster."""
