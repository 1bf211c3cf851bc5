"""A corpus root on S3-compatible object storage, against a real S3 server over HTTP: moto's server mode in its
own process on a loopback port (never the in-process mock). The commit protocol is ``storage.object_store``'s:
shards, then the done marker as the commit point; a local mirror verified by sha256; conditional-PUT locks."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time

import pytest

from storage import Corpus
from storage.locks import lock_path
from storage.object_store import ObjectRunLock, ObjectStore, diagnose_objects
from tests.helpers import REPO, free_port, subprocess_env

BUCKET = "corpus"
ARGS = ["--n-tasks", "40", "--batch-size", "20", "--run-name", "s3test", "--domains", "retail", "--llm-tasks", "0"]
TABLES = ("tasks", "trajectories", "verdicts")


@pytest.fixture(scope="module")
def moto_endpoint():
    """A moto S3 server (``python -m moto.server``) on a free loopback port, with one empty bucket."""
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("boto3") is None:
        pytest.skip("moto[server] is not installed: no S3-compatible server to test the object-store corpus against")
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
                     aws_secret_access_key="test").create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def aws_env(endpoint: str, mirror) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1", "SYNTHLOOP_OBJECT_MIRROR": str(mirror)}


@pytest.fixture
def s3(moto_endpoint, tmp_path, monkeypatch):
    """This process pointed at the moto server, with a fresh mirror folder."""
    env = aws_env(moto_endpoint, tmp_path / "mirror")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def synthesize(root: str, env: dict[str, str], prefect_server: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", "synthesize", *ARGS, "--corpus", root], cwd=REPO,
                          env=subprocess_env(prefect_server, **env), capture_output=True, text=True, timeout=300)


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=REPO, env=subprocess_env(None, **env),
                          capture_output=True, text=True, timeout=120)


def rows(corpus: Corpus, table: str) -> list[dict]:
    out = corpus.read(table)
    for row in out:  # wall-clock timings differ between runs
        row.pop("duration_s", None)
        row.get("metadata", {}).pop("duration_s", None)
    key = {"verdicts": "verdict_id", "trajectories": "trajectory_id"}.get(table, "task_id")
    return sorted(out, key=lambda r: r[key])


@pytest.fixture(scope="module")
def written(moto_endpoint, prefect_server, tmp_path_factory):
    """The same small synthesize config run once to a local folder and once to s3://corpus/base."""
    tmp = tmp_path_factory.mktemp("s3-written")
    env = aws_env(moto_endpoint, tmp / "writer-mirror")
    local = tmp / "local"
    runs = [subprocess.Popen([sys.executable, "-m", "flows.cli", "synthesize", *ARGS, "--corpus", root], cwd=REPO,
                             env=subprocess_env(prefect_server, **env), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
            for root in (str(local), f"s3://{BUCKET}/base")]  # side by side: the slowest part of this file
    for run in runs:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-3000:]
    return local


def clone(prefix: str) -> str:
    """A server-side copy of s3://corpus/base under ``prefix`` (so a test may damage its own)."""
    src, dst = ObjectStore(f"s3://{BUCKET}/base"), ObjectStore(f"s3://{BUCKET}/{prefix}")
    for key in src.list():
        dst.fs.copy_file(src.path(key), dst.path(key))
    return dst.url


def run_id(corpus: Corpus) -> str:
    return next(r for r in corpus.runs() if corpus.manifest(r).get("stage") == "synthesize")


pytestmark = pytest.mark.slow


def test_synthesize_to_s3_reads_back_the_local_rows(written, s3):
    url = f"s3://{BUCKET}/base"
    store = ObjectStore(url)
    keys = store.list()
    assert any(k.startswith("tasks/run=") for k in keys) and any(k.endswith(".done.json") for k in keys)
    assert not any(k.startswith("_locks/") for k in keys), "a finished run leaves no lock object"
    remote, local = Corpus(url), Corpus(written)
    assert remote.location == url and remote.root.is_relative_to(s3["SYNTHLOOP_OBJECT_MIRROR"])
    rid = run_id(remote)
    assert rid == run_id(local) and remote.manifest(rid)["status"] == "complete"
    for table in TABLES:
        got, want = rows(remote, table), rows(local, table)
        assert got == want and len(got) > 0, table
    # every committed marker names its objects' sha256 and the size and LastModified the server reported
    marker = json.loads(store.get(f"_runs/{rid}/synthesize/batch-00001.done.json"))
    assert set(marker["objects"]) == set(marker["shards"])
    for table, shard in marker["shards"].items():
        assert keys[shard["path"]][0] == shard["bytes"] == marker["objects"][table]["bytes"]
    query = cli(["query", "--corpus", url, "--format", "json",
                 "SELECT count(*) AS n, count(DISTINCT task_id) AS d FROM tasks"], s3)
    assert query.returncode == 0, query.stderr
    assert json.loads(query.stdout) == {"n": 40, "d": 40}
    doctor = cli(["doctor", "--root", url], s3)
    assert doctor.returncode == 0 and "no damage found" in doctor.stdout, doctor.stdout + doctor.stderr


def test_a_batch_without_its_marker_is_unseen_reported_and_redone_without_duplicates(written, s3, prefect_server):
    url = clone("no-marker")
    store = ObjectStore(url)
    rid = run_id(Corpus(url))
    marker = f"_runs/{rid}/synthesize/batch-00001.done.json"
    orphans = sorted(s["path"] for s in json.loads(store.get(marker))["shards"].values())
    store.delete(marker)  # as if the writer died after its shards' PUTs, before the marker's

    corpus = Corpus(url)
    assert not corpus.batch_done(rid, "synthesize", 1) and corpus.batch_done(rid, "synthesize", 0)
    assert len(corpus.read("tasks")) == 20, "a reader sees only committed batches"
    lines, damaged = diagnose_objects(corpus)
    assert damaged  # the complete run lists batch 1
    assert any(line.startswith(f"DAMAGED {url}/{marker}") for line in lines), lines
    for key in orphans:
        assert f"ORPHAN {url}/{key}: no done marker lists this object" in "\n".join(lines)

    again = synthesize(url, s3, prefect_server)
    assert again.returncode == 0, again.stderr[-3000:]
    assert store.info(marker) is not None
    corpus = Corpus(url)
    assert corpus.batch_done(rid, "synthesize", 1)
    tasks = rows(corpus, "tasks")
    assert len(tasks) == 40 == len({t["task_id"] for t in tasks})
    for table in TABLES:
        assert rows(corpus, table) == rows(Corpus(written), table), table
    lines, damaged = diagnose_objects(corpus)
    assert not damaged and lines[-1] == "no damage found", lines  # the orphans were overwritten and committed


def test_an_overwritten_object_is_named_by_doctor_and_its_batch_is_not_done(written, s3):
    url = clone("damaged")
    store = ObjectStore(url)
    warm = Corpus(url)  # the mirror holds verified copies of every shard
    rid = run_id(warm)
    key = json.loads(store.get(f"_runs/{rid}/synthesize/batch-00000.done.json"))["shards"]["trajectories"]["path"]
    data = bytearray(store.get(key))
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    time.sleep(1.1)  # LastModified has one-second resolution
    store.put(key, bytes(data))

    doctor = cli(["doctor", "--root", url], s3)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    line = next(x for x in doctor.stdout.splitlines() if x.startswith("DAMAGED"))
    assert line.startswith(f"DAMAGED {url}/{key}: its content differs from what was committed")
    assert f"batch 0 (stage synthesize) of run {rid}" in line
    # a reader with a warm mirror notices too: the object moved since its commit and no longer hashes as recorded
    corpus = Corpus(url)
    assert not corpus.batch_done(rid, "synthesize", 0) and corpus.batch_done(rid, "synthesize", 1)
    assert [p.url for p in corpus.pull_problems] == [f"{url}/{key}"]
    assert len(corpus.read("tasks")) == 20


def test_a_crash_between_shards_and_marker_leaves_an_orphan_never_a_half_batch(s3):
    url = f"s3://{BUCKET}/crash"
    corpus = Corpus(url)
    table = {"environments": []}
    corpus.write_batch("r1", "synthesize", 0, table, {"n": 0})
    assert Corpus(url).batch_done("r1", "synthesize", 0)

    real_put = corpus.store.put

    def put(key: str, data: bytes) -> None:
        if key.endswith(".done.json"):
            raise OSError("killed before the commit")
        real_put(key, data)

    corpus.store.put = put  # the store is real; only the marker's PUT is cut off, as a kill would
    with pytest.raises(OSError, match="killed before the commit"):
        corpus.write_batch("r1", "synthesize", 0, table, {"n": 1})
    fresh = Corpus(url)
    assert not fresh.batch_done("r1", "synthesize", 0), "the old marker is gone: the batch is being rewritten"
    assert not (fresh.root / "_runs/r1/synthesize/batch-00000.done.json").exists()
    lines, _ = diagnose_objects(fresh)
    assert any(x.startswith(f"ORPHAN {url}/environments/run=r1/stage=synthesize/batch-00000.parquet") for x in lines)


def test_run_lock_is_a_conditional_put(s3, tmp_path):
    store = ObjectStore(f"s3://{BUCKET}/locks")
    first = ObjectRunLock(store, tmp_path / "a.lock", "run-x", {"run": "run-x"})
    second = ObjectRunLock(store, tmp_path / "b.lock", "run-x", {"run": "run-x"})  # as from another machine
    first.acquire()
    try:
        holder = json.loads(store.get("_locks/run-x.lock"))
        assert holder["pid"] == first.record["pid"] and holder["run"] == "run-x"
        told = []
        with pytest.raises(TimeoutError, match=r"s3://corpus/locks/_locks/run-x.lock is still held by pid"):
            second.acquire(timeout=1, poll_s=0.2, on_wait=told.append)
        assert told and told[0]["pid"] == first.record["pid"]
    finally:
        first.release()
    assert store.info("_locks/run-x.lock") is None
    second.acquire(timeout=5)
    second.release()
    # a holder on this machine whose process is gone is taken over, and its record handed back
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.put("_locks/run-y.lock", json.dumps({"pid": dead.pid, "host": socket.gethostname(),
                                               "flow_run_id": "f-1"}).encode())
    lock = ObjectRunLock(store, tmp_path / "c.lock", "run-y")
    assert lock.acquire(timeout=5)["flow_run_id"] == "f-1"
    lock.release()
    assert lock_path(tmp_path, "x").parent == tmp_path.resolve() / "_locks"  # local roots keep their lock files


def test_commands_beyond_synthesize_query_doctor_refuse_an_object_store_root(s3):
    for args in (["curate", "--corpus", f"s3://{BUCKET}/x"], ["compact", "--corpus", f"s3://{BUCKET}/x"],
                 ["synthesize", "--corpus", f"s3://{BUCKET}/x", "--ray", "auto"]):
        done = cli(args, s3)
        assert done.returncode == 2, done.stderr
        assert f"s3://{BUCKET}/x: an object-store corpus" in done.stderr
    assert ObjectStore(f"s3://{BUCKET}/x").list() == {}
    missing = cli(["synthesize", "--corpus", "s3://no-such-bucket/x"], s3)
    assert missing.returncode == 4
    assert "the bucket 'no-such-bucket' does not exist" in missing.stderr and "s3://no-such-bucket/x" in missing.stderr


def test_a_run_killed_mid_write_resumes_to_the_same_rows_taking_over_its_lock(written, s3, prefect_server):
    url = f"s3://{BUCKET}/killed"
    store = ObjectStore(url)
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "synthesize", *ARGS, "--corpus", url], cwd=REPO,
                            env=subprocess_env(prefect_server, **s3), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # killed once its first shard object is there
        if any(k.startswith("tasks/") for k in store.list()):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.kill()
    proc.wait()
    left = store.list()
    lock = next(k for k in left if k.startswith("_locks/"))  # the killed holder's lock object is still there
    assert json.loads(store.get(lock))["pid"] == proc.pid

    again = synthesize(url, s3, prefect_server)  # same host, holder dead: the lock is taken over
    assert again.returncode == 0, again.stderr[-3000:]
    assert not any(k.startswith("_locks/") for k in store.list())
    corpus = Corpus(url)
    for table in TABLES:
        assert rows(corpus, table) == rows(Corpus(written), table), table
    lines, damaged = diagnose_objects(corpus)
    assert not damaged and lines[-1] == "no damage found", lines
