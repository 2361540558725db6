"""The distributed runtime: the only module that imports Horovod.

Bootstrap order (as in Horovod's examples): ``init()`` -> pin the device by local rank -> seed by
GLOBAL rank -> build the model -> ``distributed_optimizer`` -> ``broadcast_state``.

Started without a launcher (no horovodrun/mpirun environment), everything here is a size-1
fallback that never imports Horovod, so ``python -m hvd_ngp.train`` works on a laptop.
Every collective in this module must be called by every rank in the same order. The blocking
ones report their time to ``commclock.COMM_CLOCK`` (the communication share of the live metrics).
"""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

import torch

from .commclock import COMM_CLOCK
from .. import launcher_env
from ..errors import BackendError, HvdNgpError

T = TypeVar("T")

@dataclass(frozen=True)
class Runtime:
    """Where this process sits in the job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_size: int
    device: torch.device
    controller: str  # "mpi" | "gloo" | "none"

    @property
    def is_root(self) -> bool:
        return self.rank == 0


_hvd = None  # horovod.torch, once initialised
_runtime: Runtime | None = None


def launched() -> bool:
    """True when started by horovodrun/mpirun (or any MPI launcher; see ``launcher_env``)."""
    return launcher_env.launched()


def wants_cuda(device: str) -> bool:
    """Whether ``--device`` (auto | cuda | cpu) means a GPU run on this machine."""
    return torch.cuda.is_available() if device == "auto" else device == "cuda"


def init(device: str = "auto", threads: int = 0, env: Mapping[str, str] | None = None) -> Runtime:
    """Initialise Horovod (or the size-1 fallback), pin the device and size the CPU thread pool.

    ``env``: variables Horovod and NCCL read inside ``hvd.init()`` (``HOROVOD_CYCLE_TIME``,
    ``NCCL_ALGO``, ...; see ``comm.CommSettings.init_env``), set just before it.
    """
    global _hvd, _runtime
    if _runtime is not None:
        return _runtime
    if launched():
        want_cuda = wants_cuda(device)
        os.environ.update(env or {})
        if not want_cuda:
            # CPU ranks share cores with MPI's progress loop: let it yield instead of spinning
            # (measured 43 s -> 31 s for 300 steps of the built-in scene on 2 cores, 2 ranks).
            os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
        try:
            import horovod.torch as hvd
        except ImportError as exc:
            raise BackendError(f"started by a launcher but Horovod cannot be imported ({exc}); "
                               "run scripts/setup.sh to build it") from None
        hvd.init()
        _hvd = hvd
        rank, size = hvd.rank(), hvd.size()
        local_rank, local_size, cross_size = hvd.local_rank(), hvd.local_size(), hvd.cross_size()
        controller = "mpi" if hvd.mpi_enabled() and not hvd.gloo_enabled() else ("gloo" if hvd.gloo_enabled() else "mpi")
    else:
        rank, size, local_rank, local_size, cross_size, controller = 0, 1, 0, 1, 1, "none"

    use_cuda = wants_cuda(device)
    if use_cuda:
        if not torch.cuda.is_available():
            raise BackendError("--device cuda but torch sees no CUDA GPU")
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        dev = torch.device("cuda", index)
    else:
        dev = torch.device("cpu")
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(threads or max(1, cores // local_size))
    _runtime = Runtime(rank, size, local_rank, local_size, cross_size, dev, controller)
    return _runtime


def runtime() -> Runtime:
    if _runtime is None:
        raise RuntimeError("hvd_ngp.cluster.dist.init() has not been called")
    return _runtime


def horovod_info() -> dict[str, str]:
    """Horovod's version, what it was built with and the controller in use (for ``hvd_ngp.observe.doctor``).

    Imports Horovod even in a size-1 run (it does not initialise it); never raises.
    """
    try:
        import horovod
        import horovod.torch as hvd

        nccl = hvd.nccl_built()  # NCCL_VERSION_CODE, or 0
        built = [name for name, flag in (("mpi", hvd.mpi_built()), ("gloo", hvd.gloo_built())) if flag]
        if nccl:
            major, rest = (nccl // 10000, nccl % 10000) if nccl >= 20900 else (nccl // 1000, nccl % 1000)
            built.append(f"nccl {major}.{rest // 100}.{rest % 100}")
        built += [name for name, flag in (("cuda", hvd.cuda_built()), ("rocm", hvd.rocm_built()),
                                          ("ddl", hvd.ddl_built()), ("ccl", hvd.ccl_built())) if flag]
    except Exception as exc:  # ImportError, or a library that fails to load (wrong torch ABI)
        return {"version": f"error: {type(exc).__name__}: {exc}", "built": "-", "controller": "-"}
    controller = _runtime.controller if (_runtime is not None and _hvd is not None) else "not initialised"
    return {"version": horovod.__version__, "built": ", ".join(built) or "nothing", "controller": controller}


def communicating() -> bool:
    """True when collectives reach other ranks (Horovod initialised, more than one rank); False at size 1."""
    return _hvd is not None and _runtime is not None and _runtime.size > 1


def shutdown() -> None:
    global _hvd, _runtime
    if _hvd is not None:
        _hvd.shutdown()
    _hvd, _runtime = None, None


# ------------------------------------------------------------------------------ collectives

_OPS = {"sum": "Sum", "avg": "Average", "max": "Max", "min": "Min"}


def allreduce(tensor: torch.Tensor, op: str = "sum", name: str | None = None) -> torch.Tensor:
    """Allreduce a tensor (op: sum | avg | max | min); returns a new tensor. Identity at size 1."""
    if _hvd is None or _runtime.size == 1:
        return tensor.clone()
    with COMM_CLOCK.blocking(tensor):
        return _hvd.allreduce(tensor, op=getattr(_hvd, _OPS[op]), name=name)


def allreduce_(tensor: torch.Tensor, op: str = "sum", name: str | None = None) -> torch.Tensor:
    """In-place allreduce."""
    if _hvd is None or _runtime.size == 1:
        return tensor
    with COMM_CLOCK.blocking(tensor):
        return _hvd.allreduce_(tensor, op=getattr(_hvd, _OPS[op]), name=name)


def allreduce_async(tensor: torch.Tensor, op: str = "sum", name: str | None = None) -> Any:
    """Start an allreduce without waiting (Horovod fuses it with tensors submitted in the same cycle).

    Returns a handle for ``synchronize``; at size 1 the handle is a copy of ``tensor``.
    """
    if _hvd is None or _runtime.size == 1:
        return tensor.clone()
    return _hvd.allreduce_async(tensor, op=getattr(_hvd, _OPS[op]), name=name)


def synchronize(handle: Any) -> torch.Tensor:
    """Wait for an ``allreduce_async`` and return its result."""
    if isinstance(handle, torch.Tensor):
        return handle
    return _hvd.synchronize(handle)


def allgather(tensor: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dim 0, in rank order (``[size * n, ...]`` when all have n rows)."""
    if _hvd is None or _runtime.size == 1:
        return tensor.clone()
    return _hvd.allgather(tensor, name=name)


def allgather_object(obj: T, name: str | None = None) -> list[T]:
    """Every rank's ``obj``, ordered by rank (picklable objects only; for small metadata)."""
    if _hvd is None or _runtime.size == 1:
        return [obj]
    with COMM_CLOCK.blocking():
        return _hvd.allgather_object(obj, name=name)


def broadcast_object(obj: T, root: int = 0, name: str | None = None) -> T:
    if _hvd is None or _runtime.size == 1:
        return obj
    with COMM_CLOCK.blocking():
        return _hvd.broadcast_object(obj, root_rank=root, name=name)


def barrier() -> None:
    if _hvd is not None and _runtime.size > 1:
        with COMM_CLOCK.blocking():
            _hvd.barrier()


def broadcast_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Make every rank start from rank 0's parameters, buffers and (if given) optimizer state.

    Pass the optimizer only when rank 0's holds state (a loaded snapshot): Horovod initialises an
    empty state with a zero-gradient step, which moves weight-decayed parameters. The optimizer
    state therefore goes first and the parameters after it, overwriting any such move.
    """
    if _hvd is None or _runtime.size == 1:
        return
    if optimizer is not None:
        _hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    _hvd.broadcast_parameters(model.state_dict(), root_rank=0)


def broadcast_(tensor: torch.Tensor, root: int = 0, name: str | None = None) -> torch.Tensor:
    """In-place broadcast from ``root``."""
    if _hvd is None or _runtime.size == 1:
        return tensor
    with COMM_CLOCK.blocking(tensor):
        return _hvd.broadcast_(tensor, root_rank=root, name=name)


def allreduce_many_(tensors: Sequence[torch.Tensor], op: str = "avg", name: str = "many") -> None:
    """In-place allreduce of several tensors, all in flight at once (Horovod fuses them like gradients)."""
    if _hvd is None or _runtime.size == 1:
        return
    handles = [_hvd.allreduce_async_(t, op=getattr(_hvd, _OPS[op]), name=f"{name}.{i}") for i, t in enumerate(tensors)]
    for h in handles:
        _hvd.synchronize(h)


def allreduce_buffers_(tensors: Sequence[torch.Tensor], names: Sequence[str], op: str = "avg",
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> None:
    """In-place allreduce of each of ``tensors`` (named ``names``: the same on every rank), then wait for all.

    All are submitted before the first wait, so Horovod negotiates them in one cycle; tensors of
    different dtypes still travel as separate collectives (Horovod fuses only equal dtypes). The
    factors multiply before and after the sum (Horovod applies ``1 / size`` on top of
    ``postscale_factor`` for ``avg``). Timed by ``COMM_CLOCK``. No Horovod call at size 1.
    """
    if len(tensors) != len(names):
        raise ValueError(f"{len(tensors)} tensors but {len(names)} names")
    if _hvd is None or _runtime.size == 1:
        return
    with COMM_CLOCK.blocking(*tensors):
        handles = [_hvd.allreduce_async_(t, name=n, op=getattr(_hvd, _OPS[op]), prescale_factor=prescale_factor,
                                         postscale_factor=postscale_factor) for t, n in zip(tensors, names)]
        for h in handles:
            _hvd.synchronize(h)


def distributed_optimizer(optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.nn.Parameter]],
                          compression: str = "none", backward_passes_per_step: int = 1,
                          op: str = "average") -> torch.optim.Optimizer:
    """Wrap an optimizer so gradients are averaged across ranks (Horovod tensor fusion + NCCL/MPI/Gloo).

    compression: none | fp16; op: average | adasum; ``backward_passes_per_step`` backward passes
    accumulate locally before one allreduce. Not wrapped at size 1,
    except in an elastic job, whose world may grow later. ``COMM_CLOCK`` times the wait in ``synchronize()``.
    """
    if _hvd is None or (_runtime.size == 1 and not elastic()):
        return optimizer
    comp = _hvd.Compression.fp16 if compression == "fp16" else _hvd.Compression.none
    reduce_op = _hvd.Adasum if op == "adasum" else _hvd.Average
    wrapped = _hvd.DistributedOptimizer(optimizer, named_parameters=list(named_parameters), compression=comp,
                                        backward_passes_per_step=backward_passes_per_step, op=reduce_op)
    return COMM_CLOCK.wrap_synchronize(wrapped)


# ------------------------------------------------------------------------------ elastic training


def elastic() -> bool:
    """True under an elastic horovodrun (``--min-np``/``--max-np``/``--host-discovery-script``)."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"


def _refresh_runtime() -> None:
    """After an elastic reset: the new rank and sizes (the device stays: Horovod keeps slots stable)."""
    global _runtime
    old = runtime()
    _runtime = Runtime(_hvd.rank(), _hvd.size(), _hvd.local_rank(), _hvd.local_size(), _hvd.cross_size(),
                       old.device, old.controller)


def elastic_run(body: Callable[[Any], T], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                tensors: dict[str, torch.Tensor], on_reset: Callable[[], None], **objects: Any) -> T:
    """Run ``body(state)`` under ``hvd.elastic.run`` with a ``TorchState`` of model, optimizer, ``objects``.

    ``state.commit()`` (inside ``body``, collective) keeps an in-memory copy and raises Horovod's
    interrupt when hosts were added or removed; the wrapper then re-forms the world, calls
    ``on_reset()`` (after this module's runtime is refreshed), syncs the state from rank 0 and calls
    ``body`` again. ``tensors`` (e.g. the occupancy grid, whose bool buffer Horovod cannot
    broadcast) are saved, restored and broadcast with the state. An optimizer with no state yet is
    not broadcast (Horovod would initialise it with a zero-gradient step that moves weight-decayed
    parameters); the model is broadcast after the optimizer so any such move is overwritten.
    """
    if _hvd is None:
        raise RuntimeError("elastic_run needs an elastic horovodrun")
    from horovod.torch.elastic import TorchState

    class State(TorchState):
        def __init__(self) -> None:
            self._tensors = tensors
            self._saved_tensors = {k: t.clone() for k, t in tensors.items()}
            super().__init__(model=model, optimizer=optimizer, **objects)

        def save(self) -> None:
            self._saved_tensors = {k: t.clone() for k, t in self._tensors.items()}
            super().save()

        def restore(self) -> None:
            for k, t in self._tensors.items():
                t.copy_(self._saved_tensors[k])
            super().restore()

        def sync(self) -> None:
            stateless = _hvd.broadcast_object(len(optimizer.state) == 0, root_rank=0, name="elastic.stateless")
            if not stateless:
                self._handlers["optimizer"].sync()
            self._handlers["model"].sync()
            for k, t in self._tensors.items():
                _hvd.broadcast_(t, root_rank=0, name=f"elastic.{k}")
            super(TorchState, self).sync()  # the plain objects

    state = State()
    state.register_reset_callbacks([_refresh_runtime, on_reset])
    return _hvd.elastic.run(body)(state)


# ------------------------------------------------------------------------------ agreement on failure


def is_collective_failure(exc: BaseException) -> bool:
    """True for Horovod's error when a collective was aborted because another rank failed or left."""
    return type(exc).__name__ == "HorovodInternalError"


class RankFailure(HvdNgpError):
    """Raised on every rank when ``agree`` saw an error on any rank."""


def agree(fn: Callable[[], T], what: str) -> T:
    """Run ``fn`` on every rank; if it raised a user-facing error on any rank, raise it on all.

    Turns "one rank failed to load its input and the others hang in the next collective" into
    one clear error everywhere. Costs one small allgather.
    """
    result: Any = None
    message = ""
    try:
        result = fn()
    except HvdNgpError as exc:
        message = str(exc)
    except Exception as exc:  # an unexpected failure still must not hang the other ranks
        message = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
    if _hvd is None or _runtime.size == 1:
        if message:
            raise RankFailure(message)
        return result
    messages = allgather_object(message, name="agree")  # not named after `what`: it may differ across ranks
    failed = [(r, m) for r, m in enumerate(messages) if m]
    if failed:
        r, m = failed[0]
        others = f" (and {len(failed) - 1} more rank(s))" if len(failed) > 1 else ""
        raise RankFailure(f"{what} failed on rank {r}{others}: {m}")
    return result


def log(*parts: Any, all_ranks: bool = False) -> None:
    """Print on global rank 0 only (or on every rank, prefixed by its rank)."""
    rt = _runtime
    if rt is None or rt.is_root or all_ranks:
        prefix = f"[rank {rt.rank}] " if (all_ranks and rt is not None and rt.size > 1) else ""
        print(prefix + " ".join(str(p) for p in parts), file=sys.stderr, flush=True)
