"""The boundary untrusted code runs behind: bubblewrap namespaces, seccomp and rlimits (see `boundary`).

`run_check` (one-shot Python checks) and `sandboxed` (any process, e.g. a long-lived tool server on pipes)
are the two ways in; both refuse to run anything where `availability()` says the boundary cannot be built.
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
from sandbox.oneshot import ERROR_KINDS, SandboxLimits, SandboxResult, isolation_report, run_check

__all__ = ["ERROR_KINDS", "INPUT", "ONE_SHOT", "SERVER", "SERVER_ON_LOOPBACK", "SERVER_WITH_PROGRAMS", "WORK", "Availability", "Limits", "Policy", "SandboxLimits",
           "SandboxResult", "SandboxUnavailable", "Spec", "availability", "isolation_report", "pids_cgroup_parent",
           "python_executable",
           "run_check", "sandboxed"]
