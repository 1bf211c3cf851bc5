"""First code inside the sandbox: applies the kernel limits and the seccomp filter, then starts the payload.

Runs as `python -I -S /sandbox/lib/launcher.py SPEC_JSON` inside bubblewrap, before anything untrusted, using
only the standard library. If any layer cannot be applied it exits with status 98 and runs nothing.
It is never imported by the caller.
"""

import ctypes
import json
import os
import resource
import sys

SETUP_EXIT = 98
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def fail(what):
    os.write(2, f"synthloop-sandbox: could not apply {what}\n".encode())
    os._exit(SETUP_EXIT)


def apply_limits(limits, threads):
    wanted = [(resource.RLIMIT_CORE, 0, 0),
              (resource.RLIMIT_CPU, limits["cpu_seconds"], limits["cpu_seconds"] + 1),
              (resource.RLIMIT_AS, limits["memory_mb"] << 20, limits["memory_mb"] << 20),
              (resource.RLIMIT_FSIZE, limits["file_bytes"], limits["file_bytes"]),
              (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"])]
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


def apply_seccomp(path):
    with open(path, "rb") as f:
        program = f.read()
    if not program or len(program) % 8:
        fail("seccomp: empty or malformed filter")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        fail(f"no_new_privs: errno {ctypes.get_errno()}")
    buf = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.addressof(buf))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        fail(f"seccomp: errno {ctypes.get_errno()}")


def main():
    spec = json.loads(sys.argv[1])
    apply_limits(spec["limits"], spec["threads"])
    apply_seccomp(spec["seccomp"])
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
