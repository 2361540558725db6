"""hvd_ngp.state."""
