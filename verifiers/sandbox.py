"""Run untrusted verifier checks in an isolated, resource-limited subprocess.

Per-task checks are Python written by an LLM, so they are treated as hostile and
never run in the calling process. Each call gets a fresh interpreter in its own
session and temporary folder, guarded by independent layers (rlimits, network
namespace, privilege drop, audit hook, process-group kill); a layer the machine
cannot provide is skipped without the others failing open. ``isolation_report``
says which layers are active.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

ERROR_KINDS = frozenset(
    {"timeout", "cpu_limit", "memory_limit", "forbidden", "exception", "bad_output", "crashed"}
)
_NOBODY = 65534


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed check."""

    cpu_seconds: int = 2
    wall_seconds: float = 5.0
    memory_mb: int = 256
    max_output_bytes: int = 1_000_000


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed check; ``error`` starts with a kind from ``ERROR_KINDS``."""

    ok: bool
    value: Any
    error: str | None
    duration_s: float


# Bootstrap executed by the child (`python -I -S -c _RUNNER root entrypoint nonce cpu mem fsize`).
# Limits are applied here rather than in preexec_fn, which is unsafe when the parent has threads.
_RUNNER = r'''
import builtins, sys, os, json, math, re, collections, itertools, functools, statistics, datetime
import decimal, fractions, string, operator, heapq, bisect, copy, unicodedata, _strptime

class Forbidden(BaseException):
    """Not an Exception, so `except Exception` in the check cannot swallow it."""

def make_hook(root, violations, str_=str, bytes_=bytes, int_=int, type_=type, exc_=Forbidden):
    # Only closure constants and str methods below: the check can monkeypatch modules and
    # builtins, but not these. Audit hooks are not a boundary on their own (frame tricks
    # can reach the closure), which is why the OS layers exist as well.
    base = [p for p in root.split("/") if p]
    n = len(base)
    spawn = ("os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system",
             "subprocess.")
    blocked = ("os.", "socket.", "ctypes.", "resource.", "shutil.", "signal.", "fcntl.", "mmap.",
               "gc.", "_thread.", "sys.settrace", "sys.setprofile", "sys._current_frames",
               "sys._getframe", "sys.addaudithook")
    writes = [0]  # RLIMIT_FSIZE bounds one file; this bounds how many, so the folder cannot fill a disk

    def hook(event, args):
        if event == "open":
            path = args[0]
            if type_(path) is int_:  # an already-open descriptor grants no new access
                return
            mode, flags = args[1], args[2]
            if (type_(mode) is str_ and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)) or (
                    type_(flags) is int_ and flags & 3):
                writes[0] += 1
                if writes[0] > 16:
                    msg = "more than 16 files opened for writing"
                    violations.append(msg)
                    raise exc_(msg)
            if type_(path) is bytes_:
                path = path.decode("utf-8", "surrogateescape")
            if type_(path) is str_:
                parts = []
                for part in (path if path[:1] == "/" else root + "/" + path).split("/"):
                    if part == "..":
                        del parts[-1:]
                    elif part and part != ".":
                        parts.append(part)
                if parts[:n] == base:
                    return
            msg = f"open({path!r})"
        elif event == "import":  # everything a check may use is pre-imported
            msg = f"import {args[0]}"
        elif event.startswith(spawn):
            msg = "process creation"
        elif event.startswith("socket."):
            msg = "socket"
        elif event.startswith(blocked):
            msg = event
        else:
            return
        violations.append(msg)
        raise exc_(msg)
    return hook

def describe(exc):
    try:
        text = str(exc)
    except BaseException:
        text = "<unprintable>"
    return f"{type(exc).__name__}: {text}"[:500]

def main():
    import ctypes, resource
    root, entry, nonce, cpu, mem, fsize = sys.argv[1:]
    sys.argv[:] = sys.orig_argv[:] = [""]  # the nonce authenticates our result line; hide it
    write, dumps = os.write, json.dumps
    with open("payload.json", encoding="utf-8") as f:
        payload = json.load(f)
    with open("check.py", encoding="utf-8") as f:
        source = f.read()
    layers = {"netns": None, "uid_drop": False, "no_new_privs": False, "rlimits": False}
    libc = ctypes.CDLL(None, use_errno=True)
    # An empty network namespace has no interfaces, so even a hook bypass cannot connect.
    # Non-root callers may still get one inside an unprivileged user namespace.
    for flags, name in ((0x40000000, "netns"), (0x50000000, "userns+netns")):
        if libc.unshare(flags) == 0:
            layers["netns"] = name
            break
    if os.geteuid() == 0:
        try:  # root ignores RLIMIT_NPROC and file permissions; nobody does not
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            layers["uid_drop"] = True
        except OSError:
            pass
    layers["no_new_privs"] = libc.prctl(38, 1, 0, 0, 0) == 0  # setuid binaries stay inert
    # Unlike the optional layers above, a failing rlimit aborts the run (reported as crashed).
    for res, soft, hard in ((resource.RLIMIT_CORE, 0, 0),
                            (resource.RLIMIT_CPU, int(cpu), int(cpu) + 1),
                            (resource.RLIMIT_NPROC, 0, 0),
                            (resource.RLIMIT_NOFILE, 32, 32),
                            (resource.RLIMIT_FSIZE, int(fsize), int(fsize)),
                            (resource.RLIMIT_AS, int(mem) << 20, int(mem) << 20)):
        cap = resource.getrlimit(res)[1]
        if cap != resource.RLIM_INFINITY:
            soft, hard = min(soft, cap), min(hard, cap)
        resource.setrlimit(res, (soft, hard))
    layers["rlimits"] = True
    del ctypes, resource, libc
    for name in ("ctypes", "ctypes._endian", "_ctypes", "resource"):
        sys.modules.pop(name, None)  # so the check cannot reuse them without an import event
    violations = []
    sys.addaudithook(make_hook(root, violations))

    builtins_dict = vars(builtins)
    saved_builtins = dict(builtins_dict)  # the check may patch builtins that json relies on
    ok, error, value_json, ns = False, None, "null", {"__name__": "__check__"}
    try:
        exec(compile(source, "check.py", "exec"), ns)
        fn = ns.get(entry)
        if not callable(fn):
            raise NameError(f"entrypoint {entry!r} is not defined")
        value = fn(payload)
        try:
            value_json, ok = dumps(value, allow_nan=False), True
        except (TypeError, ValueError) as exc:
            error = f"bad_output: return value is not JSON-serialisable ({describe(exc)})"
    except MemoryError:
        error = "memory_limit: MemoryError"
    except Forbidden:
        pass
    except BaseException as exc:
        error = f"exception: {describe(exc)}"
    ns.clear()  # drop whatever the check allocated before reporting
    builtins_dict.update(saved_builtins)
    if violations:  # reported even if the check caught the exception
        ok, error, value_json = False, f"forbidden: {violations[0]}", "null"
    line = '%s {"ok": %s, "error": %s, "layers": %s, "value": %s}\n' % (
        nonce, "true" if ok else "false", dumps(error), dumps(layers), value_json)
    data = line.encode()
    while data:
        data = data[write(1, data):]

main()
'''


def run_check(
    source: str,
    payload: dict,
    *,
    entrypoint: str = "check",
    limits: SandboxLimits = SandboxLimits(),
) -> SandboxResult:
    """Runs ``entrypoint(payload)`` from untrusted ``source`` in a sandboxed subprocess.

    Args:
        source: Python code defining the check function.
        payload: JSON-serialisable input passed to the check.
        entrypoint: Name of the function to call.
        limits: Resource limits for this run.

    Returns:
        The outcome. Nothing the untrusted code does makes this raise; only a
        non-serialisable ``payload`` (a caller bug) does.
    """
    return _execute(source, payload, entrypoint, limits)[0]


@functools.lru_cache(maxsize=1)
def isolation_report() -> dict[str, Any]:
    """Reports which isolation layers are active on this machine, by running a probe.

    Returns:
        Mapping of layer name to whether (or how) it is applied. The audit hook,
        wall-clock kill and process-group kill are always present.
    """
    result, layers = _execute("def check(payload):\n    return 1\n", {}, "check", SandboxLimits())
    return {
        "probe_ok": result.ok,
        "running_as_root": os.geteuid() == 0,
        "audit_hook": True,
        "process_group_kill": True,
        "rlimits": bool(layers.get("rlimits")),
        "netns": layers.get("netns"),
        "uid_drop": bool(layers.get("uid_drop")),
        "no_new_privs": bool(layers.get("no_new_privs")),
    }


def _execute(
    source: str, payload: dict, entrypoint: str, limits: SandboxLimits
) -> tuple[SandboxResult, dict[str, Any]]:
    payload_text = json.dumps(payload, allow_nan=False)
    start = time.monotonic()
    root = os.path.realpath(tempfile.mkdtemp(prefix="synthloop-sandbox-"))
    try:
        for name, text in (("payload.json", payload_text), ("check.py", source)):
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(text)
        if os.geteuid() == 0:  # the child drops to nobody and may still use its own folder
            with contextlib.suppress(OSError):
                os.chown(root, _NOBODY, _NOBODY)
        nonce = secrets.token_hex(16)
        argv = [sys.executable, "-I", "-S", "-c", _RUNNER, root, entrypoint, nonce,
                str(limits.cpu_seconds), str(limits.memory_mb), str(limits.max_output_bytes)]
        with subprocess.Popen(argv, cwd=root, env={}, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True) as proc:
            try:
                out, err, problem = _collect(proc, start + limits.wall_seconds,
                                             limits.max_output_bytes)
            finally:
                # Kill before reaping: the group id cannot be reused while the child is unreaped,
                # and this also takes any escaped grandchildren down with it.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    duration = time.monotonic() - start
    report = _parse(out, nonce) if problem is None else None
    layers = report.get("layers", {}) if report else {}

    def fail(error: str) -> tuple[SandboxResult, dict[str, Any]]:
        return SandboxResult(False, None, error, duration), layers

    rc = proc.returncode
    if problem == "timeout":
        return fail(f"timeout: wall clock {limits.wall_seconds}s exceeded")
    if problem == "overflow":
        return fail(f"bad_output: output exceeded {limits.max_output_bytes} bytes")
    # SIGKILL comes from the hard CPU limit if the check ignored SIGXCPU.
    if rc == -signal.SIGXCPU or (rc == -signal.SIGKILL and duration >= limits.cpu_seconds):
        return fail(f"cpu_limit: CPU time limit {limits.cpu_seconds}s exceeded")
    if report is None:
        tail = err[-300:].decode("utf-8", "replace").strip()
        if b"MemoryError" in err or b"Cannot allocate memory" in err:
            return fail(f"memory_limit: {tail}")
        if rc != 0:
            return fail(f"crashed: exit status {rc}: {tail}")
        return fail("bad_output: no result line")
    if report["ok"]:
        return SandboxResult(True, report.get("value"), None, duration), layers
    error = report.get("error")
    if not isinstance(error, str) or error.split(":", 1)[0] not in ERROR_KINDS:
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
    # Wait for exit without reaping (WNOWAIT), so the caller can still kill the group safely.
    while not os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
        if time.monotonic() >= deadline:
            return bytes(out), bytes(err), "timeout"
        time.sleep(0.005)
    return bytes(out), bytes(err), None


def _parse(out: bytes, nonce: str) -> dict[str, Any] | None:
    """Returns the child's result report, ignoring anything the check itself printed."""
    prefix = nonce.encode() + b" "
    for line in reversed(out.splitlines()):
        if line.startswith(prefix):
            try:
                report = json.loads(line[len(prefix):])
            except ValueError:
                return None
            return report if isinstance(report, dict) and isinstance(report.get("ok"), bool) else None
    return None
