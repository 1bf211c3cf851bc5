"""The MCP protocol as this project speaks it: one sandboxed server process over stdio, and what its answers mean.

:class:`ServerProcess` starts a server through ``sandbox.sandboxed`` and holds the newline-delimited JSON-RPC 2.0
conversation with it (``initialize`` → ``notifications/initialized`` → ``tools/list`` → ``tools/call``), one
request at a time, each with a deadline; a server that crashes, hangs or speaks malformed JSON is
:class:`ServerGone`. :func:`mcp_tool` turns a ``tools/list`` entry into a ``schemas.Tool`` and :func:`call_result`
a ``tools/call`` answer into ``(value, error)``. Used by ``envs.mcp``, which explains why the client is our own.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import json
import os
import re
import select
import subprocess
import threading
import time
from typing import Any

import jsonschema

from sandbox.boundary import Spec, sandboxed
from schemas import Tool


PROTOCOL_VERSION = "2025-06-18"
MAX_LINE = 32 << 20
"""The longest JSON-RPC message accepted from a server; a longer one is malformed."""
_SIGNALS = {9: "SIGKILL (killed)", 24: "SIGXCPU (CPU limit)", 25: "SIGXFSZ (file size limit)",
            31: "SIGSYS (a system call the sandbox forbids)", 11: "SIGSEGV", 6: "SIGABRT"}


class MCPError(RuntimeError):
    """An MCP server could not be started or spoke something other than MCP; the message names the command."""


class ServerGone(Exception):
    """The server process is gone (crashed, killed after a timeout, or stopped for malformed output)."""


class RPCError(Exception):
    """A JSON-RPC error response: the server understood the request and refused it."""


# --- the wire ---------------------------------------------------------------------------------------------------


class ServerProcess:
    """One sandboxed server process and the JSON-RPC conversation with it: one request at a time, with deadlines."""

    def __init__(self, label: str, spec: Spec, start_timeout: float):
        self.label = label
        self.dead: str | None = None
        self._stack = contextlib.ExitStack()
        self._buf = bytearray()
        self._next_id = 0
        self._err: collections.deque[str] = collections.deque(maxlen=40)
        self.proc = self._stack.enter_context(
            sandboxed(spec, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        self._drain = threading.Thread(target=self._read_stderr, name="mcp-stderr", daemon=True)
        self._drain.start()
        try:
            self.info = self.request("initialize", {
                "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                "clientInfo": {"name": "synthloop", "version": "0"}}, start_timeout)
            if not isinstance(self.info, dict):
                raise ServerGone(f"answered initialize with {clip(json.dumps(self.info))} instead of an object")
            self.notify("notifications/initialized")
        except (ServerGone, RPCError) as exc:
            self.close()
            raise MCPError(f"MCP server `{label}` did not start: {exc}{self.stderr_tail()}") from None

    def _read_stderr(self) -> None:
        # bounded reads: a server writing gigabytes to stderr without a newline must not grow this process
        with contextlib.suppress(OSError, ValueError):
            while line := self.proc.stderr.readline(4096):
                self._err.append(line.decode("utf-8", "replace").rstrip()[:400])

    def stderr_tail(self) -> str:
        self._drain.join(timeout=1.0)
        text = "\n".join(self._err).strip()[-1500:]
        return f"; its stderr ends:\n{text}" if text else "; it wrote nothing on stderr"

    def close(self) -> None:
        """Kills the whole sandbox (bwrap's process group) and reaps it; idempotent."""
        self.dead = self.dead or "closed"
        self._stack.close()

    def _fail(self, why: str) -> ServerGone:
        self.dead = why
        if self.proc.poll() is not None:  # it ended by itself: let the drain read its last words first
            self._drain.join(timeout=1.0)
        self._stack.close()
        return ServerGone(why)

    def _exit_status(self) -> str:
        try:
            rc = self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            return "closed its output"
        sig = -rc if rc < 0 else rc - 128 if rc > 128 else None
        if sig in _SIGNALS:
            return f"was killed by {_SIGNALS[sig]}"
        return {98: "could not apply the sandbox's limits (exit 98)",
                127: "could not be executed (exit 127)"}.get(rc, f"exited with status {rc}")

    def _send(self, message: dict[str, Any]) -> None:
        if self.dead:
            raise ServerGone(self.dead)
        try:
            self.proc.stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise self._fail(self._exit_status()) from None

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        self._send({"jsonrpc": "2.0", "method": method, **({"params": params} if params is not None else {})})

    def request(self, method: str, params: dict[str, Any] | None, timeout: float) -> Any:
        """The result of one request; raises ``RPCError`` for an error answer and ``ServerGone`` when the server is gone."""
        self._next_id += 1
        rid = self._next_id
        self._send({"jsonrpc": "2.0", "id": rid, "method": method,
                    **({"params": params} if params is not None else {})})
        deadline = time.monotonic() + timeout
        while True:
            message = self._read(deadline, method, timeout)
            if "method" in message:  # a request or notification from the server (logging, progress, ping)
                if "id" in message:
                    self._send({"jsonrpc": "2.0", "id": message["id"], "result": {}} if message["method"] == "ping"
                               else {"jsonrpc": "2.0", "id": message["id"],
                                     "error": {"code": -32601, "message": "not supported by this client"}})
                continue
            if message.get("id") != rid:
                continue  # an answer to a request we no longer wait for
            if "error" in message:
                error = message["error"]
                text = error.get("message") if isinstance(error, dict) else None
                raise RPCError(str(text) if text else clip(json.dumps(error, default=str)))
            if "result" not in message:
                raise self._fail(f"answered {method} with neither a result nor an error: {clip(json.dumps(message))}")
            return message["result"]

    def _read(self, deadline: float, method: str, timeout: float) -> dict[str, Any]:
        fd = self.proc.stdout.fileno()
        while True:
            newline = self._buf.find(b"\n")
            if newline >= 0:
                line = bytes(self._buf[:newline]).strip()
                del self._buf[: newline + 1]
                if not line:
                    continue
                try:
                    message = json.loads(line)
                except ValueError:
                    shown = clip(line.decode("utf-8", "replace"))
                    raise self._fail(f"answered {method} with malformed JSON: {shown}") from None
                if not isinstance(message, dict):
                    raise self._fail(f"answered {method} with a JSON {type(message).__name__}, not a JSON-RPC message")
                return message
            if len(self._buf) > MAX_LINE:
                raise self._fail(f"sent a message over {MAX_LINE >> 20} MB while answering {method}")
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                raise self._fail(f"did not answer {method} within {timeout:g} s (killed)")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise self._fail(self._exit_status())
            self._buf += chunk


def clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


# --- tools ------------------------------------------------------------------------------------------------------


def mcp_tool(entry: Any, *, domain: str, source: str, taken: set[str]) -> Tool:
    """One entry of ``tools/list`` as a ``schemas.Tool``; raises ``ValueError`` naming what is wrong with it.

    ``mutates``: an explicit boolean ``mutates`` wins; else, where the annotations say (``readOnlyHint`` or
    ``destructiveHint`` a boolean), False only for ``readOnlyHint: true`` without ``destructiveHint: true``; else
    inferred from the name (:func:`name_mutates`), recorded as ``origin["mutates_inferred"] = "name"``.

    ``taken`` holds the names already given; the OpenAI-valid name gets a numeric suffix when two differ only in
    characters OpenAI does not allow.
    """
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        raise ValueError(f"a tools/list entry without a name: {clip(json.dumps(entry, default=str))}")
    original = entry["name"]
    schema = entry.get("inputSchema", {"type": "object"})
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise ValueError(f"tool {original!r}: inputSchema is not an object schema")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"tool {original!r}: inputSchema is not a valid JSON schema: {exc.message}") from None
    parameters = {**schema, "type": "object", "properties": dict(schema.get("properties") or {})}
    output = entry.get("outputSchema")
    annotations = entry.get("annotations") if isinstance(entry.get("annotations"), dict) else {}
    # As the catalog's MCP reader decides (generators.catalog, which envs may not import); where the server says
    # nothing, the name's first word decides (read_query, list_tables: reads; write_query, append_insight: writes),
    # and the execution checks it (a call to a read-only tool that changes the state is caught: MCPEnvironment).
    inferred = None
    if isinstance(entry.get("mutates"), bool):
        mutates = entry["mutates"]
    elif isinstance(annotations.get("readOnlyHint"), bool) or isinstance(annotations.get("destructiveHint"), bool):
        mutates = annotations.get("readOnlyHint") is not True or annotations.get("destructiveHint") is True
    else:
        mutates, inferred = name_mutates(original), "name"
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", original)[:64]
    base, n = name, 1
    while name in taken:
        n += 1
        name = f"{base[:60]}_{n}"
    taken.add(name)
    description = entry.get("description") if isinstance(entry.get("description"), str) else ""
    return Tool(name=name, description=description or entry.get("title") or original, parameters=parameters,
                domain=domain, returns=output if isinstance(output, dict) else None, source=source,
                implementation=None, mutates=mutates,
                origin={"kind": "mcp", "name": original, "annotations": annotations,
                        **({"mutates_inferred": inferred} if inferred else {})})


READ_VERBS = frozenset({"read", "list", "get", "describe", "search", "find", "query", "open", "fetch", "show",
                        "count"})
"""First words of tool names taken to only read, where a server declares no ``readOnlyHint``."""


def name_mutates(name: str) -> bool:
    """Whether a tool named ``name`` is taken to write, from its first word: ``read_query``, ``listTables``,
    ``get-file`` read; anything else (``write_query``, ``create_table``, ``append_insight``, ``run``) writes."""
    words = re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+", name.rsplit("/", 1)[-1].rsplit(".", 1)[-1])
    return not words or words[0].lower() not in READ_VERBS


def call_result(result: Any) -> tuple[Any, str | None]:
    """A ``tools/call`` result as ``(value, error)``: structured content, else the text parsed as JSON, else text."""
    if not isinstance(result, dict):
        return None, f"the server answered tools/call with {clip(json.dumps(result, default=str))}"
    content = result.get("content") if isinstance(result.get("content"), list) else []
    texts = [c["text"] for c in content
             if isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str)]
    text = "\n".join(texts)
    if result.get("isError"):
        return None, text or "the tool reported an error without a message"
    if result.get("structuredContent") is not None:
        return result["structuredContent"], None
    if texts:
        try:
            return json.loads(text, parse_constant=refuse_constant), None
        except ValueError:
            return _python_literal(text), None
    return content or None, None


def _python_literal(text: str) -> Any:
    """``str()`` of a list or dict (what many Python servers send: mcp-server-sqlite's ``[{'n': 40}]``) as that
    value, where it is one and nothing but literals; otherwise the text itself."""
    stripped = text.strip()
    if len(stripped) > 1_000_000 or stripped[:1] not in ("[", "{"):
        return text
    try:
        value = ast.literal_eval(stripped)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    try:  # only what JSON can carry survives (no sets, tuples as lists, no bytes or complex numbers)
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return text


def refuse_constant(name: str) -> Any:
    raise ValueError(name)
