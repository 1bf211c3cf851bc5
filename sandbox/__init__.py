"""The boundary untrusted code runs behind: bubblewrap namespaces, seccomp and rlimits (see `boundary`).

`run_check` (one-shot Python checks) and `sandboxed` (any process, e.g. a long-lived tool server on pipes)
are the two ways in; both refuse to run anything where `availability()` says the boundary cannot be built.
`sandbox.files` is the other side of it: how this process reads a user's files (a plugin's package, a state
folder, a catalog) to hash or parse them, streamed and capped, without following links out of them.
"""

from sandbox.boundary import (
    INPUT,
    ONE_SHOT,
    SERVER,
    SERVER_ON_LOOPBACK,
    SERVER_WITH_PROGRAMS,
    WORK,
    Availability,
    Limits,
    Policy,
    SandboxUnavailable,
    Spec,
    availability,
    pids_cgroup_parent,
    python_executable,
    sandboxed,
)
from sandbox.files import FileCaps, FileRefused, hash_tree, read_capped, size_text
from sandbox.oneshot import ERROR_KINDS, SandboxLimits, SandboxResult, isolation_report, run_check

__all__ = [
    "ERROR_KINDS", "INPUT", "ONE_SHOT", "SERVER", "SERVER_ON_LOOPBACK", "SERVER_WITH_PROGRAMS", "WORK",
    "Availability", "FileCaps", "FileRefused", "Limits", "Policy", "SandboxLimits", "SandboxResult",
    "SandboxUnavailable", "Spec", "availability", "hash_tree", "isolation_report", "pids_cgroup_parent",
    "python_executable", "read_capped", "run_check", "sandboxed", "size_text",
]
