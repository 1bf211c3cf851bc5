"""Runs one untrusted check inside the sandbox, after the launcher has applied the kernel layers.

Reads `/sandbox/in/check.py` and `/sandbox/in/payload.json` (also bound read-only in its own folder), calls the entrypoint named in
`/sandbox/in/entrypoint`, and writes one JSON line `{"ok", "error", "value"}` to the result descriptor
(the original stdout; the check's own prints go to stderr), prefixed with the caller's nonce.

The audit hook below is defence in depth only: it shares this interpreter with the check, so a determined
check can reach it through frames or crafted bytecode. What it catches it reports at once — it writes the
violation to stderr and exits with status 97 before any more of the check's code runs, so a violation cannot
be caught, hidden or followed by a forged result. What it misses, the kernel layers around this process
(mount, pid, user and network namespaces, seccomp, rlimits) still stop.
"""

import builtins
import json
import os
import sys

# Everything a check may use was imported by the launcher (boundary.PREIMPORTS) before this runs: the guard
# refuses any later import, so a check's `import math` only picks the module from sys.modules.

WORK, INPUT, VIOLATION_EXIT = "/sandbox/work", "/sandbox/in", 97


def make_hook(root, write=os.write, exit_=os._exit, str_=str, bytes_=bytes, int_=int, type_=type):
    # Closure constants and bound builtins only, so patching modules or builtins does not disarm it.
    base = [p for p in root.split("/") if p]
    n = len(base)
    spawn = ("os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system", "subprocess.")
    blocked = ("os.", "socket.", "ctypes.", "resource.", "shutil.", "signal.", "fcntl.", "mmap.", "gc.",
               "_thread.", "sys.settrace", "sys.setprofile", "sys._current_frames", "sys._getframe",
               "sys.addaudithook", "code.__new__", "object.__getattr__", "marshal.", "_imp.")
    # Setting these rewires a function's code or constants; other attribute writes (a class's __module__) are fine.
    rewiring = ("__code__", "__defaults__", "__kwdefaults__", "__closure__", "__globals__", "__dict__", "__class__")
    writes = [0]

    def stop(msg):
        write(2, b"\nsynthloop-sandbox-violation: " + msg.encode("utf-8", "replace")[:400] + b"\n")
        exit_(VIOLATION_EXIT)

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
                    stop("more than 16 files opened for writing")
            if type_(path) is bytes_:
                path = path.decode("utf-8", "surrogateescape")
            if type_(path) is str_:  # anything else (an object with a __repr__) is refused unread
                parts = []
                for part in (path if path[:1] == "/" else root + "/" + path).split("/"):
                    if part == "..":
                        del parts[-1:]
                    elif part and part != ".":
                        parts.append(part)
                if parts[:n] == base:
                    return
                stop("open(" + path + ")")
            stop("open() of a non-path object")
        elif event == "import":  # everything a check may use is pre-imported
            stop("import " + (args[0] if type_(args[0]) is str_ else "?"))
        elif event.startswith(spawn):
            stop("process creation")
        elif event.startswith(blocked):
            stop(event)
        elif event in ("object.__setattr__", "object.__delattr__") and type_(args[1]) is str_ and args[1] in rewiring:
            stop(event + " " + args[1])
    return hook


def describe(exc):
    try:
        text = str(exc)
    except BaseException:
        text = "<unprintable>"
    return (type(exc).__name__ + ": " + text)[:500]


def main(exit_=os._exit):
    with open(INPUT + "/payload.json", encoding="utf-8") as f:
        payload_text = f.read()
    with open(INPUT + "/check.py", encoding="utf-8") as f:
        source = f.read()
    with open(INPUT + "/entrypoint", encoding="utf-8") as f:
        entry, nonce = f.read().split("\n")  # the nonce marks the one genuine result line
    payload = json.loads(payload_text)
    sys.modules.pop("resource", None)  # the launcher needed it; the check may not reuse it
    result_fd = os.dup(1)
    os.dup2(2, 1)  # the check's prints go to stderr, never into the result channel
    write, dumps = os.write, json.dumps
    sys.addaudithook(make_hook(WORK))
    builtins_dict = vars(builtins)
    saved_builtins = dict(builtins_dict)  # the check may patch builtins that json relies on
    ok, error, value_json, ns = False, None, "null", {"__name__": "__check__"}
    try:
        exec(compile(source, "check.py", "exec"), ns)
        fn = ns.get(entry)
        if not callable(fn):
            raise NameError("entrypoint " + repr(entry) + " is not defined")
        value = fn(payload)
        try:
            value_json, ok = dumps(value, allow_nan=False), True
        except (TypeError, ValueError, RecursionError) as exc:
            error = "bad_output: return value is not JSON-serialisable (" + describe(exc) + ")"
    except MemoryError:
        error = "memory_limit: MemoryError"
    except BaseException as exc:
        error = "exception: " + describe(exc)
    ns.clear()
    builtins_dict.update(saved_builtins)
    verdict = "true" if ok else "false"
    data = f'{nonce} {{"ok": {verdict}, "error": {dumps(error)}, "value": {value_json}}}\n'.encode()
    while data:
        data = data[write(result_fd, data):]
    exit_(0)  # no interpreter shutdown: nothing of the check's (atexit, __del__) runs after its result


main()
