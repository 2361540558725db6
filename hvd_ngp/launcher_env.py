"""The launcher's environment, read in one place: whether a launcher started this process, and the
ranks and sizes it announces before Horovod starts.

Launchers: horovodrun (``HOROVOD_*``), Open MPI (``OMPI_COMM_WORLD_*``), MPICH / Intel MPI (``PMI_*``,
``MPI_LOCAL*``), PMIx, MVAPICH2 and SLURM (``SLURM_*``). Each tuple lists the variables a question
reads, first match wins. Nothing here imports Horovod or any hvd_ngp module: errors, the cluster
runtime, the communication settings and the doctor all read the environment through it.
"""

from __future__ import annotations

import os
from typing import Mapping

#: any of these set: a launcher started this process
LAUNCHER_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")
#: any of these set: an MPI launcher started it
MPI_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")
#: (world size, ranks on this node) pairs, both numbers, before Horovod starts
SIZE_PAIRS = (
    ("HOROVOD_SIZE", "HOROVOD_LOCAL_SIZE"),
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_SIZE", "MPI_LOCALNRANKS"),
)
#: the rank that messages name (``[rank N] ...``)
LABEL_RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
#: ranks and sizes as numbers (the doctor's plan, before init), SLURM's included
RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")
LOCAL_RANK_VARS = ("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
SIZE_VARS = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
LOCAL_SIZE_VARS = ("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def launched(environ: Mapping[str, str] | None = None) -> bool:
    """True when started by horovodrun/mpirun (or any MPI launcher)."""
    env = _env(environ)
    return any(v in env for v in LAUNCHER_VARS)


def launcher_sizes(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(world size, ranks on this node) from the launcher's variables, before Horovod starts; (1, 1) if unknown."""
    env = _env(environ)
    for size_var, local_var in SIZE_PAIRS:
        if env.get(size_var, "").isdigit() and env.get(local_var, "").isdigit():
            return int(env[size_var]), int(env[local_var])
    return 1, 1


def launcher_controller(environ: Mapping[str, str] | None = None) -> str | None:
    """ "gloo" under horovodrun --gloo, "mpi" under an MPI launcher, None when unknown."""
    env = _env(environ)
    if "HOROVOD_GLOO_RENDEZVOUS_ADDR" in env or env.get("HOROVOD_CONTROLLER", "").lower() == "gloo":
        return "gloo"
    if any(v in env for v in MPI_VARS):
        return "mpi"
    return None


def env_int(names: tuple[str, ...], default: int, environ: Mapping[str, str] | None = None) -> int:
    """The first of ``names`` that holds a number, else ``default``."""
    env = _env(environ)
    for name in names:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return default


def launcher_rank_label(environ: Mapping[str, str] | None = None) -> str:
    """``"[rank N] "`` from the launcher's environment (horovodrun, Open MPI, PMI); empty without one."""
    env = _env(environ)
    rank = next((env[v] for v in LABEL_RANK_VARS if v in env), None)
    return f"[rank {rank}] " if rank is not None else ""
