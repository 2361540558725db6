"""The cluster: the distributed runtime (``dist``, the only Horovod importer), communication settings
(``comm``), hosts and placement (``topology``), elastic training (``elastic``), Horovod's own tools
(``hvdtools``), stop signals (``preempt``) and the time blocked in collectives (``commclock``).

Below everything that trains; imports only ``errors`` and ``launcher_env`` from hvd_ngp."""
