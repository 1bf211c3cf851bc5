"""File locks that let several processes share a corpus, and a Prefect server, without redoing or breaking
each other's work.

``fcntl.flock`` is the mechanism: the kernel drops a lock when its holder dies, SIGKILL included, so a lock
is never left behind by a killed run. The holder writes a record into the lock file (pid, what it runs, since
when) and clears it on release: another process reads it to say whom it waits for, and a record found by the
next holder is the trace of a holder that died holding the lock (its Prefect flow run is then still
``RUNNING`` and must be marked crashed).

Locks are per process and re-entrant within it: a flow that runs a sub-flow on the same corpus (the loop)
holds one lock per run, and taking a lock this process already holds counts instead of deadlocking.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_HELD: dict[str, tuple[int, int]] = {}  # lock path -> (pid that took it, depth)
_GUARD = threading.Lock()


def lock_path(root: str | Path, name: str) -> Path:
    """Where the lock called ``name`` of the corpus at ``root`` lives."""
    return Path(root).resolve() / "_locks" / f"{name}.lock"


def _open(path: Path) -> int:
    # the holder truncates and writes its record into the file: through a link planted in a corpus from
    # elsewhere (``_locks/<run>.lock -> ~/.bashrc``) that would overwrite the link's target
    if path.parent.is_symlink():
        raise OSError(errno.ELOOP, f"the lock folder is a symbolic link (to {os.readlink(path.parent)}), which the "
                                   f"corpus does not follow: replace it by a folder", str(path.parent))
    if path.is_symlink():
        logging.getLogger("synthloop.corpus").warning(
            "corpus damage: %s is a symbolic link (to %s), not a lock this corpus made; removed the link", path,
            os.readlink(path))
        path.unlink()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:  # a read-only or foreign corpus: say which file could not be made
        raise OSError(exc.errno, f"cannot create the lock file ({exc.strerror})", str(path)) from None


def read_record(fd_or_path: int | Path) -> dict[str, Any]:
    """The holder's record in a lock file ({} when none, or while it is being written)."""
    try:
        if isinstance(fd_or_path, int):
            text = os.pread(fd_or_path, 1 << 16, 0).decode("utf-8", "replace")
        else:
            text = Path(fd_or_path).read_text(encoding="utf-8", errors="replace")
        record = json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _write_record(fd: int, record: dict[str, Any]) -> None:
    data = json.dumps(record, sort_keys=True, default=str).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def alive(pid: int) -> bool:
    """Whether a process with this id exists (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class RunLock:
    """An exclusive lock on one run of a corpus, held for the whole run.

    Args:
        path: The lock file (see :func:`lock_path`).
        record: What the holder says about itself (run id, flow, ...); pid, host and start time are added.
    """

    def __init__(self, path: str | Path, record: dict[str, Any] | None = None):
        self.path = Path(path)
        self.record = {**(record or {}), "pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        self.fd: int | None = None
        self.reentered = False

    def acquire(self, *, timeout: float | None = None, poll_s: float = 0.2,
                on_wait: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Take the lock, waiting while another process holds it (``on_wait`` is told once, with the holder's
        record). Returns the record a previous holder left when it died holding the lock ({} if none).

        Raises:
            TimeoutError: ``timeout`` seconds passed and the holder still holds it.
        """
        key = str(self.path.resolve())
        with _GUARD:
            pid, depth = _HELD.get(key, (0, 0))
            if pid == os.getpid() and depth:
                _HELD[key] = (pid, depth + 1)
                self.reentered = True
                return {}
        fd = _open(self.path)
        deadline = None if timeout is None else time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
            if not told and on_wait is not None:
                on_wait(read_record(fd))
                told = True
            if deadline is not None and time.monotonic() > deadline:
                holder = read_record(fd)
                os.close(fd)
                raise TimeoutError(f"{self.path} is still held by pid {holder.get('pid', '?')} after {timeout:.0f}s")
            time.sleep(poll_s)
        stale = read_record(fd)
        _write_record(fd, self.record)
        self.fd = fd
        with _GUARD:
            _HELD[key] = (os.getpid(), 1)
        return stale

    def update(self, **fields: Any) -> None:
        """Add to the holder's record (e.g. the Prefect flow run id, known once the run has started)."""
        self.record.update(fields)
        if self.fd is not None:
            _write_record(self.fd, self.record)

    def release(self) -> None:
        key = str(self.path.resolve())
        with _GUARD:
            pid, depth = _HELD.get(key, (0, 0))
            if self.reentered:
                _HELD[key] = (pid, depth - 1)
                self.reentered = False
                return
            _HELD.pop(key, None)
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)  # a clean exit leaves no record: a record found later means a crash
        except OSError:
            pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class SharedLease:
    """A lease on something several processes use at once (a Prefect server): every user holds a shared lock
    on the same file, and the one that finds no other holder when it leaves is the last user.

    The kernel drops the shared lock of a user that is killed, so a killed user never keeps the thing alive
    and never counts as a user afterwards.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.fd: int | None = None

    def others(self) -> bool:
        """Whether some process holds the lease now; asked by a process that is not (yet) a user, under the
        caller's own lock that serialises joining and leaving."""
        fd = _open(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return True
            raise
        finally:
            os.close(fd)  # closing drops the probe's lock
        return False

    def join(self) -> None:
        """Become a user (blocks only while another process is deciding whether it is the last)."""
        if self.fd is None:
            self.fd = _open(self.path)
            fcntl.flock(self.fd, fcntl.LOCK_SH)

    def leave(self) -> bool:
        """Stop being a user; True when no other user is left (the caller then stops what it shared)."""
        if self.fd is None:
            return False
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            last = False
        else:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            last = True
        os.close(self.fd)
        self.fd = None
        return last
