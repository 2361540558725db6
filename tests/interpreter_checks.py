"""Memory checks for Triton's CPU interpreter, for the test suite.

Under ``TRITON_INTERPRET=1`` a kernel's loads, stores and atomics go straight to host addresses: one
outside the kernel's tensors reads garbage or corrupts the test process's heap, which shows up later
as an unrelated failure or a segmentation fault. ``install()`` makes every such access a failure of the
kernel that made it: each masked access must lie inside the storage of one of the launch's tensor
arguments, or the launch raises ``InterpreterMemoryError`` naming the kernel and the address.

``poisoned_memory()`` fills memory that torch hands out uninitialised (``torch.empty``) with NaN (and
the largest integer), so code that reads memory nothing wrote fails where it reads it, not on
whichever machine happens to have NaN there.

Both lean on the interpreter's internals (Triton 3.x: ``GridExecutor._init_args_hst`` and the
``InterpreterBuilder`` memory methods); ``install()`` returns False where those are missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch


class InterpreterMemoryError(AssertionError):
    """A kernel under the interpreter touched memory outside its tensor arguments."""


_spans: list[tuple[int, int]] = []  # [start, end) of the running launch's tensor storages
_kernel = ["?"]
_installed = [False]


def _check(ptrs, mask, what: str) -> None:
    """Every masked pointer of ``ptrs`` (an interpreter TensorHandle of addresses) inside one span."""
    from triton.runtime import interpreter

    addresses = np.asarray(ptrs.data)
    live = np.ones(addresses.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask.data), addresses.shape)
    addresses = addresses[live].astype(np.uint64)
    if addresses.size == 0:
        return
    width = np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize
    inside = np.zeros(addresses.shape, bool)
    for start, end in _spans:
        inside |= (addresses >= start) & (addresses + width <= end)
    if not inside.all():
        bad = addresses[~inside]
        spans = ", ".join(f"[{hex(s)}, +{e - s} B)" for s, e in _spans)
        raise InterpreterMemoryError(
            f"kernel {_kernel[0]}: {what} of {bad.size} element(s) outside its tensor "
            f"arguments, first at {hex(int(bad[0]))} (arguments: {spans})"
        )


def install() -> bool:
    """Check every masked load, store and atomic of interpreted kernels from now on (idempotent).
    False where this Triton's interpreter lacks the hooks (nothing is changed then)."""
    if _installed[0]:
        return True
    try:
        from triton.runtime import interpreter

        executor, builder = interpreter.GridExecutor, interpreter.InterpreterBuilder
        names = ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas")
        originals = [getattr(builder, n) for n in names]
        init_args = executor._init_args_hst
        interpreter._get_np_dtype  # noqa: B018 (used by _check)
    except (ImportError, AttributeError):
        return False
    load, store, rmw, cas = originals

    def init_args_hst(self, args_dev, kwargs):
        args, kw = init_args(self, args_dev, kwargs)
        _spans.clear()
        for arg in [*args, *kw.values()]:
            if isinstance(arg, torch.Tensor):
                storage = arg.untyped_storage()
                _spans.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
        _kernel[0] = getattr(self.fn, "__name__", "?")
        return args, kw

    def masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        _check(ptrs, mask, "load")
        return load(self, ptrs, mask, other, cache_policy, is_volatile)

    def masked_store(self, ptrs, value, mask, cache_policy):
        _check(ptrs, mask, "store")
        return store(self, ptrs, value, mask, cache_policy)

    def atomic_rmw(self, op, ptr, val, mask, sem, scope):
        _check(ptr, mask, "atomic")
        return rmw(self, op, ptr, val, mask, sem, scope)

    def atomic_cas(self, ptr, cmp, val, sem, scope):
        _check(ptr, None, "atomic compare-and-swap")
        return cas(self, ptr, cmp, val, sem, scope)

    executor._init_args_hst = init_args_hst
    for name, fn in zip(names, (masked_load, masked_store, atomic_rmw, atomic_cas)):
        setattr(builder, name, fn)
    _installed[0] = True
    return True


@contextlib.contextmanager
def poisoned_memory() -> Iterator[None]:
    """Inside: ``torch.empty`` (and every uninitialised allocation) is filled with NaN / the largest integer."""
    was = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])
