"""Control groups for sandboxes that may start processes: how many tasks, and how much memory, all of them together.

A server that runs programs per call (`mcp-server-git` runs `git`) cannot be bounded by rlimits alone: root's
processes are exempt from RLIMIT_NPROC, and RLIMIT_AS is per process (and wrong for runtimes such as V8, which
reserve far more address space than they use). Each such sandbox gets cgroups of its own, made by the caller before
bwrap starts and joined by bwrap's own process (`join_command`), so everything inside is counted from the start:

- a **pids** cgroup whose `pids.max` bounds processes and threads together (a fork bomb stops at it); required:
  where none can be made here, `SandboxUnavailable` says what would provide one;
- a **memory** cgroup capping their resident memory together at `Limits.memory_mb`, where one can be made; the
  per-process address-space limit is then lifted, since the cgroup is the real bound.

The sandbox sees no cgroup file system (bwrap's new cgroup namespace, no mount of it, mounts forbidden by seccomp),
so it cannot leave its groups. On exit every task left in them is killed and the groups are removed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

PIDS_ENV = "SYNTHLOOP_PIDS_CGROUP"
"""A writable cgroup folder with the pids controller to use instead of the one found (a delegated subtree)."""
_names = iter(range(1 << 62))


class NoCgroup(RuntimeError):
    """No pids cgroup can be made here; the message says why and what would provide one."""


def _candidates(controller: str) -> list[str]:
    """Folders where this process may make child cgroups of `controller`: its own cgroup in a v1 hierarchy of that
    controller (a `synthloop` folder under it), or its v2 cgroup where that delegates the controller."""
    own: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            own.update({c: path for c in controllers.split(",")} if controllers else {"": path})
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fstype, _, options = (right.split(" ") + ["", "", ""])[:3]
            point = left.split(" ")[4]
            if fstype == "cgroup" and controller in options.split(",") and controller in own:
                found.append(os.path.join(point, own[controller].lstrip("/"), "synthloop"))
            elif fstype == "cgroup2" and "" in own:
                folder = os.path.join(point, own[""].lstrip("/"))
                with contextlib.suppress(OSError):
                    if controller in Path(folder, "cgroup.subtree_control").read_text().split():
                        found.append(folder)
    return found


def _try(parent: str, knob: str, value: str) -> None:
    """Raises OSError unless a child cgroup can be made under `parent` and its `knob` set."""
    os.makedirs(parent, exist_ok=True)
    probe = os.path.join(parent, f"probe-{os.getpid()}")
    os.mkdir(probe)
    try:
        Path(probe, knob).write_text(value)
    finally:
        os.rmdir(probe)


@functools.lru_cache(maxsize=4)
def _pids_parent(override: str | None) -> str:
    problems = []
    for parent in [override] if override else _candidates("pids"):
        try:
            _try(parent, "pids.max", "1\n")
            return parent
        except OSError as exc:
            problems.append(f"{parent}: {exc.strerror or exc}")
    where = "; ".join(problems) or "no pids cgroup hierarchy is mounted or delegated to this process"
    raise NoCgroup(f"this server may start processes, which the sandbox bounds with a pids cgroup of its own, and "
                   f"none can be made here ({where}); run as root with cgroup v1's pids controller, or delegate one "
                   f"(systemd-run --user -p Delegate=yes, or set {PIDS_ENV} to a writable cgroup folder with the pids "
                   f"controller)")


def pids_parent() -> str:
    """Where per-sandbox pids cgroups are made here (tried once per setting of `PIDS_ENV`).

    Raises:
        NoCgroup: none can be made on this machine.
    """
    return _pids_parent(os.environ.get(PIDS_ENV) or None)


@functools.lru_cache(maxsize=1)
def memory_parent() -> str | None:
    """Where per-sandbox memory cgroups are made here; None where none can be (address space stays per process)."""
    for parent in _candidates("memory"):
        v1 = not os.path.exists(os.path.join(os.path.dirname(parent), "cgroup.controllers"))
        with contextlib.suppress(OSError):
            _try(parent, "memory.limit_in_bytes" if v1 else "memory.max", "67108864\n")
            return parent
    return None


def _remove(group: str) -> None:
    for _ in range(200):
        try:
            tasks = Path(group, "cgroup.procs").read_text().split()
        except OSError:
            return
        for pid in tasks:
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        try:
            os.rmdir(group)
            return
        except OSError:  # tasks still exiting
            time.sleep(0.01)


@contextlib.contextmanager
def groups(processes: int, memory_mb: int) -> Iterator[list[str]]:
    """Fresh cgroups for one sandbox: pids (at most `processes` tasks), then memory (`memory_mb`) where possible.

    Raises:
        NoCgroup: no pids cgroup can be made here.
    """
    name = f"{os.getpid()}-{next(_names)}"
    made: list[str] = []
    try:
        pids = os.path.join(pids_parent(), name)
        os.mkdir(pids)
        made.append(pids)
        Path(pids, "pids.max").write_text(f"{processes}\n")
        parent = memory_parent()
        if parent is not None:
            memory = os.path.join(parent, name)
            os.mkdir(memory)
            made.append(memory)
            cap = f"{memory_mb << 20}\n"
            if os.path.exists(os.path.join(memory, "memory.limit_in_bytes")):  # cgroup v1
                Path(memory, "memory.limit_in_bytes").write_text(cap)
                with contextlib.suppress(OSError):  # swap too, where the kernel accounts it
                    Path(memory, "memory.memsw.limit_in_bytes").write_text(cap)
            else:
                Path(memory, "memory.max").write_text(cap)
                with contextlib.suppress(OSError):
                    Path(memory, "memory.swap.max").write_text("0\n")
        yield made
    finally:
        for group in reversed(made):
            _remove(group)


def join_command(made: list[str]) -> list[str]:
    """A prefix for bwrap's argv: a shell that moves itself into each group, then execs the rest."""
    join = " && ".join(f'echo $$ > "${i}/cgroup.procs"' for i in range(1, len(made) + 1))
    return ["/bin/sh", "-c", f'{join} || exit 98; shift {len(made)}; exec "$@"', "sh", *made]
