"""State that outlives a process: checkpoints (``checkpoint``), what they hold (``trainstate``) and
failure handling (``failures``: non-finite guard, watchdog, one-line reports)."""
