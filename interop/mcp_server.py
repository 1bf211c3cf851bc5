"""Stored tasks served as an MCP server (stdio or Streamable HTTP): one :class:`~interop.episode.Episode` per session,
graded where the agent cannot reach.

An MCP session plays one task at a time on a private copy of its initial state. The server assigns the tasks (the
served selection in turn; the agent never names one). A session sees the task's tools (and the domain's
distractors, as in evaluation) with their JSON schemas, ``ask_user`` (the scripted user: private information,
confirmations, the next request), ``submit_answer`` (the final answer as a value typed like the task's expected
answer; it ends the play), ``reset`` (the session's next assigned task, or the same task again where the operator
allows it with ``--repeat``) and two resources: ``synthloop://prompt`` (the system prompt and the user's first
message, as OpenAI messages) and ``synthloop://tasks`` (the selection: ids and domains only). A tool error is an
observation with ``isError`` set, so the agent may recover; a tool the task does not offer — ``verify``,
``grade`` — is an unknown tool.

The verifier is no tool. A play ends when the agent submits, or when its session resets or closes (stdin's end on
stdio, the client's DELETE, idle expiry or shutdown on HTTP); it is judged then, once, and its record appended to
``--out`` (JSON lines). The answer is judged only as the submitted value (exact typed match), so a hedged list or
a negation in the conversation's text earns nothing. Of the plays of one task in one session only the first ended
one counts (``counts``): playing it again after a bad grade, or after seeing a verdict, changes nothing. Over HTTP
the operator also reads grades from ``GET /grade/{session}`` — a plain route beside the MCP endpoint that answers
only to the bearer token written, mode 0600, to the token file at start-up; nothing reachable through MCP reads
that file or that route. A session learns its id from ``synthloop://prompt``, which is harmless without the token.

Every handler runs on the event loop's thread: the environments are in-process SQLite forks (or sandbox clients)
owned by that thread, and a call takes milliseconds.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp import types
from mcp.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from interop.episode import ASK_USER, SUBMIT_ANSWER, Episode, TaskLibrary, submit_tool

MCP_PATH = "/mcp"
RESET = {
    "name": "reset",
    "description": "End this task (graded as it stands if you have not submitted) and start the next task this "
                   "server assigns you, on a fresh copy of its state; returns its system prompt and the user's "
                   "first message.",
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
}
OWN_TOOLS = ("ask_user", "reset", SUBMIT_ANSWER)
TASKS_URI = "synthloop://tasks"
PROMPT_URI = "synthloop://prompt"
INSTRUCTIONS = ("Each session plays one stored task on its own copy of the task's state. Read synthloop://prompt "
                "for the system prompt and the user's first message, use the tools, and talk to the user with "
                "ask_user (they answer questions, confirm, and give their next request), and hand in your final "
                "answer with submit_answer (the value itself; it ends the task, and only the first submission "
                "counts). The conversation is graded by the operator after it ends.")


@dataclass
class Play:
    """One session's play of one task, from its start or reset to the next reset or the session's end."""

    session: str
    number: int
    episode: Episode
    last_seen: float
    record: dict[str, Any] | None = None  # set once the play has ended (submitted): judged then, never again

    @property
    def key(self) -> tuple[str, str]:
        return self.episode.task.run_id, self.episode.task.task_id

    def head(self) -> dict[str, Any]:
        task = self.episode.task
        return {"session": self.session, "play": self.number, "task_id": task.task_id, "run_id": task.run_id}


class Plays:
    """The server's state: the served selection, the current play of every session, and the ended plays' records.

    Args:
        library: The corpus's tasks.
        keys: ``(run_id, task_id)`` of the tasks served; a new session, and a session that resets, gets the next
            one in turn: the assignment is the server's, never the agent's.
        out: A JSON-lines file each ended play's record is appended to (judgement, transcript, ``counts``).
        idle_s: A session untouched this long is ended (and recorded) at the next request; None: never.
        repeat: ``reset`` restarts the session's current task instead of moving it to the next (the operator's
            choice, for harnesses that sample one task several times); only the first ended play of a task counts.
    """

    def __init__(self, library: TaskLibrary, keys: list[tuple[str, str]], *, out: Path | None = None,
                 idle_s: float | None = None, distractors: int = 2, repeat: bool = False):
        if not keys:
            raise ValueError(f"no tasks to serve in {library.corpus.root}")
        self.library = library
        self.keys = keys
        self.out = out
        self.idle_s = idle_s
        self.distractors = distractors
        self.repeat = repeat
        self.current: dict[str, Play] = {}
        self.ended: dict[str, list[dict[str, Any]]] = {}
        self.counted: dict[tuple[str, str, str], int] = {}  # (session, run_id, task_id) -> the play that counts
        self.plays_started: dict[str, int] = {}
        self._turn = 0

    def task_list(self) -> list[dict[str, Any]]:
        return [{"task_id": t, "run_id": r, "domain": self.library.task(r, t).domain} for r, t in self.keys]

    def _next_key(self) -> tuple[str, str]:
        key = self.keys[self._turn % len(self.keys)]
        self._turn += 1
        return key

    def _start(self, session: str, key: tuple[str, str]) -> Play:
        episode = self.library.episode(self.library.task(*key), distractors=self.distractors, typed_answers=True)
        clash = sorted(set(episode.tool_names) & set(OWN_TOOLS))
        if clash:
            episode.close()
            raise MCPError(types.INTERNAL_ERROR, f"task {key[1]} has a tool named {', '.join(clash)}, which this "
                                                 "server uses for the user, the answer or reset; it cannot be served")
        number = self.plays_started.get(session, 0)
        self.plays_started[session] = number + 1
        play = Play(session, number, episode, time.monotonic())
        self.current[session] = play
        return play

    def play(self, session: str) -> Play:
        """The session's current play; a session's first request starts it on the next task of the selection."""
        self.sweep()
        play = self.current.get(session)
        if play is None:
            play = self._start(session, self._next_key())
        play.last_seen = time.monotonic()
        return play

    def reset(self, session: str) -> Play:
        """End the session's play (judged as it stands unless already submitted) and start its next assignment:
        the next task in turn, or the same task again with ``repeat``. A play reset before any turn is recorded
        too: skipping a task after reading it is a choice of task, and the skipped task is graded."""
        old = self.play(session)
        key = old.key if self.repeat else self._next_key()
        self.end(session, "reset")
        return self._start(session, key)

    def submit(self, session: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Hand in the play's answer and end it: judged now, once; the session stays on the finished task until
        it resets."""
        play = self.play(session)
        play.episode.submit(arguments)
        return self._finish(play, "submitted")

    def record(self, play: Play, ended: str | None) -> dict[str, Any]:
        episode = play.episode
        submitted = episode.submitted
        return {**play.head(), "ended": ended, "counts": False,
                "submitted": {"answer": submitted.value} if submitted and submitted.given else None,
                "judgement": episode.judge().to_dict(),
                "tools": list(episode.tool_names), "messages": [dict(m) for m in episode.messages]}

    def _finish(self, play: Play, reason: str) -> dict[str, Any]:
        record = self.record(play, reason)
        slot = (play.session, *play.key)
        if slot not in self.counted:  # the first ended play of a task in a session is its grade; later ones are kept
            self.counted[slot] = play.number
            record["counts"] = True
        play.record = record
        self.ended.setdefault(play.session, []).append(record)
        if self.out is not None:
            with open(self.out, "a") as fh:
                fh.write(json.dumps(record, default=str) + "\n")
        return record

    def end(self, session: str, reason: str) -> dict[str, Any] | None:
        """End the session's play (judged and recorded unless it already was) and release its state."""
        play = self.current.pop(session, None)
        if play is None:
            return None
        try:
            return play.record or self._finish(play, reason)
        finally:
            play.episode.close()

    def end_all(self, reason: str) -> None:
        for session in list(self.current):
            self.end(session, reason)

    def sweep(self) -> None:
        if self.idle_s is None:
            return
        now = time.monotonic()
        for session, play in list(self.current.items()):
            if now - play.last_seen > self.idle_s:
                self.end(session, "expired")

    def grade(self, session: str, number: int | None = None) -> dict[str, Any] | None:
        """The grade of the session's current task: the record of its first ended play in this session (the one
        that counts, whatever was played after it); while none has ended, the live play judged now, with ``ended``
        None and ``counts`` False. With ``number``: that play's record, counting or not."""
        live = self.current.get(session)
        ended = self.ended.get(session, [])
        if number is not None:
            if live is not None and live.record is None and number == live.number:
                return self.record(live, None)
            return next((r for r in ended if r["play"] == number), None)
        key = live.key if live is not None else (ended[-1]["run_id"], ended[-1]["task_id"]) if ended else None
        if key is None:
            return None
        first = self.counted.get((session, *key))
        if first is not None:
            return next(r for r in ended if r["play"] == first)
        return self.record(live, None) if live is not None else None

    def sessions(self) -> list[dict[str, Any]]:
        rows = [{**p.head(), "ended": None, "counts": False} for p in self.current.values() if p.record is None]
        rows += [{k: r[k] for k in ("session", "play", "task_id", "run_id", "ended", "counts")}
                 for records in self.ended.values() for r in records]
        return sorted(rows, key=lambda r: (r["session"], r["play"]))

    def prompt(self, session: str) -> dict[str, Any]:
        play = self.play(session)
        return {**play.head(), "messages": play.episode.prompt}

    def close(self) -> None:
        self.end_all("shutdown")
        self.library.close()


def mcp_tool(spec: dict[str, Any]) -> types.Tool:
    function = spec.get("function", spec)
    return types.Tool(name=function["name"], description=function.get("description"),
                      input_schema=function.get("parameters") or {"type": "object", "properties": {}})


def text_result(text: str, *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=error)


def is_error_observation(content: str) -> bool:
    """Whether an episode's observation is the environment's error form (``{"error": ...}``)."""
    try:
        value = json.loads(content)
    except ValueError:
        return False
    return isinstance(value, dict) and set(value) == {"error"}


class EpisodeServer(Server):
    """Says that the tool list changes (a reset to another task changes it), on every transport."""

    def create_initialization_options(self, notification_options: NotificationOptions | None = None, *args: Any,
                                      **kwargs: Any) -> Any:
        return super().create_initialization_options(notification_options or NotificationOptions(tools_changed=True),
                                                     *args, **kwargs)


def build_server(plays: Plays, *, http: bool) -> Server:
    """The MCP server over ``plays``; on HTTP a session is the transport's ``Mcp-Session-Id``, on stdio the process."""
    stdio_session = f"stdio-{uuid.uuid4().hex[:12]}"

    def session_of(ctx: Any) -> str:
        if not http:
            return stdio_session
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS or ctx.request is None:
            raise MCPError(types.INVALID_REQUEST, "this server keeps one episode per session: connect with the "
                                                  "initialize handshake (the mcp Client's mode 'auto' or 'legacy')")
        session = ctx.request.headers.get("mcp-session-id")
        if not session:
            raise MCPError(types.INVALID_REQUEST, "no Mcp-Session-Id on this request")
        return session

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        episode = plays.play(session_of(ctx)).episode
        return types.ListToolsResult(tools=[mcp_tool(t) for t in episode.tools] + [
            mcp_tool(ASK_USER), mcp_tool(submit_tool(episode.task)), mcp_tool(RESET)])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        session = session_of(ctx)
        args = params.arguments or {}
        if params.name == "reset":
            if args:  # a task the agent names would be a task it chose after seeing this one
                return text_result(f"reset takes no arguments (got {', '.join(sorted(args))}): this server assigns "
                                   "the tasks; reset ends this one and starts the next", error=True)
            before = plays.play(session).episode.tool_names
            play = plays.reset(session)
            if play.episode.tool_names != before:
                await ctx.session.send_tool_list_changed()
            return text_result(json.dumps(plays.prompt(session)))
        play = plays.play(session)
        if play.record is not None:
            return text_result(f"this task is over (ended: {play.record['ended']}); call reset for the next one",
                               error=True)
        episode = play.episode
        if params.name == SUBMIT_ANSWER:
            wanted = set(submit_tool(episode.task)["function"]["parameters"]["properties"])
            if set(args) != wanted:
                return text_result(f"{SUBMIT_ANSWER} takes " + (f"one argument, answer (got {sorted(args)})"
                                   if wanted else f"no arguments (got {sorted(args)})"), error=True)
            plays.submit(session, args)
            return text_result("Answer received; this task is over. Call reset for the next task.")
        if params.name == "ask_user":
            message = args.get("message")
            if not isinstance(message, str) or not message.strip():
                return text_result("ask_user needs a non-empty `message`", error=True)
            return text_result(episode.ask_user(message))
        content = episode.call(params.name, args)
        return text_result(content, error=is_error_observation(content))

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[
            types.Resource(uri=PROMPT_URI, name="prompt", mime_type="application/json",
                           description="this session's system prompt and the user's first message (OpenAI "
                                       "messages), with the session id and the task id"),
            types.Resource(uri=TASKS_URI, name="tasks", mime_type="application/json",
                           description="the tasks this server serves (it assigns them: reset moves on to the next)")])

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        if uri == PROMPT_URI:
            body = plays.prompt(session_of(ctx))
        elif uri == TASKS_URI:
            body = plays.task_list()
        else:
            raise MCPError(types.INVALID_PARAMS, f"no resource {uri}; there are {PROMPT_URI} and {TASKS_URI}")
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type="application/json",
                                                                             text=json.dumps(body))])

    server = EpisodeServer("synthloop", instructions=INSTRUCTIONS, on_list_tools=list_tools, on_call_tool=call_tool,
                    on_list_resources=list_resources, on_read_resource=read_resource)
    if http:
        # Per-request (2026-07-28) HTTP has no session to hold an episode: advertising only handshake versions makes
        # an 'auto' client fall back to initialize, which gives each client its Mcp-Session-Id.
        async def discover(ctx: Any, params: Any) -> types.DiscoverResult:
            return types.DiscoverResult(supported_versions=list(HANDSHAKE_PROTOCOL_VERSIONS),
                                        capabilities=server.create_initialization_options().capabilities,
                                        instructions=INSTRUCTIONS)

        server.add_request_handler("server/discover", types.RequestParams, discover)
    return server


def grade_routes(plays: Plays, token: str) -> list[Route]:
    """``GET /grade`` (every session's plays, each with ``counts``) and ``GET /grade/{session}[?play=N]`` (the
    grade of the session's current task — its first ended play — or play N: a judgement and its transcript), for
    the holder of ``token`` only."""

    def authorised(request: Request) -> bool:
        given = request.headers.get("authorization", "")
        return given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), token.encode())

    refused = JSONResponse({"error": "grading needs the operator's token: Authorization: Bearer <token file>"},
                           status_code=401, headers={"WWW-Authenticate": "Bearer"})

    async def sessions(request: Request) -> JSONResponse:
        if not authorised(request):
            return refused
        return JSONResponse(plays.sessions())

    async def grade(request: Request) -> JSONResponse:
        if not authorised(request):
            return refused
        number = request.query_params.get("play")
        if number is not None and not number.isdigit():
            return JSONResponse({"error": f"play must be a number, not {number!r}"}, status_code=400)
        record = plays.grade(request.path_params["session"], int(number) if number is not None else None)
        if record is None:
            return JSONResponse({"error": f"no play {number or ''} of session {request.path_params['session']}"},
                                status_code=404)
        return JSONResponse(json.loads(json.dumps(record, default=str)))

    return [Route("/grade", sessions), Route("/grade/{session}", grade)]


class EndOnDelete:
    """Ends a session's play when its client deletes the MCP session (the SDK tells the server nothing of it)."""

    def __init__(self, app: Any, plays: Plays):
        self.app = app
        self.plays = plays

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        status = {}

        async def watch(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        if scope["type"] != "http" or scope["method"] != "DELETE" or scope["path"] != MCP_PATH:
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, watch)
        session = dict(scope["headers"]).get(b"mcp-session-id")
        if status.get("code") == 200 and session:
            self.plays.end(session.decode("latin-1"), "closed")


def stopping(lifespan: Any, on_stop: Callable[[], None]) -> Any:
    """The app's lifespan, calling ``on_stop`` when it ends: uvicorn re-raises SIGTERM after its graceful shutdown,
    so code after ``uvicorn.run`` never runs then."""

    @asynccontextmanager
    async def run(app: Any) -> AsyncIterator[None]:
        async with lifespan(app):
            try:
                yield
            finally:
                on_stop()

    return run


def write_token(path: Path | None) -> tuple[str, Path]:
    """A fresh grader token in a file only its owner reads (a new private temp file unless ``path`` is given)."""
    token = secrets.token_urlsafe(32)
    if path is None:
        fd, name = tempfile.mkstemp(prefix="synthloop-mcp-grader-", suffix=".token")
        path = Path(name)
    else:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token, path


def serve(corpus: str, *, split: str | None = None, query: str | None = None, task: str | None = None,
          transport: str = "stdio", host: str = "127.0.0.1", port: int = 8765, out: str | None = None,
          token_file: str | None = None, idle_s: float = 1800.0, repeat: bool = False) -> int:
    """``synthloop mcp``: serve the selected tasks until stdin ends (stdio) or the process is stopped (HTTP)."""
    if sum(x is not None for x in (split, query, task)) > 1:
        raise ValueError("name one of --split, --query and --task")
    library = TaskLibrary(corpus)
    try:
        if task is not None:
            try:
                found = library.find(task)
            except KeyError as exc:
                raise ValueError(exc.args[0]) from None
            keys = [(found.run_id, found.task_id)]
        else:
            keys = library.keys(split=split, query=query)
        if out:
            open(out, "a").close()  # an unwritable --out fails now, not when the first play ends
        plays = Plays(library, keys, out=Path(out) if out else None, idle_s=idle_s if transport == "http" else None,
                      repeat=repeat)
    except BaseException:
        library.close()
        raise
    try:
        if transport == "stdio":
            import asyncio

            server = build_server(plays, http=False)
            print(f"synthloop mcp: {len(keys)} task(s) over stdio; "
                  + (f"each play's grade is appended to {out}" if out else "no --out: plays are not graded anywhere"),
                  file=sys.stderr, flush=True)

            async def run() -> None:
                async with stdio_server() as (read, write):
                    await server.run(read, write, server.create_initialization_options())

            asyncio.run(run())
            plays.end_all("closed")  # stdin ended: the client closed the session
        else:
            import uvicorn

            token, path = write_token(Path(token_file) if token_file else None)
            server = build_server(plays, http=True)
            app = server.streamable_http_app(streamable_http_path=MCP_PATH, host=host, session_idle_timeout=idle_s,
                                             custom_starlette_routes=grade_routes(plays, token))

            def on_stop() -> None:
                plays.end_all("shutdown")
                if not token_file:  # a temp file of ours; the token dies with the server
                    path.unlink(missing_ok=True)

            app.router.lifespan_context = stopping(app.router.lifespan_context, on_stop)
            print(f"synthloop mcp: {len(keys)} task(s) on http://{host}:{port}{MCP_PATH}; grades at "
                  f"http://{host}:{port}/grade/<session> with `Authorization: Bearer <token>`, the token in {path}",
                  file=sys.stderr, flush=True)
            uvicorn.run(EndOnDelete(app, plays), host=host, port=port, log_level="warning")
    finally:
        plays.close()
    return 0
