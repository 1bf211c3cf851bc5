"""A long-lived sandboxed process spoken to in JSON lines: the pattern `envs.plugin` runs plugins with.

The caller writes one request line to the worker's stdin and reads one answer line from its stdout, never more
than a cap and never past a deadline; the worker's stderr is drained in the background (its last lines kept for
error messages), so a chatty worker never blocks. What comes back is untrusted bytes: the caller parses it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time

from sandbox.boundary import Spec, sandboxed

# bubblewrap's --die-with-parent is PR_SET_PDEATHSIG, which fires when the *thread* that started it ends: a worker
# started from a short-lived thread would die with it. Every worker is started from this one long-lived thread.
_STARTER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="synthloop-lineworker-start")


class AnswerTooLarge(Exception):
    """The answer line passed the cap; ``received`` bytes of it had been read when reading stopped."""

    def __init__(self, received: int):
        super().__init__(received)
        self.received = received


def exit_reason(rc: int | None) -> str:
    """A sandboxed process's exit status in words (bwrap reports a child killed by signal N as 128 + N)."""
    if rc is None:
        return "did not exit"
    signum = rc - 128 if rc > 128 else (-rc if rc < 0 else 0)
    if signum:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(signum).name}"
        return f"killed by signal {signum}"
    return f"exit status {rc}"


class LineWorker:
    """One sandboxed process and its pipes; requests are serialised by the caller. :meth:`close` kills it."""

    def __init__(self, spec: Spec):
        self._stack = contextlib.ExitStack()
        box = sandboxed(spec, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        self.proc = _STARTER.submit(self._stack.enter_context, box).result()
        self._buffer = bytearray()
        self._stderr: collections.deque[bytes] = collections.deque(maxlen=64)
        self._drain = threading.Thread(target=self._read_stderr, name="synthloop-lineworker-stderr", daemon=True)
        self._drain.start()

    def _read_stderr(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := os.read(self.proc.stderr.fileno(), 4096):
                self._stderr.append(chunk)

    def stderr_tail(self, limit: int = 600) -> str:
        return b"".join(self._stderr)[-limit:].decode("utf-8", "replace").strip()

    def send(self, line: bytes) -> None:
        self.proc.stdin.write(line)

    def receive(self, deadline: float, cap: int) -> bytearray | None:
        """The next answer line (without its newline); None at end of output.

        Raises:
            TimeoutError: past the deadline.
            AnswerTooLarge: more than ``cap`` bytes came without a line ending; no more than ``cap`` plus one read
                are ever held, however much the worker writes.
        """
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            end = self._buffer.find(b"\n")
            while end < 0:
                if len(self._buffer) > cap:
                    raise AnswerTooLarge(len(self._buffer))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                if not sel.select(remaining):
                    continue
                chunk = os.read(fd, min(1 << 20, cap + 1 - len(self._buffer)))
                if not chunk:
                    return None
                found = chunk.find(b"\n")
                if found >= 0:
                    end = len(self._buffer) + found
                self._buffer += chunk
        if end > cap:
            raise AnswerTooLarge(end)
        line = self._buffer[:end]
        del self._buffer[: end + 1]
        return line

    def exit_reason(self) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)
        return exit_reason(self.proc.poll())

    def close(self) -> None:
        self._stack.close()  # kills the sandbox's process group and reaps it
        self._drain.join(timeout=2)
