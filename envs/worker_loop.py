"""The request loop both sandboxed workers run (``plugin_worker.py``, ``objects_worker.py``): standard library only.

A worker runs this file from its own folder (``runpy.run_path``: each is started as a script under ``-I``, so its
folder is not on ``sys.path``), and hands :func:`serve` how to build its host object; serve answers one JSON
request per line on stdin with one JSON answer per line on the descriptor stdout had at start. Whatever the
user's code prints goes to stderr, so it cannot garble the channel by accident (it can on purpose: the caller
treats every answer as untrusted data).

Request: ``{"id": n, "op": "execute", "h": 3, ...}``, plus ``"drop": [handles]`` of instances the caller no
longer holds. Answer: ``{"id": n, "ok": true, "value": ...}`` or ``{"id": n, "ok": false, "error": "..."}``.
"""

import importlib
import json
import os
import sys
import traceback


class Failure(Exception):
    """A request that cannot be answered; its message goes back to the caller as the answer's error."""


def where(exc):
    """``ValueError: boom (pkg/mod.py:42 in fn)``: the exception and its innermost frame."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    message = text[-1] if text else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        message += f" ({'/'.join(last.filename.split('/')[-2:])}:{last.lineno} in {last.name})"
    return message[:2000]


def serve(make_host, ops, default=None):
    """Answers requests until stdin ends; ``make_host()`` runs once the channel is set up (its output is not
    an answer), and a :class:`Failure` it raises answers every request; ``default`` renders what JSON cannot."""
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def answer(message):
        channel.write(json.dumps(message, separators=(",", ":"), default=default) + "\n")
        channel.flush()

    host, broken = None, None
    try:
        host = make_host()
    except Failure as exc:
        broken = str(exc)
    for line in sys.stdin:
        request_id = None
        try:
            request = json.loads(line)
            request_id = request.get("id")
            if broken is not None:
                raise Failure(broken)
            if request.get("drop"):
                host.close({"handles": request["drop"]})
            op = request.get("op")
            if op not in ops:
                raise Failure(f"unknown request {op!r}")
            value = getattr(host, op)(request)
            answer({"id": request_id, "ok": True, "value": value})
        except Failure as exc:
            answer({"id": request_id, "ok": False, "error": str(exc)})
        except Exception as exc:  # noqa: BLE001 - a bug of the user's code in a state call (rows, candidates, ...)
            answer({"id": request_id, "ok": False, "error": where(exc)})


def resolve(ref):
    """The object ``module:qualname`` names, imported here (a failed import is a :class:`Failure` naming it)."""
    module, _, qualname = ref.partition(":")
    try:
        owner = importlib.import_module(module)
    except BaseException as exc:  # noqa: BLE001 - SystemExit in a user's import is its failure too
        raise Failure(f"cannot import {module}: {where(exc)}") from None
    target = owner
    for part in qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise Failure(f"module {module} has no attribute {qualname!r}")
    return target


class Handles:
    """The environments a worker hosts, by the handle the caller holds; a worker's host object extends it."""

    def __init__(self):
        self.envs, self.counter = {}, 0

    def keep(self, env):
        self.counter += 1
        self.envs[self.counter] = env
        return self.counter

    def env(self, request):
        handle = request.get("h")
        if handle not in self.envs:
            raise Failure(f"no environment with handle {handle!r} (closed, or never opened)")
        return self.envs[handle]

    @staticmethod
    def seed(request):
        seed = request.get("seed")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise Failure(f"seed must be an integer, not {seed!r}")
        return seed
