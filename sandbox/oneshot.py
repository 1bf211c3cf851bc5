"""One-shot untrusted Python (an LLM-written verifier check): one call in, one JSON value out.

`run_check` never raises for anything the untrusted code does: every outcome is a `SandboxResult` whose
`error` starts with one of `ERROR_KINDS`. On a machine without the boundary the code is not run at all and
the error is `refused: …`, saying what to install.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from sandbox.boundary import (
    ONE_SHOT,
    SETUP_EXIT,
    VIOLATION_EXIT,
    Limits,
    SandboxUnavailable,
    Spec,
    availability,
    sandboxed,
)

ERROR_KINDS = frozenset({"timeout", "cpu_limit", "memory_limit", "forbidden", "exception", "bad_output", "crashed",
                         "refused"})
MAX_VALUE_DEPTH = 64
"""Deepest nesting of a check's returned value the caller accepts (a deeper one is `bad_output`)."""
_SIGSYS = 31


@dataclass(frozen=True)
class SandboxLimits(Limits):
    """Resource limits for one check (`Limits` with the check's output cap)."""

    max_output_bytes: int = 1_000_000


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed check; `error` starts with a kind from `ERROR_KINDS`."""

    ok: bool
    value: Any
    error: str | None
    duration_s: float


def run_check(source: str, payload: dict, *, entrypoint: str = "check",
              limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Runs `entrypoint(payload)` from untrusted `source` behind the sandbox boundary.

    Args:
        source: Python code defining the check function.
        payload: JSON-serialisable input passed to the check (also readable as `payload.json` in its folder).
        entrypoint: Name of the function to call.
        limits: Resource limits for this run.

    Returns:
        The outcome. Nothing the untrusted code does makes this raise; only a non-serialisable `payload`
        (a caller bug) does.
    """
    payload_text = json.dumps(payload, allow_nan=False)
    nonce = secrets.token_hex(16)
    start = time.monotonic()
    spec = Spec(argv=(), mode="check", policy=ONE_SHOT, limits=limits,
                files=(("check.py", source.encode("utf-8", "surrogatepass")),
                       ("payload.json", payload_text.encode()), ("entrypoint", f"{entrypoint}\n{nonce}".encode())))
    try:
        with sandboxed(spec, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
            wall = limits.wall_seconds if limits.wall_seconds is not None else 3600.0
            out, err, problem = _collect(proc, start + wall, limits.max_output_bytes)
    except SandboxUnavailable as exc:
        return SandboxResult(False, None, f"refused: {exc.reason}", 0.0)
    duration = time.monotonic() - start
    return _judge(out, err, problem, proc.returncode, duration, limits, nonce)


def _judge(out: bytes, err: bytes, problem: str | None, rc: int, duration: float, limits: SandboxLimits,
           nonce: str) -> SandboxResult:
    def fail(error: str) -> SandboxResult:
        return SandboxResult(False, None, error, duration)

    if problem == "timeout":
        return fail(f"timeout: wall clock {limits.wall_seconds}s exceeded")
    if problem == "overflow":
        return fail(f"bad_output: output exceeded {limits.max_output_bytes} bytes")
    # bwrap reports a child killed by signal N as 128 + N.
    signum = rc - 128 if rc > 128 else (-rc if rc < 0 else 0)
    if rc == VIOLATION_EXIT:
        marker = b"synthloop-sandbox-violation: "
        said = err.rsplit(marker, 1)[1].split(b"\n", 1)[0] if marker in err else b"unknown"
        return fail(f"forbidden: {said.decode('utf-8', 'replace')}")
    if signum == _SIGSYS:
        return fail("forbidden: a system call the sandbox forbids (seccomp killed the process)")
    if signum == signal.SIGXCPU or (signum == signal.SIGKILL and duration >= limits.cpu_seconds):
        return fail(f"cpu_limit: CPU time limit {limits.cpu_seconds}s exceeded")
    tail = err[-300:].decode("utf-8", "replace").strip()
    if rc == SETUP_EXIT:
        return fail(f"crashed: the sandbox could not be set up: {tail}")
    lines = out.splitlines()
    if rc != 0 or not lines:
        if b"MemoryError" in err or b"Cannot allocate memory" in err:
            return fail(f"memory_limit: {tail}")
        return fail(f"crashed: exit status {rc}: {tail}" if rc else "bad_output: no result line")
    prefix = nonce.encode() + b" "
    if len(lines) != 1 or not lines[0].startswith(prefix):
        return fail(f"bad_output: {len(lines)} lines on the result channel, one genuine one expected "
                    "(the check wrote to it itself)")
    report = _parse(lines[0][len(prefix):])
    if report is None:
        return fail("bad_output: malformed result line")
    if report["ok"] is True:
        return SandboxResult(True, report.get("value"), None, duration)
    error = report.get("error")
    if not isinstance(error, str) or error.split(":", 1)[0] not in ERROR_KINDS - {"refused"}:
        return fail(f"crashed: malformed error report {error!r:.200}")
    return fail(error)


def _collect(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bytes, str | None]:
    """Reads the child's output until it exits, the deadline passes or the output exceeds cap."""
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    out, err = bufs.values()
    with selectors.DefaultSelector() as sel:
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(out), bytes(err), "timeout"
            for key, _ in sel.select(remaining):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                bufs[key.fd] += chunk
                if len(bufs[key.fd]) > cap:
                    return bytes(out), bytes(err), "overflow"
    remaining = deadline - time.monotonic()
    try:
        proc.wait(timeout=max(remaining, 0.001))
    except subprocess.TimeoutExpired:
        return bytes(out), bytes(err), "timeout"
    return bytes(out), bytes(err), None


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_VALUE_DEPTH:
            break
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse(line: bytes) -> dict[str, Any] | None:
    """The runner's report, or None if it is not one (malformed, or nested past what a verdict needs)."""
    try:
        report = json.loads(line, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    if not isinstance(report, dict) or not isinstance(report.get("ok"), bool):
        return None
    if _depth(report.get("value")) > MAX_VALUE_DEPTH:
        return None
    return report


def isolation_report() -> dict[str, Any]:
    """What the boundary is made of on this machine, and whether it can be had."""
    found = availability()
    return {"available": found.ok, "reason": found.reason, "bwrap": found.bwrap,
            "namespaces": ["user", "mount", "pid", "net", "ipc", "uts", "cgroup"] if found.ok else [],
            "seccomp": found.ok, "rlimits": found.ok, "audit_hook": "defence in depth",
            "running_as_root": os.geteuid() == 0}
