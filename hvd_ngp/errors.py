"""Errors the user can act on. The entry points turn these into one line and a non-zero exit (``run_cli``)."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path
from typing import Callable, NoReturn

from .launcher_env import launcher_rank_label


class HvdNgpError(Exception):
    """Base class: a problem with the user's input or environment, not a bug in hvd_ngp."""


class ConfigError(HvdNgpError):
    """Invalid command line, config file or network config."""


class SceneError(HvdNgpError):
    """A scene (transforms file, images, poses) cannot be used. The message names the file."""


class SnapshotError(HvdNgpError):
    """A snapshot or checkpoint cannot be read or written."""


class CameraPathError(HvdNgpError):
    """A camera-path file (nerfstudio camera_path.json, instant-ngp base_cam.json, transforms.json) cannot be used."""


class BackendError(HvdNgpError):
    """A requested compute backend (GPU kernels, tinycudann, Horovod) is not available."""


class OutputError(HvdNgpError):
    """An output file (metrics, renders) cannot be written. The message names the file and the cause."""


#: a hint after the system's words for causes whose remedy is not obvious
_HINTS = {
    errno.ENOENT: " (deleted or moved?)",
    errno.EIO: " (a failing disk or network filesystem)",
    errno.EDQUOT: " (your quota on that filesystem)",
}


def os_cause(exc: OSError) -> str:
    """``OSError`` -> its true cause in the system's words ("Permission denied", "No space left on device",
    "File name too long", "No such file or directory (deleted or moved?)"), never a guess."""
    words = exc.strerror or (os.strerror(exc.errno) if exc.errno else str(exc))
    return words + (_HINTS.get(exc.errno, "") if exc.errno is not None else "")


def read_json_object(path: Path, error: type[HvdNgpError], what: str) -> dict:
    """The JSON object in ``path``; a missing, unreadable or malformed file, or one that holds no JSON
    object, raises ``error`` with one line naming the file, ``what`` it should be, and the problem."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise error(f"{path}: {what} not found") from None
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {os_cause(exc)}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: cannot read {what}: not a UTF-8 text file (byte {exc.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: {what} must hold a JSON object, found {type(data).__name__}")
    return data


def run_cli(
    main: Callable[[list[str] | None], object],
    argv: list[str] | None = None,
    prog: str = "hvd_ngp",
    report: Callable[[BaseException], int] | None = None,
) -> NoReturn:
    """Console-script wrapper: user errors become one line on stderr (with the rank under a launcher) and exit 2.

    ``main`` returns the exit status; any other result (a tool's result dict, None) means success.
    ``report``: handles every exception instead (prints, returns the exit status; see ``failures.report``).
    """
    try:
        result = main(argv)
        code = result if isinstance(result, int) else 0
    except SystemExit:
        raise
    except BaseException as exc:
        if report is not None:
            code = report(exc)
        elif isinstance(exc, HvdNgpError):
            print(f"{launcher_rank_label()}{prog}: error: {exc}", file=sys.stderr, flush=True)
            code = 2
        else:
            raise
    sys.stdout.flush()
    # Horovod's shutdown waits for its background thread; after an error that can block: leave fast.
    if code:
        os._exit(code)
    sys.exit(0)
