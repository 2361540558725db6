"""hvd_ngp.testing."""
