"""The output folder of a run: held by one run at a time, and every file name checked before training.

``OutputLock`` is an ``fcntl.flock`` on ``<out_dir>/.hvd_ngp.lock``, which holds the owner's host, pid
and start time. A second run on the same folder refuses with that information instead of
overwriting the first run's checkpoints and interleaving its metrics. The kernel drops the lock when
its process dies (a crash, ``kill -9``, a node reboot on a shared filesystem whose server notices), so a
lock file that still holds an owner but is not locked was left by a run that crashed: it is taken
over, and the log says whose it was. A run that ends cleanly removes the file.

``check_output_files`` creates and removes each file a run will write (or checks that an existing one
is writable), so a name too long, a folder without permission or a read-only filesystem is reported
before training instead of after hours of it.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
import sys
from pathlib import Path

from ..errors import ConfigError, os_cause

LOCK_NAME = ".hvd_ngp.lock"


def describe_owner(info: dict) -> str:
    return f"host {info.get('host', '?')}, pid {info.get('pid', '?')}, started {info.get('started', '?')}" + (
        f", command {info['command']}" if info.get("command") else ""
    )


class OutputLock:
    """The lock of one output folder, held (rank 0) from start-up to the end of the run."""

    def __init__(self, path: Path, handle, took_over: dict | None) -> None:
        self.path, self._handle = path, handle
        self.took_over = took_over  # the owner recorded by a crashed run whose lock was taken over, or None

    @staticmethod
    def acquire(folder: Path) -> "OutputLock":
        """Lock ``folder`` (which exists) for this process; ``ConfigError`` naming the owner when another run
        holds it."""
        path = folder / LOCK_NAME
        try:
            handle = open(path, "a+b")  # never truncates: a refused run must not erase the owner's record
        except OSError as exc:
            raise ConfigError(f"{path}: cannot create the output folder's lock file: {os_cause(exc)}") from None
        handle.seek(0)
        recorded = _parse(handle.read())
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.close()
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(f"{path}: cannot lock the output folder: {os_cause(exc)}") from None
            raise ConfigError(
                f"{folder}: this output folder is in use by another run ({describe_owner(recorded)}); "
                f"wait for it to end, stop it, or give another --out_dir (lock file {path})"
            ) from None
        handle.seek(0)
        recorded = _parse(handle.read())  # read again under the lock: the previous owner may have just ended
        me = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "command": " ".join(sys.argv)[:300],
        }
        handle.truncate(0)
        handle.write(json.dumps(me).encode())
        handle.flush()
        return OutputLock(path, handle, recorded or None)

    def release(self) -> None:
        """Remove the lock file and unlock (a clean end); idempotent."""
        if self._handle is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass
        self._handle.close()
        self._handle = None


def _parse(data: bytes) -> dict:
    try:
        info = json.loads(data.decode() or "{}")
    except (ValueError, UnicodeDecodeError):
        return {"host": "?", "pid": "?", "started": "?", "note": "unreadable lock record"} if data else {}
    return info if isinstance(info, dict) else {}


def check_output_files(files: list[tuple[str, Path]]) -> None:
    """Prove each ``(what, path)`` can be written now: an existing file must be writable; a new name is
    created and removed again (its folder must exist). ``ConfigError`` names the file and the cause."""
    for what, path in files:
        try:
            if path.exists():
                if path.is_dir():
                    raise OSError(errno.EISDIR, os.strerror(errno.EISDIR))
                if not os.access(path, os.W_OK):
                    raise OSError(errno.EACCES, os.strerror(errno.EACCES))
                continue
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.close(fd)
            path.unlink()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot write the {what}: {os_cause(exc)}") from None
