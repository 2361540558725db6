"""tiny-cuda-nn's optimizer chain in torch: ``Ema`` > ``ExponentialDecay`` > ``Adam``.

- ``OptimizerChain.parse``: the config's nested blocks, in any order; an ``otype`` we do not
  implement is a ``ConfigError`` naming the config file.
- ``exponential_decay``: tiny-cuda-nn's learning-rate rule (``optimizers/exponential_decay.h``).
- ``Adam``: torch's Adam, plus tiny-cuda-nn's sparse rule for the groups marked ``sparse``
  (``"sparse_hash_updates": true`` in the Adam block; the hash table): an entry whose gradient is
  exactly zero is not touched (its moments do not decay) and counts its own steps for the bias
  correction (``optimizers/adam.h``).
- ``Adam.preview``: the value a step would give one parameter for a given gradient, committing nothing (the
  speculative step of ``--delay_compensation local``, ``training.gradsync``).
- ``ParameterEma``: tiny-cuda-nn's ``Ema`` (``optimizers/ema.h``), a bias-corrected exponential
  average of the parameters, swapped in for evaluation and rendering.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor, nn

from ..errors import ConfigError

WRAPPERS = ("Ema", "ExponentialDecay")
#: tiny-cuda-nn's defaults of an ExponentialDecay block
DECAY_DEFAULTS = {"decay_start": 10000, "decay_interval": 10000, "decay_base": 0.1, "decay_end": 10_000_000}
EMA_DEFAULT_DECAY = 0.99  # tiny-cuda-nn's default; instant-ngp's base config sets 0.95


@dataclass(frozen=True)
class OptimizerChain:
    """The ``optimizer`` block unwrapped: the Adam block and the wrappers around it (None: absent)."""

    adam: dict
    decay: dict | None
    ema: dict | None

    @staticmethod
    def parse(block: dict, source: str) -> "OptimizerChain":
        found: dict[str, dict] = {}
        while isinstance(block, dict) and block.get("otype") in WRAPPERS:
            if block["otype"] in found:
                raise ConfigError(f"{source}: optimizer chain has two {block['otype']} blocks")
            found[block["otype"]] = block
            block = block.get("nested", {})
        otype = block.get("otype") if isinstance(block, dict) else block
        if otype != "Adam":
            raise ConfigError(
                f"{source}: optimizer otype {otype!r} is not implemented (the chain may hold "
                f"{', '.join(WRAPPERS)} around Adam)"
            )
        ema = found.get("Ema")
        if ema is not None and not 0.0 <= float(ema.get("decay", EMA_DEFAULT_DECAY)) < 1.0:
            raise ConfigError(f"{source}: optimizer Ema.decay must be in [0, 1), got {ema.get('decay')}")
        return OptimizerChain(block, found.get("ExponentialDecay"), ema)


def exponential_decay(step: int, block: dict | None) -> float:
    """Learning-rate factor of 0-based step ``step`` under tiny-cuda-nn's ExponentialDecay ``block``.

    tiny-cuda-nn multiplies by ``decay_base`` before the steps ``decay_start``, ``decay_start +
    decay_interval``, ... up to ``decay_end``: the first factor applies at ``decay_start`` itself."""
    if block is None:
        return 1.0
    p = {**DECAY_DEFAULTS, **block}
    start, interval, end = int(p["decay_start"]), max(int(p["decay_interval"]), 1), int(p["decay_end"])
    if step < start:
        return 1.0
    return float(p["decay_base"]) ** ((min(step, end) - start) // interval + 1)


def _sparse_step(
    p: Tensor, grad: Tensor, m: Tensor, v: Tensor, steps: Tensor, group: dict
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """tiny-cuda-nn's Adam rule on the entries of ``p`` whose ``grad`` is not exactly zero, committing nothing
    (every tensor the shape of ``p``; ``steps``: each entry's step count) -> the new moments, the new step counts
    and the change to subtract from ``p``."""
    beta1, beta2 = group["betas"]
    touched = grad != 0
    g = grad.to(m.dtype)
    m1 = torch.where(touched, beta1 * m + (1 - beta1) * g, m)
    v1 = torch.where(touched, beta2 * v + (1 - beta2) * g * g, v)
    t1 = steps + touched.to(steps.dtype)
    tc = t1.clamp(min=1.0)
    lr = group["lr"] * torch.sqrt(1 - beta2**tc) / (1 - beta1**tc)
    return m1, v1, t1, torch.where(touched, lr * m1 / (v1.sqrt() + group["eps"]), torch.zeros_like(p))


class Adam(torch.optim.Adam):
    """torch's Adam; groups with ``sparse=True`` follow tiny-cuda-nn's rule for non-matrix parameters.

    Per sparse parameter the state holds ``exp_avg``, ``exp_avg_sq`` and ``entry_steps`` (float32,
    the parameter's shape: exact to 2^24 steps). tiny-cuda-nn's bias correction multiplies the
    learning rate by ``sqrt(1 - beta2^t) / (1 - beta1^t)`` and adds epsilon to ``sqrt(v)`` (torch
    adds it to the corrected ``sqrt(v_hat)``; equal up to epsilon's scale). No weight decay there,
    as in tiny-cuda-nn (L2 applies to matrix weights only).
    """

    def step(self, closure=None):
        sparse = [g for g in self.param_groups if g.get("sparse")]
        held = [(p, p.grad) for g in sparse for p in g["params"]]
        for p, _ in held:  # torch's Adam skips parameters without a gradient
            p.grad = None
        try:
            loss = super().step(closure)
        finally:
            for p, grad in held:
                p.grad = grad
        with torch.no_grad():
            for group in sparse:
                for p in group["params"]:
                    if p.grad is not None:
                        self._sparse_update(p, p.grad, group)
        return loss

    def _sparse_update(self, p: Tensor, grad: Tensor, group: dict) -> None:
        """One tiny-cuda-nn Adam step on the entries of ``p`` whose gradient is not exactly zero."""
        state = self.state[p]
        if not state:
            state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
            state["entry_steps"] = torch.zeros_like(p, dtype=torch.float32)
        m, v, t = state["exp_avg"], state["exp_avg_sq"], state["entry_steps"]
        m1, v1, t1, delta = _sparse_step(p, grad, m, v, t, group)
        m.copy_(m1)
        v.copy_(v1)
        t.copy_(t1)
        p.sub_(delta)

    def group_of(self, p: Tensor) -> dict:
        """The parameter group holding ``p`` (by identity); ValueError when none does."""
        group = next((g for g in self.param_groups if any(q is p for q in g["params"])), None)
        if group is None:
            raise ValueError("the parameter is not in this optimizer")
        return group

    @torch.no_grad()
    def preview(self, p: Tensor, grad: Tensor) -> Tensor:
        """The value ``step()`` would give parameter ``p`` (shape S) with ``grad`` (shape S) as its gradient, from
        the committed moments and step counts, which stay as they are: the same rule (torch's Adam, or the sparse
        rule for a ``sparse`` group), weight decay, bias corrections of the next step and the group's current
        learning rate. Returns a new tensor of shape S (``--delay_compensation local``'s speculative step)."""
        group = self.group_of(p)
        if group.get("amsgrad") or group.get("maximize") or group.get("decoupled_weight_decay"):
            raise ValueError("preview follows Adam without amsgrad, maximize or decoupled weight decay")
        state = self.state.get(p, {})
        beta1, beta2 = group["betas"]
        lr, eps = float(group["lr"]), group["eps"]
        g = grad.to(p.dtype)
        m = state["exp_avg"] if state else torch.zeros_like(p)
        v = state["exp_avg_sq"] if state else torch.zeros_like(p)
        if group.get("sparse"):  # ``_sparse_update`` without writing its state back
            steps = state["entry_steps"] if state else torch.zeros_like(p, dtype=torch.float32)
            return p - _sparse_step(p, grad, m, v, steps, group)[3]
        if group["weight_decay"]:
            g = g.add(p, alpha=group["weight_decay"])
        k = float(state["step"]) + 1 if state else 1.0  # torch's Adam counts this step first
        m1 = m.lerp(g, 1 - beta1)
        v1 = (v * beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v1.sqrt() / (1 - beta2**k) ** 0.5).add_(eps)
        return p.addcdiv(m1, denom, value=-lr / (1 - beta1**k))


class ParameterEma:
    """Bias-corrected exponential average of ``params`` (tiny-cuda-nn's Ema optimizer).

    After update t (1-based): ``avg_t = (d * (1 - d^(t-1)) * avg_(t-1) + (1 - d) * w_t) / (1 - d^t)``,
    i.e. a lerp towards ``w_t`` by ``(1 - d) / (1 - d^t)`` (1 at t = 1: the first average is the
    weights). Kept in fp32 (tiny-cuda-nn's ``full_precision``). ``count`` is a host int, the same on
    every rank, so an update costs no host sync.
    """

    def __init__(self, named_params: list[tuple[str, nn.Parameter]], decay: float) -> None:
        self.names = [n for n, _ in named_params]
        self.params: list[Tensor] = [p for _, p in named_params]
        self.decay = float(decay)
        self.average = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]
        self.count = 0
        self._backup: list[Tensor] | None = None

    @torch.no_grad()
    def update(self, sources: list[Tensor] | None = None) -> None:
        """After an optimizer step that every rank took. ``sources``: what to average instead of ``params`` (the
        same shapes, in their order; ``--delay_compensation local`` passes the shared grid parameters)."""
        self.count += 1
        weight = (1.0 - self.decay) / (1.0 - self.decay**self.count)
        torch._foreach_lerp_(self.average, [p.detach().float() for p in (sources or self.params)], weight)

    @contextmanager
    def swapped(self) -> Iterator[None]:
        """The averaged weights in the parameters inside the block, the raw ones after it (no-op before
        the first update)."""
        if self.count == 0:
            yield
            return
        with torch.no_grad():
            if self._backup is None:
                self._backup = [torch.empty_like(p) for p in self.params]
            torch._foreach_copy_(self._backup, self.params)
            torch._foreach_copy_(self.params, self.average)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.params, self._backup)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "count": self.count, "average": dict(zip(self.names, self.average))}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's average; an empty ``state`` (written without one) restarts the average."""
        if not state:
            self.count = 0
            return
        self.count = int(state["count"])
        for name, avg in zip(self.names, self.average):
            avg.copy_(state["average"][name])

    def tensors(self) -> dict[str, Tensor]:
        """The averages by name (for broadcasts and elastic state)."""
        return {f"ema.{n}": a for n, a in zip(self.names, self.average)}


def make_ema(field: nn.Module, chain: OptimizerChain) -> ParameterEma | None:
    if chain.ema is None:
        return None
    return ParameterEma(list(field.named_parameters()), float(chain.ema.get("decay", EMA_DEFAULT_DECAY)))


__all__ = ["Adam", "OptimizerChain", "ParameterEma", "exponential_decay", "make_ema"]
