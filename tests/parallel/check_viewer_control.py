"""Run under ``horovodrun -np N``: pause, resume and save asked on rank 0 (as the viewer's buttons do) reach
every rank.

    python tests/parallel/check_viewer_control.py SCENE_CACHE OUT_DIR [trainer flags]

Rank 0's scripted watcher asks for a pause after step 8, and ``PAUSE_S`` seconds later resumes and asks for
one save. Every rank first gathers what it saw (no assertion before the collective, so a failing rank cannot
leave the others in it); rank 0 then asserts, for every rank: the run finished; the rank waited in the pause
(``RunControl.wait``) once, after step 8, until at least ``PAUSE_S`` after rank 0's watcher paused, and took
no step meanwhile; exactly one checkpoint was written, at step 8, readable. The ranks share one host, so
their ``time.monotonic`` clocks agree. (A rank that reaches the pause's collective late waits less than
``PAUSE_S`` itself, so the wait's length is not what is checked.) Prints ``CHECK viewer_control OK`` on rank 0.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import TINY_ARGS  # noqa: E402

from hvd_ngp.cluster import dist  # noqa: E402
from hvd_ngp.config import CPU_CONFIG, parse_args  # noqa: E402
from hvd_ngp.state.checkpoint import CheckpointManager, read_snapshot  # noqa: E402
from hvd_ngp.training import control, trainer  # noqa: E402

PAUSE_S = 1.0
PAUSE_AFTER = 8


class ScriptedWatcher:
    """Rank 0's stand-in for the viewer: pause after step 8, then resume with a save request."""

    def __init__(self) -> None:
        self.step, self.paused_at, self.idles, self.saves_asked = 0, None, 0, 0

    def pending(self) -> tuple[bool, bool]:
        if self.step == PAUSE_AFTER and self.paused_at is None:
            self.paused_at = time.monotonic()
        if self.paused_at is not None and time.monotonic() - self.paused_at >= PAUSE_S and not self.saves_asked:
            self.saves_asked = 1
            return False, True
        return self.paused_at is not None and not self.saves_asked, False

    def idle(self) -> None:
        self.idles += 1

    def after_step(self, step: int) -> None:
        self.step = step

    def record(self, step: int, values: dict) -> None:
        pass

    def close(self) -> None:
        pass


def main() -> None:
    cache, out_dir, *extra = sys.argv[1:]
    args = parse_args(
        [
            "--config",
            str(CPU_CONFIG),
            *TINY_ARGS,
            "--scene_cache",
            cache,
            "--out_dir",
            out_dir,
            "--n_steps",
            "24",
            "--log_every",
            "8",
            "--device",
            "cpu",
            "--save_renders",
            "0",
            "--n_eval_views",
            "1",
            *extra,
        ]
    )
    waits: list[tuple[int, float, float]] = []  # (steps taken, start, end) of each wait on this rank
    steps: list[tuple[int, float]] = []  # (step, time) each step started
    real_wait, real_step = control.RunControl.wait, trainer.Trainer.step

    def wait(self):
        started = time.monotonic()
        asked = real_wait(self)
        waits.append((len(steps), started, time.monotonic()))
        return asked

    def step(self, n, *a, **k):
        steps.append((n, time.monotonic()))
        return real_step(self, n, *a, **k)

    control.RunControl.wait, trainer.Trainer.step = wait, step
    watcher = ScriptedWatcher()
    result = trainer.run(args, attach=lambda tr: watcher)
    rt = dist.runtime()
    seen = dist.allgather_object((result.step, waits, steps), name="check.seen")
    if not rt.is_root:
        return
    assert watcher.paused_at is not None, "rank 0's watcher never paused"
    resumed = watcher.paused_at + PAUSE_S
    for rank, (last, rank_waits, rank_steps) in enumerate(seen):
        assert last == 24, f"rank {rank}: stopped at step {last}"
        assert len(rank_waits) == 1 and rank_waits[0][0] == PAUSE_AFTER, (
            f"rank {rank}: waits (steps taken, start, end) {rank_waits}"
        )
        _, start, end = rank_waits[0]
        assert end >= resumed, f"rank {rank}: left the pause {resumed - end:.3f} s before rank 0 resumed"
        during = [n for n, t in rank_steps if start <= t <= end]
        assert not during, f"rank {rank}: took steps {during} while paused"
    assert watcher.idles > 0, "the viewer was not given time to draw while paused"
    found = CheckpointManager(Path(out_dir) / "checkpoints").existing()
    assert [s for s, _ in found] == [PAUSE_AFTER], f"checkpoints {found}"
    assert int(read_snapshot(found[0][1])["step"]) == PAUSE_AFTER
    print(
        f"CHECK viewer_control OK (paused after step {PAUSE_AFTER} on all {rt.size} ranks: "
        f"{[round(w[0][2] - w[0][1], 2) for _, w, _ in seen]} s; one checkpoint at step {PAUSE_AFTER})",
        flush=True,
    )


if __name__ == "__main__":
    main()
