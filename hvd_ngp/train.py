"""Entry point: ``python -m hvd_ngp.train`` (size 1) or under ``horovodrun``/``mpirun`` (N ranks).

parse (``config.parse_settings``) -> build (``training.trainer.Trainer.build``, collective) -> loop
(``training.trainer.run``). The loop, every rank, every step: occupancy update (every
``update_interval`` steps, collective) -> sample this rank's rays -> march + render -> loss ->
backward -> the gradient allreduce (Horovod's, started in backward; one flat buffer in the graphed step)
-> optimizer step. Metrics are reduced once per log
interval; rank 0 prints and writes files.
"""

from __future__ import annotations

from typing import NoReturn

import torch

from .cluster import dist, preempt
from .config import BASE_CONFIG, CPU_CONFIG, parse_settings
from .errors import ConfigError, run_cli
from .state.failures import report
from .training.trainer import run


def main(argv: list[str] | None = None) -> int:
    try:
        settings = parse_settings(argv, default_config=BASE_CONFIG if torch.cuda.is_available() else CPU_CONFIG)
    except ConfigError as exc:
        report_on_every_rank(exc, "reading the configuration")
    view = settings.viewer
    attach = None
    if view.viewer:  # rank 0 alone imports the viewer (viser), inside run

        def attach(tr):
            from .viewer.live import LiveViewer

            return LiveViewer(tr, view.viewer_host, view.viewer, view.viewer_budget_ms / 1000, view.viewer_share)

    result = run(settings, attach=attach)
    return preempt.stop_exit_status() if result.stopped else 0


def report_on_every_rank(exc: ConfigError, what: str) -> NoReturn:
    """Re-raise ``exc`` (an error before the communicator exists) so that every rank reports it.

    Under a launcher the first rank to exit makes the launcher kill the others, possibly before
    they printed their message; agreeing first makes every rank print it, and a rank whose own
    configuration was fine (another environment) stops too instead of waiting for the others.
    """

    def fail() -> None:
        raise exc

    if dist.launched() and not dist.elastic():
        dist.init("cpu")
        dist.agree(fail, what)
    raise exc


def cli(argv: list[str] | None = None) -> None:
    """Console-script wrapper: any failure becomes one clear message naming the rank, and a fast non-zero exit.

    User errors exit 2; unexpected exceptions 1 (see ``state.failures.report``).
    """
    run_cli(main, argv, report=report)


if __name__ == "__main__":
    cli()
