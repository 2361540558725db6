"""hvd_ngp.model."""
