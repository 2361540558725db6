"""Flat gradient buffers: every ``p.grad`` a view into one buffer per dtype, reduced by one allreduce each.

For a training step that Horovod's per-gradient hooks cannot follow (a CUDA-graph replay: no
Horovod call may happen inside a capture), the step becomes::

    flat = FlatGradients(field.named_parameters(), tail=guard.width)   # once, before capture
    flat.zero_()                    # not optimizer.zero_grad(): its default set_to_none=True drops the views
    loss.backward()                 # autograd accumulates into the views, i.e. into the flat buffers
    guard.fold(loss, flat.tail)     # the non-finite guard's flags ride in the fp32 buffer's tail
    flat.allreduce_(compression=comm.compression)   # one collective per dtype, outside any graph
    # or: pending = flat.allreduce_start(...); <host work not touching the gradients>; pending.wait()
    guard.should_skip(optimizer, step, grads=flat); optimizer.step()

Layout: parameters are grouped by dtype (buffers ordered by dtype name, parameters in the order
given), each parameter's gradient a contiguous segment starting on a ``ALIGN_BYTES`` boundary
(padding stays zero). The float32 buffer (created for the tail alone when no parameter is
float32) ends with ``tail`` extra floats.

Why the views survive: once ``p.grad`` is defined, autograd's AccumulateGrad adds into it in
place (``grad += new``) unless the backward runs with ``create_graph=True``; ``zero_grad(
set_to_none=False)`` and ``zero_()`` zero in place. ``zero_grad()`` with its default
``set_to_none=True`` sets ``p.grad = None`` and the next backward allocates a fresh tensor:
``allreduce_`` checks the views first and raises ``FlatGradientError`` naming the parameter.

Every rank must build its ``FlatGradients`` from the same parameter list (shapes, dtypes, order)
and call ``allreduce_`` (or ``allreduce_start``) at the same point: the collectives are named after
the dtype buffers.
"""

from __future__ import annotations

from typing import Iterable

import torch

from . import dist
from .comm import COMPRESSIONS

ALIGN_BYTES = 64  # segment alignment: vectorised loads and Triton's 16-byte pointer specialisation


class FlatGradientError(RuntimeError):
    """A parameter's ``.grad`` is no longer its view into the flat buffer."""


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class FlatGradients:
    """Flat gradient buffers for ``parameters`` (``Parameter``s or ``(name, Parameter)`` pairs, one device).

    ``buffers``: dtype -> 1-D buffer ``[n]`` holding every gradient of that dtype (and, for
    float32, the tail); ``tail``: ``[tail]`` float32 view at the end of the float32 buffer, or
    None. Parameters without ``requires_grad`` are left out; a parameter given twice counts once.
    An existing ``p.grad`` is copied into its segment; the rest starts at zero.
    """

    def __init__(
        self,
        parameters: Iterable[torch.nn.Parameter] | Iterable[tuple[str, torch.nn.Parameter]],
        tail: int = 0,
        name: str = "flatgrad",
    ) -> None:
        if tail < 0:
            raise ValueError(f"tail must be >= 0, got {tail}")
        self.name = name
        named: list[tuple[str, torch.nn.Parameter]] = []
        seen: set[int] = set()
        for i, item in enumerate(parameters):
            pname, p = item if isinstance(item, tuple) else (f"parameter {i}", item)
            if not p.requires_grad or id(p) in seen:
                continue
            if p.is_sparse or not p.dtype.is_floating_point:
                raise ValueError(
                    f"{pname}: flat gradients need a dense floating-point parameter, got {p.layout} {p.dtype}"
                )
            seen.add(id(p))
            named.append((pname, p))
        if not named and tail == 0:
            raise ValueError("no parameter requires a gradient and there is no tail: nothing to reduce")
        devices = {p.device for _, p in named}
        if len(devices) > 1:
            raise ValueError(f"flat gradients need every parameter on one device, got {sorted(map(str, devices))}")
        self.device = devices.pop() if devices else torch.device("cpu")
        self.params = named

        # dtype -> [(name, param, offset)], and each buffer's length
        layout: dict[torch.dtype, list[tuple[str, torch.nn.Parameter, int]]] = {}
        lengths: dict[torch.dtype, int] = {}
        for pname, p in named:
            align = max(1, ALIGN_BYTES // p.element_size())
            start = -(-lengths.get(p.dtype, 0) // align) * align
            layout.setdefault(p.dtype, []).append((pname, p, start))
            lengths[p.dtype] = start + p.numel()
        if tail:
            align = ALIGN_BYTES // 4
            lengths[torch.float32] = -(-lengths.get(torch.float32, 0) // align) * align
            layout.setdefault(torch.float32, [])
        order = sorted(lengths, key=_short)
        self.buffers: dict[torch.dtype, torch.Tensor] = {
            dt: torch.zeros(lengths[dt] + (tail if dt == torch.float32 else 0), dtype=dt, device=self.device)
            for dt in order
        }
        self.tail = self.buffers[torch.float32][lengths[torch.float32] :] if tail else None
        # (name, parameter, its buffer, offset): views are cut afresh by ``attach`` (Horovod's
        # DistributedOptimizer with compression re-points a ``p.grad`` with ``set_``, view object and all)
        self._segments = [(pname, p, self.buffers[dt], start) for dt in order for pname, p, start in layout[dt]]
        self._staging: dict[torch.dtype, torch.Tensor] = {}  # fp16 copies for compression, made on first use
        self.attach()

    @property
    def numel(self) -> int:
        """Elements in all buffers (padding and tail included)."""
        return sum(b.numel() for b in self.buffers.values())

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def describe(self) -> str:
        """One line, e.g. ``flat gradients: float16 6291456 (12.0 MiB), float32 12352 + tail 2 (48.3 KiB)``
        (elements, padding included, and bytes per buffer)."""

        def size(n: int) -> str:
            return f"{n / 2**20:.1f} MiB" if n >= 2**20 else (f"{n / 2**10:.1f} KiB" if n >= 2**10 else f"{n} B")

        parts = []
        for dt, b in self.buffers.items():
            tail_n = self.tail.numel() if dt == torch.float32 and self.tail is not None else None
            tail = "" if tail_n is None else f" + tail {tail_n}"
            n = b.numel() - (tail_n or 0)
            parts.append(f"{_short(dt)} {n}{tail} ({size(b.numel() * b.element_size())})")
        return "flat gradients: " + ", ".join(parts)

    def attach(self) -> None:
        """Make every ``p.grad`` a view into its buffer, keeping a current ``p.grad``'s values (copied in)."""
        with torch.no_grad():
            for _, p, buf, start in self._segments:
                view = buf[start : start + p.numel()].view(p.shape)
                g = p.grad
                if g is not None and g.data_ptr() != view.data_ptr():
                    view.copy_(g.to_dense() if g.is_sparse else g)
                p.grad = view

    def check_views(self) -> None:
        """Raise ``FlatGradientError`` naming the first parameter whose ``.grad`` left its place in the buffer."""
        for pname, p, buf, start in self._segments:
            g = p.grad
            if (
                g is None
                or g.is_sparse
                or g.data_ptr() != buf.data_ptr() + start * buf.element_size()
                or g.shape != p.shape
                or not g.is_contiguous()
            ):
                what = "None" if g is None else "a separate tensor"
                raise FlatGradientError(
                    f"{pname}: .grad is {what}, no longer its view into the flat {_short(p.dtype)} buffer "
                    f"(zero_grad() sets gradients to None by default: use FlatGradients.zero_() or "
                    f"zero_grad(set_to_none=False); backward(create_graph=True) and Horovod's "
                    f"DistributedOptimizer with compression also replace them); FlatGradients.attach() re-points them"
                )

    def zero_(self) -> None:
        """Zero every buffer (gradients, padding and tail): one fill per dtype."""
        for b in self.buffers.values():
            b.zero_()

    def all_finite(self) -> bool:
        """True when every gradient is finite (tail left out; one host sync)."""
        checks = []
        for dt, b in self.buffers.items():
            grads = b[: b.numel() - self.tail.numel()] if dt == torch.float32 and self.tail is not None else b
            checks.append(torch.isfinite(grads).all())
        return bool(torch.stack(checks).all())

    def allreduce_(
        self,
        average: bool = True,
        compression: str = "none",
        prescale_factor: float = 1.0,
        postscale_factor: float = 1.0,
    ) -> None:
        """Reduce every buffer across ranks in place: one Horovod allreduce per dtype, waited for here.

        ``average``: Horovod's Average (sum / size) or Sum. ``compression`` "fp16": each buffer
        not already float16 is cast to float16, reduced, and cast back, as Horovod's
        ``Compression.fp16`` does per gradient. ``prescale_factor`` / ``postscale_factor`` multiply
        before and after the sum (Horovod's; the DistributedOptimizer uses 1 and 1). At size 1
        (or without Horovod) nothing happens: no cast, no call, as an unwrapped optimizer.
        ``allreduce_start`` followed by its ``wait()``.
        """
        self.allreduce_start(average, compression, prescale_factor, postscale_factor).wait()

    def allreduce_start(
        self,
        average: bool = True,
        compression: str = "none",
        prescale_factor: float = 1.0,
        postscale_factor: float = 1.0,
    ) -> "PendingGradients":
        """``allreduce_`` without the wait: submit the allreduces (after the fp16 casts) and return at once.

        Until ``wait()`` on the result the buffers (and every ``p.grad``) are Horovod's: the host may do
        other work meanwhile, but must neither read nor write them. At size 1: no cast, no call, and
        ``wait()`` does nothing.
        """
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
        self.check_views()
        if not dist.communicating():
            return PendingGradients(None, [])
        wire, names, copies = [], [], []
        for dt, b in self.buffers.items():
            if compression == "fp16" and dt != torch.float16:
                staging = self._staging.get(dt)
                if staging is None:
                    staging = self._staging[dt] = torch.empty(b.numel(), dtype=torch.float16, device=b.device)
                staging.copy_(b)
                wire.append(staging)
                names.append(f"{self.name}.{_short(dt)}.fp16")
                copies.append((b, staging))
            else:
                wire.append(b)
                names.append(f"{self.name}.{_short(dt)}")
        pending = dist.allreduce_buffers_start(
            wire, names, "avg" if average else "sum", prescale_factor, postscale_factor
        )
        return PendingGradients(pending, copies)


class PendingGradients:
    """A ``FlatGradients.allreduce_start`` in flight; ``wait()`` finishes it (then the fp16 staging buffers are
    cast back into the gradient buffers), once."""

    def __init__(self, pending: dist.PendingAllreduce | None, copies: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self._pending, self._copies = pending, copies  # copies: (gradient buffer, its fp16 staging buffer)

    def wait(self) -> None:
        if self._pending is None:
            return
        self._pending.wait()
        for b, staging in self._copies:
            b.copy_(staging)
        self._pending, self._copies = None, []
