"""The cluster: the distributed runtime (``dist``, the only Horovod importer), communication settings
(``comm``), hosts and placement (``topology``), elastic training (``elastic``), Horovod's own tools
(``hvdtools``), stop signals (``preempt``), the time blocked in collectives (``commclock``) and the gradients
as one flat buffer (``flatgrad``).

Below everything that trains; imports only ``errors`` and ``launcher_env`` from hvd_ngp."""
