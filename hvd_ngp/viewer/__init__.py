"""The web viewer (viser): a live view of a training run from rank 0 (``live.LiveViewer``, ``--viewer PORT``)
and of a finished snapshot (``hvd-ngp-view``, ``tools.view``). ``server`` is the only viser importer; frame
sizes and pacing are in ``resolution``, browser cameras in ``cameras``. docs/viewer.md is the user's page."""
