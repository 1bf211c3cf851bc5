"""What an MCP server command needs to run in the sandbox: its program, interpreter, scripts and libraries.

:func:`launch` turns a command's program and arguments into the argv run inside (a ``#!`` script through its
interpreter) and the host paths that must be visible read-only (its venv whole, an npm install's ``node_modules``,
the shared libraries its extension modules load). A bare program name is looked up in the reference servers' venvs
(:func:`server_home`) before ``PATH``. Runners that fetch packages when they run (``npx``, ``uvx``) are refused by
``envs.mcp.MCPServer``: the sandbox has no network.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
from pathlib import Path

from envs.mcp_client import MCPError
from sandbox.boundary import Limits, SandboxUnavailable, binary_closure, python_executable


RELAY = Path(__file__).with_name("mcp_relay.py")
WORKDIR = "/sandbox/state"
"""Where the environment's working copy appears inside the sandbox; ``{workdir}`` in a command stands for it."""
SERVER_LIMITS = Limits(cpu_seconds=900, wall_seconds=None, memory_mb=2048, disk_mb=64, file_bytes=256 << 20,
                       open_files=256)
"""Limits of one server process: CPU over its whole life, address space (threads reserve stacks and arenas),
its private tmpfs, the largest file it may write in its working copy, descriptors."""
GIT_DEFAULTS = {"GIT_AUTHOR_NAME": "synthloop", "GIT_AUTHOR_EMAIL": "synthloop@localhost",
                "GIT_COMMITTER_NAME": "synthloop", "GIT_COMMITTER_EMAIL": "synthloop@localhost",
                "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
                "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}


# --- what a server needs to see -----------------------------------------------------------------------------------


def server_home() -> Path:
    """Where ``scripts/mcp-servers.sh`` puts one venv per reference server (``$SYNTHLOOP_MCP_HOME`` overrides);
    a bare command is looked up there first, the newest version first."""
    return Path(os.environ.get("SYNTHLOOP_MCP_HOME") or Path.home() / ".cache" / "synthloop" / "mcp")


def find_executable(name: str) -> str | None:
    if "/" in name:
        return os.path.abspath(name) if os.path.isfile(name) else None
    for candidate in sorted(glob.glob(str(server_home() / "*" / "bin" / name)), reverse=True):
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which(name)


def libraries_of(extensions: list[str] | tuple[str, ...]) -> list[str]:
    """The shared libraries extension modules load (not the modules themselves), to be made visible."""
    out: list[str] = []
    for so in extensions:
        with contextlib.suppress(SandboxUnavailable):  # an extension module that cannot load here anyway
            out += binary_closure(so)[1:]
    return out


def _link_chain(path: str) -> list[str]:
    """Every path a symlink chain passes through (``venv/bin/python`` → ``…/python3`` → ``…/python3.11``)."""
    chain = [os.path.abspath(path)]
    while os.path.islink(chain[-1]) and len(chain) < 40:
        chain.append(os.path.normpath(os.path.join(os.path.dirname(chain[-1]), os.readlink(chain[-1]))))
    return chain


_INTERPRETERS = re.compile(r"^(node|nodejs|python[0-9.]*|pypy[0-9.]*|bun|deno)$")
NETWORK_RUNNERS = ("npx", "uvx", "pipx", "bunx")


def _script_arguments(executable: str, args: list[str]) -> tuple[list[str], list[str]]:
    """The arguments with an interpreter's script made absolute (``node dist/index.js`` is run from the sandbox's
    own folder, where a relative path names nothing), and the scripts so found. Only the first word that is not an
    option, and only for an interpreter (node, python, bun, deno): other arguments are the server's own business."""
    if not _INTERPRETERS.match(os.path.basename(executable)):
        return args, []
    out = list(args)
    for i, arg in enumerate(out):
        if arg.startswith("-"):
            if arg in ("-m", "-c", "-e", "--eval", "-p", "--print"):  # a module or code, not a file
                return out, []
            continue
        if "{workdir}" in arg or not os.path.isfile(arg):
            return out, []
        out[i] = os.path.abspath(arg)
        return out, [out[i]]
    return out, []


def _script_paths(script: str) -> list[str]:
    """What a script needs to be seen inside, read-only: the links on the way to it, its package (the nearest
    folder above it with a ``package.json`` or ``pyproject.toml``, else its own folder) and every ``node_modules``
    folder Node.js would look in from there (``…/node_modules`` of each folder above it, as an npm workspace
    hoists them)."""
    out = _link_chain(script)
    real = os.path.realpath(script)
    parts = real.split(os.sep)
    if "node_modules" in parts:  # an installed package: the whole tree it imports from
        out.append(os.sep.join(parts[:parts.index("node_modules") + 1]))
        return out
    folder = os.path.dirname(real)
    package = folder
    for up in [folder, *Path(folder).parents]:
        up = str(up)
        if up in ("/", os.path.expanduser("~")) or up == str(Path.home()):
            break
        if any(os.path.isfile(os.path.join(up, marker)) for marker in ("package.json", "pyproject.toml")):
            package = up
            break
    out.append(package)
    for up in [package, *map(str, Path(package).parents)]:
        candidate = os.path.join(up, "node_modules")
        if os.path.isdir(candidate):
            out.append(candidate)
    return out


def _venv_of(path: str) -> str | None:
    folder = os.path.dirname(os.path.abspath(path))
    for up in (folder, os.path.dirname(folder)):
        if os.path.isfile(os.path.join(up, "pyvenv.cfg")):
            return up
    return None




def launch(executable: str, args: list[str]) -> tuple[list[str], list[str]]:
    """The argv run inside (a script is run through its interpreter) and the host paths it needs to see."""
    with open(executable, "rb") as f:
        head = f.read(256)
    visible = [executable]
    args, scripts = _script_arguments(executable, args)
    for script in scripts:
        visible += _script_paths(script)
    argv = [executable, *args]
    if head.startswith(b"#!"):
        words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
        if words and os.path.basename(words[0]) == "env" and len(words) > 1:
            words = [shutil.which(words[1]) or words[1], *words[2:]]
        if not words or not os.path.isfile(words[0]):
            raise MCPError(f"MCP server `{executable}`: its interpreter {words[:1]} is not found")
        argv = [*words, executable, *args]
        visible += [words[0], *binary_closure(os.path.realpath(words[0]))]
        # a script from an npm install (bin/x → node_modules/pkg/dist/index.js): the links to it and the whole
        # node_modules tree it imports from, read-only
        visible += _script_paths(executable)
    else:
        visible += binary_closure(executable)
    venv = _venv_of(argv[0])
    if venv is not None:
        # the venv is bound whole; what its links point to outside it is exposed link by link
        inside = lambda p: p == venv or p.startswith(venv + "/")  # noqa: E731
        visible = [p for p in visible if not inside(p)] + [venv]
        visible += [p for p in _link_chain(argv[0]) if not inside(p)]
        base = os.path.realpath(argv[0])
        if base != python_executable():  # a venv on another interpreter: its standard library too
            prefix = os.path.dirname(os.path.dirname(base))
            visible += glob.glob(os.path.join(prefix, "lib", "python3*"))
        prefix = os.path.dirname(os.path.dirname(base))
        extensions = (*glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "**", "*.so*"),
                                 recursive=True),
                      *glob.glob(os.path.join(prefix, "lib", "python3*", "lib-dynload", "*.so")))
        visible += libraries_of(extensions)
    return argv, visible
