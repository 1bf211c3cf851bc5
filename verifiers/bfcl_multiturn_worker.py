"""Inside the sandbox only: runs BFCL's own ``multi_turn_checker`` on one entry per request.

Started by :mod:`verifiers.bfcl_multiturn` as ``python worker.py CONFIG`` behind the boundary, with the unpacked
bfcl-eval folder bound read-only. It is never imported by the host. Requests and answers are one JSON line each:
``{"op": "check", "entry", "calls", "category"}`` is answered ``NONCE {"valid", "error_type", "message"}`` (BFCL's
verdict); ``{"op": "start", "entry"}`` then ``{"op": "execute", "calls"}`` play an entry as BFCL's inference harness
does, answered ``NONCE {"results": [...]}`` (what ``execute_multi_turn_func_call`` returns for the calls).

Before BFCL ``eval``s a call, it is checked here, where the namespace ``eval`` sees is known: the called name must
be a public method of an involved class, or a name nothing in that namespace defines (BFCL then answers its own
``name ... is not defined``); a builtin (``exec``, ``open``, ``input``) or a name of BFCL's module is refused.

Between entries every module imported after start-up (bfcl_eval, mpmath, what they pulled in) is dropped from
``sys.modules`` and imported anew, so no instance BFCL caches in its module globals, no class attribute and no
mpmath context survives into the next entry.
"""

import ast
import builtins
import importlib
import json
import os
import sys

MESSAGE_CAP = 2000
RESULT_CAP = 200_000
UTILS = "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils"
CHECKER = "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker"
CONFIG = "bfcl_eval.constants.executable_backend_config"
MODEL = "synthloop"


class Refused(Exception):
    """A call that may not reach BFCL's eval."""


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        config = json.load(f)
    nonce = config["nonce"]
    sys.path.insert(0, config["root"])
    sys.pycache_prefix = "/sandbox/work/pycache"  # compiled once per worker: the bound folder is read-only
    # the answer channel is a private copy of stdout; anything the checked code prints goes to stderr
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    baseline = set(sys.modules)
    playing = None
    for line in sys.stdin:
        request = json.loads(line)
        op = request.get("op")
        if op in ("check", "start"):  # a new entry: every module imported since start-up is imported anew
            for name in [m for m in sys.modules if m not in baseline]:
                del sys.modules[name]
            playing = None
        try:
            if op == "check":
                answer = check(request)
            elif op == "start":
                playing = request["entry"]
                answer = {"results": execute(playing, [])}
            elif op == "execute" and playing is not None:
                answer = {"results": execute(playing, request["calls"])}
            else:
                answer = {"error": f"unknown or out-of-order request {op!r}"}
        except Refused as exc:
            answer = ({"valid": False, "error_type": "synthloop:refused_call", "message": str(exc)[:MESSAGE_CAP]}
                      if op == "check" else {"error": str(exc)[:MESSAGE_CAP]})
        except Exception as exc:  # BFCL's code failed on this entry: an answer, not a dead worker
            message = f"{type(exc).__name__}: {exc}"[:MESSAGE_CAP]
            answer = ({"valid": False, "error_type": "synthloop:checker_exception", "message": message}
                      if op == "check" else {"error": message})
        channel.write(nonce + " " + json.dumps(answer) + "\n")
        channel.flush()


def allowed_names(entry):
    """The names a call may use: the involved classes' public methods; and the names BFCL's eval namespace does
    not define (they fail there as undefined). None of the builtins or of BFCL's module globals."""
    utils = importlib.import_module(UTILS)
    mapping = importlib.import_module(CONFIG).CLASS_FILE_PATH_MAPPING
    methods = set()
    for class_name in entry["involved_classes"]:
        cls = getattr(importlib.import_module(mapping[class_name]), class_name)
        methods |= {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}
    defined = set(dir(builtins)) | set(vars(utils))
    return methods, defined


def guard(entry, calls):
    methods, defined = allowed_names(entry)
    for call in calls:
        node = ast.parse(call.strip(), mode="eval").body  # the host checked it is name(literal, ...)
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise Refused(f"not a call of a plain function name: {call[:120]!r}")
        name = node.func.id
        if name not in methods and (name in defined or name.startswith("_")):
            raise Refused(f"{name!r} is not a method of {', '.join(entry['involved_classes'])}: {call[:120]!r}")


def execute(entry, calls):
    guard(entry, calls)
    utils = importlib.import_module(UTILS)
    category = entry["id"].rsplit("_", 1)[0]
    results, _ = utils.execute_multi_turn_func_call(
        calls, entry["initial_config"], entry["involved_classes"], MODEL, entry["id"],
        long_context="long_context" in category or "composite" in category, is_evaL_run=False)
    return [r if len(r) <= RESULT_CAP else r[:RESULT_CAP] + "...(cut)" for r in map(str, results)]


def check(request):
    entry, calls = request["entry"], request["calls"]
    ground_truth = entry["ground_truth"]
    checker = importlib.import_module(CHECKER)
    utils = importlib.import_module(UTILS)
    for turn in calls:
        for step in turn:
            guard(entry, step)
    # as BFCL's eval runner does before its checker: a run cut short fails whole; empty steps are not calls
    if len(calls) != len(ground_truth):
        return {"valid": False, "error_type": "multi_turn:force_terminated",
                "message": f"the model result has {len(calls)} turns, the ground truth {len(ground_truth)}"}
    decoded = [[step for step in turn if not utils.is_empty_execute_response(step)] for turn in calls]
    prompt = {k: v for k, v in entry.items() if k != "ground_truth"}
    result = checker.multi_turn_checker(decoded, ground_truth, prompt, request["category"], MODEL)
    valid = result.get("valid") is True
    message = "" if valid else str(result.get("error_message", ""))[:MESSAGE_CAP]
    error_type = None if valid else str(result.get("error_type", "unknown"))[:200]
    return {"valid": valid, "error_type": error_type, "message": message}


if __name__ == "__main__":
    main()
