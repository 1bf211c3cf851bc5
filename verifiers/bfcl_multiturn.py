"""BFCL v4 multi-turn verdicts from BFCL's own ``multi_turn_checker``, run behind the sandbox boundary.

BFCL's checker executes call strings with ``eval`` and caches class instances in its module globals, so it never
runs in this process: :func:`check_multi_turn` starts one sandboxed worker (``verifiers/bfcl_multiturn_worker.py``,
a plain Python program) that sees the standard library and the unpacked bfcl-eval folder
(:func:`storage.external.bfcl_eval_root`) read-only, and asks it for one verdict per entry. Between entries the
worker drops every module it imported (bfcl_eval, mpmath), so each entry starts from fresh module state.

What is passed to the checker is what BFCL's eval runner passes: the model's calls per turn per step, unchanged,
with steps that hold no call left out, and a run with the wrong number of turns failed as ``force_terminated``.
One guard is added in front: a call string must be a call of a plain name with literal arguments
(``cd(folder='document')``, what a model's JSON arguments decode to); anything else (nested calls, names,
attribute access, arithmetic) is refused here (``synthloop:refused_call``) and never reaches ``eval``, so the
code under check cannot reach the worker's own state. BFCL's ground truth holds only such calls (4,625 of 4,625).

Everything the worker answers is parsed as untrusted: one line, capped, prefixed with a per-worker nonce, of the
expected shape; a worker that times out, dies or answers otherwise fails that entry
(``synthloop:checker_timeout`` / ``synthloop:checker_failed``) and a fresh worker takes the next.

Example:
    >>> entries = bfcl_multi_turn("multi_turn_base")[:3]
    >>> check_multi_turn([(e, gold_calls(e)) for e in entries])   # three BFCLVerdict(valid=True, ...)
"""

from __future__ import annotations

import ast
import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.boundary import INPUT, ONE_SHOT, Limits, SandboxUnavailable, Spec, availability
from sandbox.lineworker import AnswerTooLarge, LineWorker
from storage.external import bfcl_eval_root

_WORKER = Path(__file__).with_name("bfcl_multiturn_worker.py")
REFUSED = "synthloop:refused_call"
TIMEOUT = "synthloop:checker_timeout"
FAILED = "synthloop:checker_failed"


@dataclass(frozen=True)
class BFCLVerdict:
    """BFCL's verdict on one entry: ``valid``, and if not, its ``error_type`` (``multi_turn:...`` from BFCL, or
    ``synthloop:...`` when the check could not run) and ``message``."""

    id: str
    valid: bool
    error_type: str | None = None
    message: str = ""


@dataclass(frozen=True)
class CheckerLimits:
    """Limits of the checker's worker.

    Attributes:
        entry_timeout_s: Wall-clock seconds one entry's check may take (long-context entries load big states).
        start_timeout_s: Extra seconds for the first entry of a worker (start-up and imports).
        cpu_seconds: CPU time of one worker over its life (RLIMIT_CPU): a backstop.
        memory_mb: Address space of the worker.
        max_answer_bytes: Largest answer line accepted.
        max_call_chars: Longest call string accepted (a longer one is refused, not run).
    """

    entry_timeout_s: float = 60.0
    start_timeout_s: float = 30.0
    cpu_seconds: int = 3600
    memory_mb: int = 1024
    max_answer_bytes: int = 64 << 10
    max_call_chars: int = 20_000


def gold_calls(entry: dict[str, Any]) -> list[list[list[str]]]:
    """The entry's ground truth as a model result: per turn one step holding the turn's calls (none if empty)."""
    return [[list(turn)] if turn else [] for turn in entry["ground_truth"]]


def drop_last_calls(entry: dict[str, Any]) -> list[list[list[str]]]:
    """The ground truth with the last call of every turn dropped (a negative control that must fail)."""
    return [[list(turn[:-1])] if turn[:-1] else [] for turn in entry["ground_truth"]]


def call_problem(call: Any, max_chars: int = CheckerLimits.max_call_chars) -> str | None:
    """Why a call string may not be passed to BFCL's ``eval``, or None: it must read ``name(arg=literal, ...)``."""
    if not isinstance(call, str):
        return f"a call must be a string, not {type(call).__name__}"
    if len(call) > max_chars:
        return f"a call of {len(call):,} characters is over the cap of {max_chars:,}"
    try:
        node = ast.parse(call.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return f"not a Python call: {call[:120]!r}"
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return f"not a call of a plain function name: {call[:120]!r}"
    for arg in (*node.args, *node.keywords):
        value = arg.value if isinstance(arg, ast.keyword) else arg
        if isinstance(arg, ast.Starred) or (isinstance(arg, ast.keyword) and arg.arg is None):
            return f"unpacked arguments are not literals: {call[:120]!r}"
        try:
            ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return f"an argument is not a literal value: {call[:120]!r}"
    return None


def _shape_problem(calls: Any, max_chars: int) -> str | None:
    if not isinstance(calls, list):
        return "the model result must be a list of turns"
    for t, turn in enumerate(calls):
        if not isinstance(turn, list):
            return f"turn {t}: must be a list of steps"
        for s, step in enumerate(turn):
            if not isinstance(step, list):
                return f"turn {t} step {s}: must be a list of call strings"
            for c, call in enumerate(step):
                problem = call_problem(call, max_chars)
                if problem:
                    return f"turn {t} step {s} call {c}: {problem}"
    return None


class WorkerFailed(Exception):
    """The worker timed out, died, or answered out of shape; ``kind`` is TIMEOUT or FAILED. It is gone."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class _Session:
    """One worker at a time; a worker that fails an exchange is killed and the next exchange starts another."""

    def __init__(self, root: Path, limits: CheckerLimits):
        self.root, self.limits = root, limits
        self.worker: LineWorker | None = None
        self.nonce = ""
        self.fresh = True

    def _start(self) -> None:
        found = availability()
        if not found.ok:
            raise SandboxUnavailable(f"BFCL's multi-turn code runs only behind the sandbox: {found.reason}")
        self.nonce = secrets.token_hex(16)
        config = {"root": str(self.root), "nonce": self.nonce}
        kernel = Limits(cpu_seconds=self.limits.cpu_seconds, wall_seconds=None, memory_mb=self.limits.memory_mb,
                        disk_mb=64, file_bytes=1 << 20, open_files=64)
        spec = Spec(argv=(f"{INPUT}/worker.py", f"{INPUT}/config.json"), mode="python", policy=ONE_SHOT,
                    limits=kernel, read_only=(str(self.root),),
                    files=(("worker.py", _WORKER.read_bytes()), ("config.json", json.dumps(config).encode())))
        self.worker = LineWorker(spec)
        self.fresh = True

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    def ask(self, message: dict[str, Any], cap: int) -> dict[str, Any]:
        """The worker's answer to one request, parsed (a JSON object after the nonce).

        Raises:
            WorkerFailed: no such answer came; the worker is killed.
        """
        if self.worker is None:
            self._start()
        timeout = self.limits.entry_timeout_s + (self.limits.start_timeout_s if self.fresh else 0.0)
        self.fresh = False
        worker = self.worker
        try:
            worker.send(json.dumps(message, separators=(",", ":")).encode() + b"\n")
            answer = worker.receive(time.monotonic() + timeout, cap)
        except TimeoutError:
            self.close()
            raise WorkerFailed(TIMEOUT, f"BFCL's code took over {timeout:g} s (worker killed)") from None
        except AnswerTooLarge as exc:
            self.close()
            raise WorkerFailed(FAILED, f"the worker's answer passed {exc.received:,} bytes, over the cap of "
                                       f"{cap:,}") from None
        except (BrokenPipeError, ConnectionResetError, ValueError):
            answer = None
        if answer is None:
            reason, tail = worker.exit_reason(), worker.stderr_tail(300)
            self.close()
            raise WorkerFailed(FAILED, f"the worker died ({reason})" + (f"; its last output: {tail}" if tail else ""))
        prefix = self.nonce.encode() + b" "
        reply = None
        if answer.startswith(prefix):
            try:
                reply = json.loads(bytes(answer[len(prefix):]))
            except (ValueError, RecursionError):
                reply = None
        if not isinstance(reply, dict):
            self.close()
            raise WorkerFailed(FAILED, f"malformed answer from the worker: {bytes(answer[:200])!r}")
        return reply

    def check(self, entry: dict[str, Any], calls: list, category: str) -> BFCLVerdict:
        entry_id = str(entry.get("id"))
        try:
            reply = self.ask({"op": "check", "entry": entry, "calls": calls, "category": category},
                             self.limits.max_answer_bytes)
        except WorkerFailed as exc:
            return BFCLVerdict(entry_id, False, exc.kind, str(exc))
        verdict = _read_verdict(reply, entry_id)
        if verdict is None:
            self.close()
            return BFCLVerdict(entry_id, False, FAILED, f"malformed answer from the checker: {str(reply)[:200]}")
        return verdict


def _read_verdict(reply: dict[str, Any], entry_id: str) -> BFCLVerdict | None:
    if not isinstance(reply.get("valid"), bool):
        return None
    error_type, message = reply.get("error_type"), reply.get("message", "")
    if not (error_type is None or isinstance(error_type, str)) or not isinstance(message, str):
        return None
    if reply["valid"] != (error_type is None):
        return None
    return BFCLVerdict(entry_id, reply["valid"], error_type and error_type[:200], message[:2000])


def check_multi_turn(items: Sequence[tuple[dict[str, Any], list[list[list[str]]]]], *, root: Path | None = None,
                     limits: CheckerLimits = CheckerLimits()) -> list[BFCLVerdict]:
    """BFCL's verdict on each ``(entry, calls)`` pair, in order.

    Args:
        items: An entry as :func:`storage.external.bfcl_multi_turn` gives it (with ``ground_truth``), and the
            model's calls for it: per turn, per step, BFCL call strings (``"cd(folder='document')"``).
        root: The unpacked bfcl-eval folder; :func:`storage.external.bfcl_eval_root` (fetched on first use) if None.
        limits: The worker's limits.

    Returns:
        One :class:`BFCLVerdict` per item. A call that is not ``name(literal, ...)`` fails its entry as
        ``synthloop:refused_call`` without running; nothing a worker does makes this raise.

    Raises:
        SandboxUnavailable: this machine cannot build the sandbox (the checker never runs in this process).
        storage.external.BFCLDataError: the pinned bfcl-eval could not be fetched.
    """
    found = availability()
    if not found.ok:
        raise SandboxUnavailable(f"BFCL's multi-turn checker runs only behind the sandbox: {found.reason}")
    root = Path(root) if root is not None else bfcl_eval_root()
    checker = _Session(root, limits)
    verdicts = []
    try:
        for entry, calls in items:
            entry_id = str(entry.get("id"))
            problem = _shape_problem(calls, limits.max_call_chars)
            if problem:
                verdicts.append(BFCLVerdict(entry_id, False, REFUSED, problem))
                continue
            category = entry_id.rsplit("_", 1)[0]
            verdicts.append(checker.check(entry, calls, category))
    finally:
        checker.close()
    return verdicts


class BFCLExecutor:
    """BFCL's classes for one entry at a time, in the sandbox, as BFCL's inference harness drives them.

    :meth:`start` loads an entry's initial state (fresh module state, as for a check); :meth:`execute` runs one
    step's calls through BFCL's ``execute_multi_turn_func_call`` and returns what it returns, one string per call
    (a result, or BFCL's ``Error during execution: ...``). A call that is not ``name(literal, ...)`` or names a
    builtin is not run: its result is ``Error during execution: refused: ...`` and the others of its step do not
    run either. Use as a context manager (the worker is killed on exit).

    Raises:
        SandboxUnavailable: from the first use, where the sandbox cannot be built.
        WorkerFailed: the worker timed out, died or answered out of shape (the entry cannot go on; the next
            :meth:`start` gets a fresh worker).
    """

    def __init__(self, root: Path | None = None, limits: CheckerLimits = CheckerLimits(),
                 max_result_bytes: int = 8 << 20):
        self.session = _Session(Path(root) if root is not None else bfcl_eval_root(), limits)
        self.max_result_bytes = max_result_bytes
        self.entry_id: str | None = None

    def __enter__(self) -> BFCLExecutor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.session.close()

    def start(self, entry: dict[str, Any]) -> None:
        self.entry_id = None
        self._results(self.session.ask({"op": "start", "entry": entry}, self.max_result_bytes), 0)
        self.entry_id = str(entry.get("id"))

    def execute(self, calls: Sequence[str]) -> list[str]:
        if self.entry_id is None:
            raise RuntimeError("BFCLExecutor.execute before start (or after a failed start)")
        for call in calls:
            problem = call_problem(call, self.session.limits.max_call_chars)
            if problem:
                return [f"Error during execution: refused: {problem}"] * len(calls)
        reply = self.session.ask({"op": "execute", "calls": list(calls)}, self.max_result_bytes)
        if "error" in reply and isinstance(reply["error"], str):
            return [f"Error during execution: refused: {reply['error'][:500]}"] * len(calls)
        return self._results(reply, len(calls))

    def _results(self, reply: dict[str, Any], n: int) -> list[str]:
        results = reply.get("results")
        if "error" in reply:
            self.close()
            raise WorkerFailed(FAILED, f"BFCL could not load entry: {str(reply['error'])[:500]}")
        if not isinstance(results, list) or len(results) != n or not all(isinstance(r, str) for r in results):
            self.close()
            raise WorkerFailed(FAILED, f"malformed answer from the worker: {str(reply)[:200]}")
        return results
