"""Test-only infrastructure: fault injection (``faults``, armed by ``HVD_NGP_FAULTS`` and reached from the
product only through ``hvd_ngp.faultpoints``) and simulated hosts for multi-node tests (``simhosts``)."""
