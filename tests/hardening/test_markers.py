"""A corpus handed over by someone else cannot reach outside its root: its done markers, manifests, lock files
and links are untrusted input.

Attacked through the real entry points (``synthloop compact`` / ``doctor`` as subprocesses, the synthesize
flow and ``flows.repair.repair``, which ``synthloop repair`` runs) on a small real corpus:

* a compacted part's marker and a batch's marker naming a file outside the corpus (absolute, ``../``, a
  ``..`` inside the batch folder): the victim is neither deleted nor read, the marker is one line of
  ``doctor`` (exit 1), and the next run / repair brings back the rows the clean run wrote;
* markers not JSON, with fields missing or of the wrong type: one line, no traceback, repaired;
* a shard that is a symbolic link to a file outside: not followed (doctor names it), replaced by a real file
  on repair, its target untouched; a lock file that is a link: its target is not overwritten;
* a damaged manifest: one line, no traceback;
* an object-store corpus whose remote marker names ``../`` keys: nothing in or outside the mirror is deleted.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from generators.config import SynthesizeConfig
from storage import Corpus
from tests.helpers import REPO, SCRIPTED, free_port, subprocess_env

pytestmark = pytest.mark.slow

CONFIG = SynthesizeConfig(n_tasks=20, batch_size=10, run_name="markertest", agents=SCRIPTED)
RUN = CONFIG.run_id
STAGE = "synthesize"
TABLES = ("tasks", "trajectories", "verdicts", "environments", "tools", "tool_edges")
TIMINGS = ("duration_s", "measured_at", "seconds", "latency_s")
SECRET = b"victim: a file outside the corpus that no corpus file may delete, overwrite or expose\n"


def rows(root: Path, name: str) -> list[str]:
    out = []
    for row in Corpus(root).read(name):
        for key in TIMINGS:
            row.pop(key, None)
        if isinstance(row.get("metadata"), dict):
            row["metadata"].pop("duration_s", None)
        out.append(repr(sorted(row.items())))
    return sorted(out)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=REPO, env=env or subprocess_env(),
                          capture_output=True, text=True, timeout=300)


def lines_naming(result: subprocess.CompletedProcess, what: str) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if what in line]


@pytest.fixture(scope="module")
def clean(prefect_server, tmp_path_factory) -> Path:
    """The uninterrupted run: a catalog batch and two synthesize batches, complete."""
    from flows.synthesize import synthesize

    root = tmp_path_factory.mktemp("clean") / "corpus"
    synthesize(config=CONFIG, corpus_root=str(root))
    return root


@pytest.fixture
def corpus(clean, tmp_path) -> Path:
    root = tmp_path / "corpus"
    shutil.copytree(clean, root)
    return root


def victim_file(tmp_path: Path, data: bytes = SECRET) -> Path:
    path = tmp_path / "victim"
    path.write_bytes(data)
    return path


def reference(kind: str, root: Path, victim: Path, table: str) -> str:
    """How a crafted marker names the victim."""
    if kind == "absolute":
        return str(victim)
    if kind == "dotdot":
        return os.path.relpath(victim, root)  # ../victim
    return f"{table}/run={RUN}/stage={STAGE}/../../../{os.path.relpath(victim, root)}"  # from inside the folder


def marker(root: Path, batch: int) -> dict:
    return json.loads(Corpus(root).marker_path(RUN, STAGE, batch).read_text())


def assert_repaired(root: Path, clean: Path) -> None:
    from flows.repair import repair

    outcome = repair(root)
    assert outcome.failed == {} and not outcome.after.damaged, outcome.lines()
    for name in TABLES:
        assert rows(root, name) == rows(clean, name), name
    done = cli("doctor", "--root", str(root))
    assert done.returncode == 0, done.stdout + done.stderr


def assert_refused(result: subprocess.CompletedProcess, what: str) -> None:
    """``synthloop compact`` refused the run in one line naming the marker (the catalog it rebuilds after may
    log the same damage once more)."""
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr, result.stderr
    assert [line for line in lines_naming(result, what) if line.startswith("synthloop compact: ")], result.stderr


def assert_one_clean_line(result: subprocess.CompletedProcess, what: str) -> None:
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert len(lines_naming(result, what)) == 1, (what, result.stdout + result.stderr)


# --- paths out of the corpus -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["absolute", "dotdot", "through-batch-folder"])
def test_a_crafted_compaction_marker_cannot_delete_a_file_outside_the_corpus(corpus, clean, tmp_path, kind):
    """A part marker over batches whose own markers are intact is dropped as an interrupted compaction gone wrong,
    and compaction used to delete every file it names: here, the victim."""
    victim = victim_file(tmp_path)
    own = [marker(corpus, b) for b in (0, 1)]
    path = Corpus(corpus).part_marker_path(RUN, STAGE, 0)
    path.write_text(json.dumps({
        "version": 2, "kind": "compacted", "batch": 0, "batches": [0, 1], "rows": {"tasks": 20},
        "shards": {"tasks": {"path": reference(kind, corpus, victim, "tasks"), "rows": 20, "bytes": len(SECRET),
                             "sha256": "0" * 64, "mtime_ns": 0}},
        "markers": [{k: v for k, v in m.items() if k != "shards"} for m in own], "finished_at": 1.0,
        "compacted_at": 1.0}))

    compacted = cli("compact", "--corpus", str(corpus))
    assert victim.read_bytes() == SECRET
    assert_refused(compacted, "compact-00000.done.json")
    found = cli("doctor", "--root", str(corpus))
    assert found.returncode == 1 and victim.read_bytes() == SECRET
    assert_one_clean_line(found, "compact-00000.done.json: the done marker is damaged: the shard path of tasks")
    assert_repaired(corpus, clean)
    assert not path.exists() and victim.read_bytes() == SECRET


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "through-batch-folder"])
def test_a_crafted_shard_marker_cannot_read_or_delete_a_file_outside_the_corpus(corpus, clean, tmp_path, kind):
    """The strongest forger: the victim is a Parquet file whose sha256 the marker records (another corpus's
    shard), so it passes the hash; compaction used to fold its rows into the part and then delete it."""
    c = Corpus(corpus)
    victim = victim_file(tmp_path, c.shard_path("tasks", RUN, STAGE, 1).read_bytes())
    data = marker(corpus, 1)
    data["shards"]["tasks"]["path"] = reference(kind, corpus, victim, "tasks")
    c.marker_path(RUN, STAGE, 1).write_text(json.dumps(data))
    before = victim.read_bytes()

    compacted = cli("compact", "--corpus", str(corpus))
    assert victim.read_bytes() == before
    assert_refused(compacted, "batch-00001.done.json")
    found = cli("doctor", "--root", str(corpus))
    assert found.returncode == 1
    assert_one_clean_line(found, "batch-00001.done.json: the done marker is damaged: the shard path of tasks")
    assert len(c.read("tasks")) == 10  # batch 1 is not done: its rows are not read from anywhere
    assert_repaired(corpus, clean)
    assert victim.read_bytes() == before


# --- markers that are not markers ---------------------------------------------------------------------------------

def _drop_sha(m: dict) -> dict:
    del m["shards"]["tasks"]["sha256"]
    return m


def _drop_summary(m: dict) -> dict:
    del m["summary"]
    return m


def _rows_as_text(m: dict) -> dict:
    m["shards"]["verdicts"]["rows"] = "many"
    return m


def _shards_as_list(m: dict) -> dict:
    m["shards"] = ["tasks"]
    return m


DAMAGE = {
    "not-json": (lambda text: text[: len(text) // 2], "not valid JSON"),
    "shard-without-sha256": (lambda text: json.dumps(_drop_sha(json.loads(text))), "'sha256' is missing"),
    "no-summary": (lambda text: json.dumps(_drop_summary(json.loads(text))), "'summary' is missing"),
    "rows-as-text": (lambda text: json.dumps(_rows_as_text(json.loads(text))), "not an integer"),
    "shards-as-list": (lambda text: json.dumps(_shards_as_list(json.loads(text))), "not an object"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_marker_is_one_line_and_the_next_run_redoes_its_batch(corpus, clean, damage):
    from flows.synthesize import synthesize

    path = Corpus(corpus).marker_path(RUN, STAGE, 1)
    edit, words = DAMAGE[damage]
    path.write_text(edit(path.read_text()))

    found = cli("doctor", "--root", str(corpus))
    assert found.returncode == 1
    assert_one_clean_line(found, "batch-00001.done.json")
    assert words in lines_naming(found, "batch-00001.done.json")[0]

    summary = synthesize(config=CONFIG, corpus_root=str(corpus))
    assert summary["tasks"] == 20 and summary["batches_done"] == 2
    for name in TABLES:
        assert rows(corpus, name) == rows(clean, name), name
    assert cli("doctor", "--root", str(corpus)).returncode == 0


def test_a_damaged_manifest_is_one_line_not_a_traceback(corpus):
    path = Corpus(corpus).manifest_path(RUN)
    path.write_text('{"stage": "synthesize", "status": "complete", "batches": {"synthesize": ["../../x"]}')
    found = cli("doctor", "--root", str(corpus))
    assert found.returncode == 1
    assert_one_clean_line(found, "manifest.json: the run's manifest is not valid JSON")
    path.write_text(json.dumps({"stage": "synthesize", "status": "complete", "batches": {"synthesize": ["../../x"]}}))
    found = cli("doctor", "--root", str(corpus))
    assert found.returncode == 1
    assert_one_clean_line(found, "manifest.json: the run's manifest is damaged: a batch number")


# --- links -------------------------------------------------------------------------------------------------------

def test_a_shard_that_is_a_link_out_of_the_corpus_is_not_followed(corpus, clean, tmp_path):
    """The link's target holds the very bytes the marker records, so only refusing the link tells it apart."""
    shard = Corpus(corpus).shard_path("trajectories", RUN, STAGE, 0)
    victim = victim_file(tmp_path, shard.read_bytes())
    before = victim.read_bytes()
    shard.unlink()
    shard.symlink_to(victim)

    found = cli("doctor", "--root", str(corpus))
    assert found.returncode == 1
    assert_one_clean_line(found, "batch-00000.parquet: a symbolic link")
    assert_repaired(corpus, clean)
    assert not shard.is_symlink() and victim.read_bytes() == before


def test_a_lock_file_that_is_a_link_does_not_overwrite_its_target(corpus, tmp_path):
    victim = victim_file(tmp_path)
    lock = corpus / "_locks" / f"{RUN}.lock"
    lock.parent.mkdir(exist_ok=True)
    lock.unlink(missing_ok=True)  # the clean run's own, released
    lock.symlink_to(victim)

    compacted = cli("compact", "--corpus", str(corpus))
    assert compacted.returncode == 0, compacted.stdout + compacted.stderr
    assert victim.read_bytes() == SECRET
    assert not lock.is_symlink()


# --- an object-store corpus ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def moto_endpoint():
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("boto3") is None:
        pytest.skip("moto[server] is not installed: no S3-compatible server to attack the object-store mirror with")
    import socket
    import time

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start on port {port}") from None
                time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}"
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test",
                     aws_secret_access_key="test").create_bucket(Bucket="corpus")
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_remote_marker_naming_keys_out_of_the_prefix_deletes_nothing_from_the_mirror(moto_endpoint, tmp_path,
                                                                                       monkeypatch):
    """The mirror removes its copy of a shard whose object is missing: a remote marker naming ``../`` keys used
    to make it delete that path under the mirror, i.e. anywhere."""
    from storage.object_store import ObjectStore, mirror_root

    env = {"AWS_ENDPOINT_URL": moto_endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_REGION": "us-east-1", "SYNTHLOOP_OBJECT_MIRROR": str(tmp_path / "mirror")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    url = "s3://corpus/crafted"
    victim = victim_file(tmp_path)
    path = os.path.relpath(victim, mirror_root(url))
    shard = {"path": path, "rows": 1, "bytes": len(SECRET), "sha256": "0" * 64, "mtime_ns": 0}
    ObjectStore(url).put("_runs/r-1/synthesize/batch-00000.done.json", json.dumps({
        "version": 2, "batch": 0, "rows": {"tasks": 1}, "shards": {"tasks": shard}, "summary": {},
        "finished_at": 1.0}).encode())

    found = cli("doctor", "--root", url, env=subprocess_env(None, **env))
    assert victim.read_bytes() == SECRET
    assert found.returncode == 1
    assert_one_clean_line(found, "batch-00000.done.json: the done marker is damaged: the shard path of tasks")


def test_a_catalog_that_is_a_link_to_another_database_leaves_that_database_alone(corpus, tmp_path):
    """Every flow rebuilds ``catalog.duckdb`` at its end: through a link it used to write its views into the
    link's target (here, a user's own DuckDB database)."""
    import duckdb

    from flows.synthesize import synthesize

    victim = tmp_path / "mine.duckdb"
    con = duckdb.connect(str(victim))
    con.execute("CREATE TABLE mine AS SELECT 42 AS x")
    con.close()
    before = victim.read_bytes()
    catalog = corpus / "catalog.duckdb"
    catalog.unlink(missing_ok=True)
    catalog.symlink_to(victim)

    synthesize(config=CONFIG, corpus_root=str(corpus))  # every batch done: only the run's chores
    assert victim.read_bytes() == before
    assert not catalog.is_symlink() and catalog.is_file()
    con = duckdb.connect(str(victim), read_only=True)
    assert [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()] == ["mine"]
    assert con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchone()[0] == 0
