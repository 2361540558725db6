"""hvd_ngp.training."""
