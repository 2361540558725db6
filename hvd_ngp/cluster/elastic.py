"""Elastic training under ``horovodrun --min-np/--max-np --host-discovery-script`` (Gloo controller).

The training loop runs inside ``dist.elastic_run`` (Horovod's ``hvd.elastic.run`` with a
``TorchState`` of the field, optimizer, occupancy grid, step, ray count and run progress). Every
``commit_every`` steps the state is committed (an in-memory copy; a collective that also notices
added or removed hosts). When the world changes, Horovod re-forms it and this module:

- re-enters the loop from the committed step (after a failure) or the current one (a host left);
- gives every rank its new pixel shard (tiles dealt by a seeded permutation, ``data.shards.shard_units``,
  over the new world size) and fresh random streams seeded by
  (seed, rank, step), so no two ranks draw the same rays;
- leaves the learning rate to ``comm.CommSettings.lr_multiplier`` (applied every step from the
  current world size).

Before the loop nothing may communicate (a worker that joins later would run those collectives
while the others sync state, and deadlock): start-up checks run locally (``startup_agree``), a
resumed checkpoint is loaded by rank 0 only and reaches the others through the first state sync.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, TypeVar

from . import dist

if TYPE_CHECKING:  # the state is passed in: the cluster layer sits below state/
    from ..state.trainstate import TrainState

T = TypeVar("T")


def startup_agree(fn: Callable[[], T], what: str) -> T:
    """``dist.agree`` outside an elastic job; inside one, ``fn()`` alone (no collective before the loop)."""
    return fn() if dist.elastic() else dist.agree(fn, what)


def run(
    train_loop: Callable[[Callable[[], None]], None], reseed: Callable[[], None], ts: TrainState, commit_every: int
) -> None:
    """Run ``train_loop(commit)`` elastically; the loop calls ``commit()`` after every step.

    ``reseed()`` gives this rank its shard and fresh streams for the current world and ``ts.step``.
    """
    if commit_every < 1:
        raise ValueError(f"commit_every must be >= 1, got {commit_every}")
    world = {"size": dist.runtime().size}

    def on_reset() -> None:
        rt = dist.runtime()
        dist.log(
            f"elastic: the world changed from {world['size']} to {rt.size} rank(s); continuing from the "
            f"last agreed state"
        )
        world["size"] = rt.size

    def body(state) -> None:
        ts.step, ts.n_rays, ts.progress = state.step, state.n_rays, state.progress
        if ts.ema is not None:
            ts.ema.count = state.ema_count
        ts.grid.refresh_occupied()
        if ts.step > 0:  # after a reset, a resume or a late join: shard and streams for this world
            reseed()
            dist.log(f"elastic: step {ts.step} on {dist.runtime().size} rank(s)")

        def commit() -> None:
            if ts.step % commit_every == 0:
                state.step, state.n_rays, state.progress = ts.step, ts.n_rays, ts.progress
                state.ema_count = ts.ema.count if ts.ema is not None else 0
                state.commit()

        train_loop(commit)

    averages = ts.ema.tensors() if ts.ema is not None else {}
    dist.elastic_run(
        body,
        ts.field,
        ts.optimizer,
        {"grid_density": ts.grid.density, **averages},
        on_reset,
        step=ts.step,
        n_rays=ts.n_rays,
        progress=ts.progress,
        ema_count=ts.ema.count if ts.ema is not None else 0,
    )
