"""What a running job is doing now, for the user waiting on it.

A job that makes model requests can take many minutes (a batch's LLM rollouts on the CPU model: half an hour),
so "batches done" alone shows 0% the whole time. A job says what it is doing — "LLM rollout 3 of 8" — through
a ``Progress``, which writes one small JSON file per job under the run's folder; the runner reads those files and
shows them on the terminal, in its log and in the UI's progress artifact. A file, not a queue: the job may run in
this process, in a pool process or on a Ray node, and every one of them sees the corpus.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

MIN_INTERVAL_S = 1.0
"""Writes at most this often per job (a batch samples hundreds of tasks a second)."""


@dataclass(frozen=True)
class Status:
    """One job's latest word: what it does (``what``), how far (``done`` of ``total``), and when it said so."""

    job: str
    what: str
    done: int
    total: int
    at: float

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total else 0.0

    def line(self) -> str:
        return f"{self.job}: {self.what} {self.done} of {self.total}" if self.total else f"{self.job}: {self.what}"


class Progress:
    """Where a job reports itself. With no path (a test, a benchmark) it reports nowhere."""

    def __init__(self, path: str | None, job: str):
        self.path = Path(path) if path else None
        self.job = job
        self._last = 0.0

    def __call__(self, what: str, done: int = 0, total: int = 0) -> None:
        """Say what the job is doing: ``what`` (a phase: "sampling tasks", "LLM rollout"), ``done`` of ``total``."""
        if self.path is None:
            return
        now = time.time()
        if now - self._last < MIN_INTERVAL_S and 0 < done < total:
            return
        self._last = now
        status = {"job": self.job, "what": what, "done": done, "total": total, "at": now}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            # a new file, never one found at that name: a link planted in the corpus is not written through
            tmp.unlink(missing_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(status))
            tmp.replace(self.path)
        except OSError:  # a full disk must not fail the job over a progress line
            tmp.unlink(missing_ok=True)


def read_statuses(folder: Path) -> list[Status]:
    """Every job's latest status under ``folder`` (a file half-replaced or gone is skipped)."""
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if path.is_symlink():  # not a file a job wrote: never followed out of the corpus
            continue
        try:
            out.append(Status(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return out
