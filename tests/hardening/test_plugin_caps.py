"""What a hostile plugin package, state folder or catalog can make this process read, and what a plugin's
worker can make it hold, is capped.

* A sparse 20 GB file in a plugin's package (or a state folder, or as a catalog) is refused in well under a
  second from its size, with one line naming the file and the cap, and no ``MemoryError``.
* A symbolic link in a package or a state folder to a host secret (or ``/dev/zero``) is never read: the
  secret's content changes nothing, not even the hash.
* A worker that answers ~240 MB (under the old cap of 256 MB) or streams forever is stopped at the cap while
  it is read; this process's peak RSS stays under 1 GB, the call fails with one clear line, and the next
  environment of the same source works. A worker that floods its stderr costs nothing either.

Each attack runs in a child process (``bounded``) whose address space is capped at 3 GB, so that the code
before these caps (which read 20 GB into memory) fails there with ``MemoryError`` instead of taking the
machine; its peak RSS is what the assertion reads.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from sandbox import availability
from tests.helpers import REPO

pytestmark = pytest.mark.skipif(not availability().ok and not os.environ.get("CI"),
                                reason=f"no sandbox here: {availability().reason}")

GB = 1 << 30
SPARSE = 20 * GB


def bounded(code: str, *, address_space: int = 3 * GB, timeout: float = 120) -> dict:
    """Runs ``code`` (which sets ``result``, a dict) in a fresh interpreter on this checkout; returns ``result``
    with ``error`` (the exception's type and message, if one escaped), ``seconds`` and the peak RSS in MB."""
    body = textwrap.indent(textwrap.dedent(code).strip("\n"), "    ")
    program = "\n".join([
        "import json, resource, sys, time",
        "def peak_rss_mb():",
        "    with open('/proc/self/status') as f:",
        "        return next(int(l.split()[1]) for l in f if l.startswith('VmHWM:')) / 1024",
        "result = {}",
        "start = time.monotonic()",
        "try:",
        body,
        "except BaseException as exc:",
        "    result['error'] = f'{type(exc).__name__}: {exc}'",
        "result['seconds'] = time.monotonic() - start",
        # VmHWM, not ru_maxrss: a forked child's ru_maxrss starts at its parent's RSS (pytest's, over 1 GB late in
        # a full run), while VmHWM belongs to the image exec started
        "result['peak_rss_mb'] = peak_rss_mb()",
        "print('RESULT ' + json.dumps(result, default=str))",
    ])

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limit, cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the child died (exit {done.returncode}): {done.stderr[-2000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


def package(tmp_path: Path, tools: str = "") -> tuple[str, Path, Path]:
    """A one-table plugin package under ``tmp_path/site``: its ref, its search-path folder and its folder."""
    name = f"caps_{uuid.uuid4().hex[:10]}"
    root = tmp_path / "site"
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    body = textwrap.dedent('''\
        import os, stat
        from envs import Domain, tool


        def channel():
            """The worker's answer pipe: the pipe that is neither its stdin nor its stderr."""
            others = {os.fstat(0).st_ino, os.fstat(2).st_ino}
            for fd in range(3, 64):
                try:
                    st = os.fstat(fd)
                except OSError:
                    continue
                if stat.S_ISFIFO(st.st_mode) and st.st_ino not in others:
                    return fd


        class Shop(Domain):
            name = "shop"
            description = "A test shop."
            schema_sql = "CREATE TABLE items (item_id TEXT PRIMARY KEY, n INTEGER NOT NULL);"
            arg_sources = {"item_id": "SELECT item_id FROM items"}

            @classmethod
            def populate(cls, db, rng):
                db.execute("INSERT INTO items VALUES ('I0001', 1)")

            @tool(mutates=False, phrase="check item {item_id}", answer="n")
            def get_item(self, item_id: str) -> dict:
                """Get an item.

                Args:
                    item_id: The item id, e.g. "I0001".
                """
                return self.one("SELECT * FROM items WHERE item_id = ?", item_id, missing="Item not found")
        ''')
    (folder / "mod.py").write_text(body + textwrap.indent(textwrap.dedent(tools), "    "))
    return f"{name}.mod:Shop", root, folder


# --- what the host reads of a user's files ---------------------------------------------------------------------


def test_a_sparse_20_gb_file_in_a_plugin_package_is_refused_at_once(tmp_path):
    ref, root, folder = package(tmp_path)
    with open(folder / "weights.bin", "wb") as f:
        f.truncate(SPARSE)  # 20 GB on paper, no block on disk
    out = bounded(f'''
        from generators.config import EnvironmentSource
        from generators.sources import content_hash, open_source
        source = EnvironmentSource(kind="module", ref={ref!r}, path={str(root)!r})
        for attempt in (content_hash, open_source):
            try:
                attempt(source)
                result[attempt.__name__] = "accepted"
            except Exception as exc:
                result[attempt.__name__] = f"{{type(exc).__name__}}: {{exc}}"
        ''')
    assert "error" not in out, out  # no MemoryError, nothing escaped
    for refusal in (out["content_hash"], out["open_source"]):
        assert refusal.startswith(f"SourceError: module {ref}: {folder / 'weights.bin'}: 20 GiB"), out
        assert "over the cap of 64 MiB for one file of" in refusal and "\n" not in refusal
    assert out["seconds"] < 5 and out["peak_rss_mb"] < 1024


def test_a_plugin_package_over_its_caps_in_files_or_depth_is_refused(tmp_path):
    from envs.plugin import content_hash
    from envs.registry import resolve_domain
    from sandbox import FileCaps, FileRefused

    ref, root, folder = package(tmp_path)
    deep = folder
    for i in range(5):
        deep = deep / f"d{i}"
    deep.mkdir(parents=True)
    source = resolve_domain(ref, search_path=[str(root)])
    with pytest.raises(FileRefused, match=r"5 folders deep in plugin .*, over the cap of 4"):
        content_hash(source.location, FileCaps(depth=4))
    with pytest.raises(FileRefused, match=r"holds more than 3 entries, the cap"):
        content_hash(source.location, FileCaps(files=3))


def test_a_link_in_a_plugin_package_or_state_folder_to_a_host_secret_is_never_read(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    ref, root, folder = package(tmp_path)
    (folder / "leak.txt").symlink_to(secret)
    (folder / "zero").symlink_to("/dev/zero")
    state = tmp_path / "state"
    state.mkdir()
    (state / "data.json").write_text("{}")
    (state / "leak.txt").symlink_to(secret)
    code = f'''
        from generators.config import EnvironmentSource
        from generators.sources import content_hash
        result["module"] = content_hash(EnvironmentSource(kind="module", ref={ref!r}, path={str(root)!r}))
        result["state"] = content_hash(EnvironmentSource(kind="mcp", ref="server", state={str(state)!r}))
        '''
    first = bounded(code)
    assert "error" not in first, first
    secret.write_text("correct horse battery staple")  # the secret changes: nothing read of it may change
    second = bounded(code)
    assert (second["module"], second["state"]) == (first["module"], first["state"])
    assert first["seconds"] < 5


def test_a_sparse_or_endless_catalog_or_state_file_is_refused_at_once(tmp_path):
    catalog = tmp_path / "tools.json"
    with open(catalog, "wb") as f:
        f.truncate(SPARSE)
    state = tmp_path / "state"
    state.mkdir()
    with open(state / "huge.db", "wb") as f:
        f.truncate(SPARSE)
    out = bounded(f'''
        from generators.catalog import import_catalog
        from generators.config import EnvironmentSource
        from generators.sources import content_hash
        for name, attempt in (("sparse", lambda: import_catalog({str(catalog)!r})),
                              ("zero", lambda: import_catalog("/dev/zero")),
                              ("state", lambda: content_hash(EnvironmentSource(kind="mcp", ref="server",
                                                                               state={str(state)!r})))):
            try:
                attempt()
                result[name] = "accepted"
            except Exception as exc:
                result[name] = f"{{type(exc).__name__}}: {{exc}}"
        ''', timeout=60)
    assert "error" not in out, out
    assert out["sparse"].startswith("CatalogError: tools.json: 20 GiB (21,474,836,480 bytes)"), out
    assert "over the cap of 64 MiB for a catalog file" in out["sparse"]
    assert out["zero"] == ("CatalogError: zero: cannot be read: it is a character device, not a regular file; "
                           "give a file"), out
    assert out["state"].startswith(f"SourceError: mcp 'server': {state / 'huge.db'}: 20 GiB"), out
    assert "over the cap of 1 GiB for one file of the state folder" in out["state"]
    assert out["seconds"] < 5 and out["peak_rss_mb"] < 1024


# --- what a plugin's worker can make the host hold -----------------------------------------------------------


FLOODS = '''
    @tool(mutates=False, phrase="big", answer=None)
    def big(self) -> dict:
        """Answer ~240 MB of valid JSON on the answer pipe, in 1 MB writes (the worker's memory stays small)."""
        fd = channel()
        os.write(fd, b'{"id": 2, "ok": true, "value": "')
        chunk = b"x" * (1 << 20)
        for _ in range(240):
            os.write(fd, chunk)
        os.write(fd, b'"}\\n')
        return {}

    @tool(mutates=False, phrase="endless", answer=None)
    def endless(self) -> dict:
        """Stream on the answer pipe and never end the line."""
        fd = channel()
        chunk = b"[" * (1 << 20)
        while True:
            os.write(fd, chunk)

    @tool(mutates=False, phrase="shout", answer=None)
    def shout(self) -> dict:
        """Write 2 GB to stderr, then answer."""
        chunk = b"e" * (1 << 20)
        for _ in range(2048):
            os.write(2, chunk)
        return {"ok": True}
'''


@pytest.mark.slow
def test_a_huge_or_endless_answer_is_cut_at_the_cap_and_the_next_environment_works(tmp_path):
    ref, root, _ = package(tmp_path, FLOODS)
    out = bounded(f'''
        from envs.plugin import PluginError
        from envs.registry import resolve_domain
        source = resolve_domain({ref!r}, search_path=[{str(root)!r}])
        env = source.open(0)
        result["before_mb"] = peak_rss_mb()
        for tool in ("big", "endless"):
            t0 = time.monotonic()
            try:
                result[tool] = env.execute(tool, {{}})
            except PluginError as exc:
                result[tool] = str(exc)
            result[tool + "_s"] = time.monotonic() - t0
            try:
                env.state_hash()
                result[tool + "_old_env"] = "answered"
            except PluginError as exc:
                result[tool + "_old_env"] = str(exc)
            env = source.open(0)  # a new environment of the same source: a fresh worker
            result[tool + "_next"] = env.execute("get_item", {{"item_id": "I0001"}})
        result["shout"] = env.execute("shout", {{}})
        source.close()
        ''', timeout=300)
    assert "error" not in out, out
    cap = f"plugin {ref}: answer to execute exceeds {16 << 20} bytes: it answered {(16 << 20) + 1:,}+ bytes, " \
          "over the cap of 16 MiB (PluginLimits.max_answer_bytes); worker killed, the next request starts a new one"
    assert out["big"] == cap and out["endless"] == cap, out
    for tool in ("big", "endless"):
        assert out[tool + "_old_env"].startswith(f"plugin {ref}: this environment was lost with the worker"), out
        assert out[tool + "_next"] == [{"item_id": "I0001", "n": 1}, None], out
        assert out[tool + "_s"] < 10
    assert out["shout"] == [{"ok": True}, None]
    assert out["peak_rss_mb"] < 1024, out  # before the cap: ~1.3 GB for the 240 MB answer
