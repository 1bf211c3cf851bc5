"""The Prefect server this project talks to, the environment of its processes, and the lifecycle of runs.

Nothing here imports Prefect at module level: Prefect reads its settings (``PREFECT_API_URL``,
``PREFECT_HOME``) when it is first imported, so the server must be found or started, and the environment
set, before that happens. (The run-lifecycle helpers at the end import it inside the functions, which only
ever run inside a flow.)

A local server is shared, never owned by one run: every run using it holds a shared lease (a ``flock`` on a
file in ``PREFECT_HOME``) and the last one to leave stops it, so a run that finishes first cannot stop the
server another run is logging to. The server's pid and port are recorded next to the lease: a recorded
server that is alive but has no user left was orphaned by a killed run, and is stopped and replaced (with a
log line), never silently adopted.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from storage.locks import RunLock, SharedLease, alive


class PrefectUnreachable(RuntimeError):
    """The Prefect API does not answer (at the start of a run, or any more during one); the message names the URL."""


def offline_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for Prefect processes on a machine without internet: no telemetry, no update checks."""
    env = dict(os.environ if env is None else env)
    env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    env.setdefault("DO_NOT_TRACK", "1")
    # The first start of a fresh PREFECT_HOME runs migrations: on 2 busy cores that can outlast the 20 s default.
    env.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    env.setdefault("PREFECT_HOME", str(Path.cwd() / "data" / "prefect"))
    return env


def apply_offline_env() -> None:
    os.environ.update({k: v for k, v in offline_env().items() if k not in os.environ})


def healthy(api_url: str, timeout: float = 2.0) -> bool:
    try:
        return httpx.get(f"{api_url.rstrip('/')}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def start_server(port: int = 4200, *, wait_s: float = 90.0, log_path: Path | None = None,
                 on_started: Callable[[subprocess.Popen], None] | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``prefect server start`` on 127.0.0.1 and wait until its API answers; returns (process, API URL).
    ``on_started`` gets the process as soon as it exists (to record it before the wait: a caller killed while
    waiting must not leave an unrecorded server behind)."""
    api_url = f"http://127.0.0.1:{port}/api"
    env = offline_env()
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    if on_started is not None:
        on_started(proc)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"Prefect server exited with code {proc.returncode}; see {log_path or 'its output'}")
        if healthy(api_url):
            return proc, api_url
        time.sleep(0.5)
    proc.terminate()
    raise TimeoutError(f"Prefect server did not become healthy on {api_url} within {wait_s:.0f}s")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def is_prefect_server(pid: int, port: int) -> bool:
    """Whether ``pid`` is alive and is a ``prefect server start`` on ``port`` (a recorded pid may have been
    reused by an unrelated process since; that one must never be signalled)."""
    if not alive(pid):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc to ask: a live recorded pid is the best evidence there is
    return b"prefect" in b" ".join(argv) and b"server" in argv and str(port).encode() in argv


def _stop(pid: int, wait_s: float = 20.0) -> None:
    """Stop a server started with its own session (its group id is its pid): SIGTERM, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:  # reap it when it is our child; else wait until it is gone
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    return
            except ChildProcessError:
                if not alive(pid):
                    return
            time.sleep(0.1)


class ServerLease:
    """This process's use of the local Prefect server on ``port``: found, started or replaced on ``join``,
    stopped on ``leave`` when no other process uses it.

    Files in ``PREFECT_HOME``: ``synthloop-server-<port>.json`` (pid, port, URL, who started it, when),
    ``.lock`` (held while a process decides to start, join, replace or stop), ``.users`` (the shared lease).
    """

    def __init__(self, port: int, home: Path | None = None):
        self.port = port
        self.home = Path(home or offline_env()["PREFECT_HOME"])
        self.api_url = f"http://127.0.0.1:{port}/api"
        self.record_path = self.home / f"synthloop-server-{port}.json"
        self.decide = RunLock(self.home / f"synthloop-server-{port}.lock", {"purpose": "start/stop decision"})
        self.users = SharedLease(self.home / f"synthloop-server-{port}.users")
        self.log_path = self.home / "server.log"
        self.foreign = False

    def record(self) -> dict[str, Any]:
        try:
            record = json.loads(self.record_path.read_text())
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    def join(self) -> str:
        """Use the server: a live one other runs use, else a fresh one; returns its API URL."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.decide.acquire()
        try:
            record = self.record()
            pid = int(record.get("pid") or 0)
            if record and is_prefect_server(pid, self.port):
                if self.users.others():
                    if not healthy(self.api_url, timeout=10.0):
                        raise PrefectUnreachable(
                            f"the Prefect server at {self.api_url} (pid {pid}), which other runs are using, does "
                            "not answer: wait for them, or stop it and run again")
                    self.users.join()
                    _say(f"Using the Prefect server at {self.api_url} (pid {pid}, started by pid "
                         f"{record.get('started_by')}); the last run using it stops it")
                    return self.api_url
                # alive, and nobody holds the lease: whoever started it was killed before it could stop it
                _say(f"Stopping the Prefect server on port {self.port} (pid {pid}) left behind by pid "
                     f"{record.get('started_by')}, which was killed: starting a fresh one")
                _stop(pid)
                self.record_path.unlink(missing_ok=True)
            elif record:
                _say(f"The Prefect server recorded for port {self.port} (pid {pid}) is gone: starting a fresh one")
                self.record_path.unlink(missing_ok=True)
            if healthy(self.api_url):  # not started by synthloop from this PREFECT_HOME: use it, leave it alone
                self.foreign = True
                _say(f"Using the Prefect server already running at {self.api_url} (not started by synthloop "
                     f"from {self.home}: it is left running)")
                return self.api_url
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.users.join()
            try:
                _, api_url = start_server(self.port, log_path=self.log_path, on_started=self._write_record)
            except (RuntimeError, TimeoutError) as exc:
                self.users.leave()
                pid = int(self.record().get("pid") or 0)
                if pid and alive(pid):
                    _stop(pid)
                self.record_path.unlink(missing_ok=True)
                raise PrefectUnreachable(f"could not start a Prefect server on port {self.port} ({exc}): pass "
                                         "another --port, or set PREFECT_API_URL to a running server") from None
            _say(f"Prefect server started: UI at {api_url.removesuffix('/api')} (log: {self.log_path}); the last "
                 "run using it stops it")
            return api_url
        finally:
            self.decide.release()

    def _write_record(self, proc: subprocess.Popen) -> None:
        tmp = self.record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": proc.pid, "port": self.port, "api_url": self.api_url,
                                   "started_by": os.getpid(), "started_at": time.time()}))
        os.replace(tmp, self.record_path)

    def leave(self) -> None:
        """Stop using the server; stop it if no other process uses it."""
        if self.foreign:
            return
        self.decide.acquire()
        try:
            if not self.users.leave():
                _say(f"Left the Prefect server at {self.api_url} running: another run still uses it")
                return
            pid = int(self.record().get("pid") or 0)
            if pid and is_prefect_server(pid, self.port):
                _stop(pid)
            self.record_path.unlink(missing_ok=True)
        finally:
            self.decide.release()


def _transport_failure(exc: BaseException) -> bool:
    """Whether an exception is (or was caused by) a failed connection, as Prefect's client raises it."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, httpx.TransportError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class ServerWatch(threading.Thread):
    """Ends the process soon after the Prefect API stops accepting connections, with one line naming it.

    Without it, a server that dies mid-run costs minutes of retries and a page of ``httpx.ConnectError``
    (every state update, then every queued event at exit). Only refused connections count: a slow server
    (timeouts on 2 busy cores) is alive and is waited for. On death: the line, SIGINT to the main thread (the
    flow unwinds: the model server and pool workers are stopped, finished batches are on disk), then, after
    ``grace_s``, an immediate exit with status 3 that skips Prefect's futile flushing at exit.
    """

    def __init__(self, api_url: str, *, every_s: float = 2.0, dead_after_s: float = 12.0, grace_s: float = 10.0):
        super().__init__(name="prefect-api-watch", daemon=True)
        self.api_url, self.every_s, self.dead_after_s, self.grace_s = api_url, every_s, dead_after_s, grace_s
        self.stopped = threading.Event()
        self.dead = False

    def message(self) -> str:
        return (f"the Prefect API at {self.api_url} stopped answering during the run; what was finished is kept: "
                "run the same command again once a server is back")

    def run(self) -> None:
        refused_since = None
        while not self.stopped.wait(self.every_s):
            try:
                httpx.get(f"{self.api_url.rstrip('/')}/health", timeout=5.0)
                refused_since = None
                continue
            except httpx.ConnectError:
                refused_since = refused_since or time.monotonic()
            except httpx.HTTPError:  # slow or busy, not gone
                continue
            if time.monotonic() - refused_since >= self.dead_after_s:
                self.dead = True
                # what Prefect would log from here on is its queued events failing, one by one: nothing to act on
                logging.getLogger("prefect").setLevel(logging.CRITICAL + 1)
                _say(f"synthloop: {self.message()}")
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(self.grace_s)
                sys.stderr.flush()
                os._exit(3)

    def stop(self) -> None:
        if not self.dead:
            self.stopped.set()


@contextmanager
def prefect_api(port: int = 4200, *, watch: bool = True) -> Iterator[str]:
    """The API URL of a reachable Prefect server, set as ``PREFECT_API_URL`` for the length of the block.

    ``PREFECT_API_URL``, when set, must answer: it is the user's choice, so a dead one fails at once with its
    URL rather than being replaced by another server. Else the local server on ``port`` is shared through a
    :class:`ServerLease`. A server that stops answering during the block ends it with
    :class:`PrefectUnreachable` naming the URL (and, with ``watch``, ends the process within seconds: see
    :class:`ServerWatch`), instead of minutes of connection errors.
    """
    previous = os.environ.get("PREFECT_API_URL")
    lease = None
    if previous:
        if not healthy(previous, timeout=5.0):
            raise PrefectUnreachable(
                f"the Prefect API at {previous} (PREFECT_API_URL) does not answer: start that server, or unset "
                "PREFECT_API_URL to let synthloop start a local one")
        api_url = previous
    else:
        lease = ServerLease(port)
        api_url = lease.join()
        os.environ["PREFECT_API_URL"] = api_url
    # Prefect's "View at" links come from PREFECT_UI_URL, which a profile may pin to the default port: point
    # them at the server this block uses (a user's own PREFECT_UI_URL wins)
    ui_before = os.environ.get("PREFECT_UI_URL")
    if ui_before is None:
        os.environ["PREFECT_UI_URL"] = api_url.removesuffix("/api")
    watcher = ServerWatch(api_url) if watch else None
    if watcher is not None:
        watcher.start()
    # Prefect's log shipper reports a failed batch on stderr itself, in a line with no newline at its end (so
    # the next line, ours included, is glued to it); the watch is what says the server is gone, and a batch
    # lost while it lives is not worth a line either: the console keeps every log
    raise_before, logging.raiseExceptions = logging.raiseExceptions, False
    try:
        yield api_url
    except BaseException as exc:
        if (watcher is not None and watcher.dead) or (isinstance(exc, Exception) and _transport_failure(exc)
                                                       and not healthy(api_url)):
            gone = PrefectUnreachable(ServerWatch(api_url).message())
            gone.said = watcher is not None and watcher.dead  # the watch has printed it already
            raise gone from None
        raise
    finally:
        if watcher is not None:
            watcher.stop()
        if lease is not None:
            if healthy(api_url):
                _flush_run_logs()
            lease.leave()
            if previous is None:
                os.environ.pop("PREFECT_API_URL", None)
        if ui_before is None:
            os.environ.pop("PREFECT_UI_URL", None)
        logging.raiseExceptions = raise_before


def console_without_tracebacks() -> None:
    """Keep tracebacks of failed runs off the console (the run's logs on the server keep them): the CLI says
    in one line what failed and where, and an error it does not know still ends in Python's own traceback."""
    from prefect.logging.handlers import PrefectConsoleHandler

    def without_traceback(format_record: Callable[[logging.LogRecord], str]) -> Callable[[logging.LogRecord], str]:
        def format(record: logging.LogRecord) -> str:
            # the record goes on to other handlers (the API's): hide its traceback only while formatting here
            kept = record.exc_info, record.exc_text, record.stack_info
            record.exc_info = record.exc_text = record.stack_info = None
            try:
                return format_record(record)
            finally:
                record.exc_info, record.exc_text, record.stack_info = kept

        return format

    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler) and not getattr(handler, "synthloop_quiet", False):
            handler.format = without_traceback(handler.format)
            handler.synthloop_quiet = True


def _flush_run_logs() -> None:
    """Send Prefect's buffered run logs while the server is still up (else they fail at exit, noisily)."""
    if "prefect" not in sys.modules:
        return
    from prefect.logging.handlers import APILogHandler

    for name in ("prefect.flow_runs", "prefect.task_runs"):
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, APILogHandler):
                try:
                    handler.flush()
                except Exception:  # noqa: BLE001 - a server already gone cannot take them; the run's result stands
                    pass


# --- the lifecycle of a run on a corpus ------------------------------------------------------------------------------

def mark_crashed(flow_run_id: str, message: str) -> list[str]:
    """Mark a flow run left ``RUNNING`` (or ``PENDING``) by a killed process as ``Crashed``, with its
    unfinished task runs and sub-flow runs; returns the ids it marked (none when they had already ended)."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterParentFlowRunId,
        FlowRunFilterState,
        FlowRunFilterStateType,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    unfinished = [StateType.RUNNING, StateType.PENDING, StateType.SCHEDULED]
    marked: list[str] = []
    with get_client(sync_client=True) as client:
        todo = [UUID(flow_run_id)]
        while todo:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=todo), state=FlowRunFilterState(type=FlowRunFilterStateType(any_=unfinished))))
            for run in runs:
                client.set_flow_run_state(run.id, Crashed(message=message), force=True)
                marked.append(str(run.id))
                for task_run in client.read_task_runs(
                        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])),
                        task_run_filter=TaskRunFilter(state=TaskRunFilterState(
                            type=TaskRunFilterStateType(any_=unfinished)))):
                    client.set_task_run_state(task_run.id, Crashed(message=message), force=True)
            children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=todo)))
            todo = [c.id for c in children if str(c.id) not in marked]
    return marked


@contextmanager
def claim_run(corpus_root: str | Path, name: str, flow: str) -> Iterator[Any]:
    """Hold the run ``name``'s lock on the corpus for the length of the block (inside a flow run).

    A second process running the same run waits here until the first is done, then finds its batches
    finished and skips them; runs with other names hold other locks and go on at once (their batches are
    other files: see ``hold_run``). A record left in the lock file is a holder that was killed: its flow run,
    still ``RUNNING`` on the server, is marked ``Crashed``.
    """
    from prefect import get_run_logger
    from prefect.runtime import flow_run

    from storage.object_store import run_lock  # a RunLock for a folder; pyarrow and DuckDB load only with a run

    logger = get_run_logger()
    lock = run_lock(corpus_root, name, {"run": name, "flow": flow})

    def waiting(holder: dict[str, Any]) -> None:
        since = time.strftime("%H:%M:%S", time.localtime(holder["since"])) if holder.get("since") else "?"
        logger.warning("run %s is already running on %s in pid %s (since %s, flow run %s): waiting for it to "
                       "finish; its finished batches are then skipped, not redone", name, corpus_root,
                       holder.get("pid", "?"), since, holder.get("flow_run_id", "?"))

    stale = lock.acquire(on_wait=waiting)
    try:
        if stale.get("flow_run_id"):
            try:
                marked = mark_crashed(stale["flow_run_id"], f"pid {stale.get('pid')} was killed while running "
                                                           f"{name}; found when the run resumed")
            except Exception as exc:  # noqa: BLE001 - bookkeeping of a dead run must not stop the live one
                logger.warning("could not mark flow run %s of killed pid %s crashed: %s", stale["flow_run_id"],
                               stale.get("pid"), exc)
            else:
                if marked:
                    logger.warning("flow run(s) %s of pid %s, killed while running %s, marked Crashed",
                                   ", ".join(marked), stale.get("pid"), name)
        lock.update(flow_run_id=str(flow_run.id) if flow_run.id else None)
        yield lock
    finally:
        lock.release()


def hold_run(key: Callable[..., str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a flow's function (under ``@flow``): the run holds its lock on ``corpus_root`` throughout.

    ``key`` gets the flow's arguments by name and returns the run's lock name (its run id, or what
    identifies the run before its inputs are read). Runs of the same config wait for each other; runs of
    different configs run side by side: their shards, markers and manifests are distinct files, temporaries
    are removed only when their writer is dead, and the request cache and catalog are shared safely
    (SQLite locking; the catalog is rebuilt by whoever can open it).
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            with claim_run(bound.arguments["corpus_root"], key(**bound.arguments), fn.__name__):
                return fn(*args, **kwargs)

        # Prefect resolves string annotations in the globals of the function it is given (this module's):
        # hand it the flow's own signature with its annotations already evaluated
        run.__signature__ = inspect.signature(fn, eval_str=True)
        return run

    return decorate
