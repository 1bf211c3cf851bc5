"""First code inside the sandbox: applies the rlimits, then starts the payload.

Runs as `python -I -S /sandbox/lib/launcher.py SPEC_JSON` inside bubblewrap, which has already loaded the
seccomp filter and set no_new_privs, before anything untrusted. It uses no ctypes, so a one-shot check's
interpreter never holds raw memory access. If a limit cannot be applied it exits with status 98 and runs
nothing. It is never imported by the caller.
"""

import json
import os
import resource
import sys

SETUP_EXIT = 98


def fail(what):
    os.write(2, f"synthloop-sandbox: could not apply {what}\n".encode())
    os._exit(SETUP_EXIT)


def apply_limits(limits, threads):
    wanted = [(resource.RLIMIT_CORE, 0, 0),
              (resource.RLIMIT_CPU, limits["cpu_seconds"], limits["cpu_seconds"] + 1),
              (resource.RLIMIT_FSIZE, limits["file_bytes"], limits["file_bytes"]),
              (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"])]
    if limits["memory_mb"] is not None:  # None: a memory cgroup the caller made bounds all processes together
        wanted.append((resource.RLIMIT_AS, limits["memory_mb"] << 20, limits["memory_mb"] << 20))
    if not threads:  # the kernel counts threads as processes, so this also forbids them
        wanted.append((resource.RLIMIT_NPROC, 0, 0))
    for res, soft, hard in wanted:
        cap = resource.getrlimit(res)[1]
        if cap != resource.RLIM_INFINITY:
            soft, hard = min(soft, cap), min(hard, cap)
        try:
            resource.setrlimit(res, (soft, hard))
        except (OSError, ValueError) as exc:
            fail(f"rlimit {res}: {exc}")


def main():
    spec = json.loads(sys.argv[1])
    apply_limits(spec["limits"], spec["threads"])
    if spec["mode"] == "probe":
        os.write(1, b"ready\n")
        return
    if spec["mode"] == "check":
        for name in spec["preimports"]:
            __import__(name)
        sys.argv[:] = sys.orig_argv[:] = [""]
        path = "/sandbox/lib/check_runner.py"
        with open(path, encoding="utf-8") as f:
            code = compile(f.read(), path, "exec")
        exec(code, {"__name__": "__sandbox_check__"})
        return
    argv = spec["argv"]
    if spec["mode"] == "python":  # a Python program run in this interpreter: no exec needed, no guard added
        sys.argv[:] = argv
        with open(argv[0], encoding="utf-8") as f:
            code = compile(f.read(), argv[0], "exec")
        exec(code, {"__name__": "__main__"})
        return
    try:
        os.execv(argv[0], argv)
    except OSError as exc:
        os.write(2, f"synthloop-sandbox: cannot start {argv[0]}: {exc}\n".encode())
        os._exit(127)


main()
