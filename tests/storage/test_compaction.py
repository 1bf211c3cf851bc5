"""Compaction of finished runs (``storage.compaction``, ``synthloop compact``).

Specified here:
* every view, ``read``, the TRL export, ``batch_done`` and ``batch_summaries`` give the same rows before and after
  compaction (row count and a content hash per view), and ``synthloop doctor`` finds nothing wrong;
* a part's files are sorted by run_id, task_id (trajectory_id), zstd, with min/max statistics, and its marker
  lists its batches and records its files' sha256;
* a compaction killed at any step (part files written, marker written, batches' markers half removed) leaves
  the corpus readable with the same rows and no duplicates, and the next compaction finishes it;
* a second compaction does nothing (no file changes);
* a run that is not complete, is being written, or has a damaged shard is refused with one line naming the run
  or file; nothing is written;
* a damaged part makes its batches not done; rewriting them (what repair does) gives the corpus back.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import storage.compaction as compaction
from generators.config import SynthesizeConfig
from generators.sources import open_sources
from stages.synthesize import catalog_rows, run_batch
from storage import Corpus, export_trl
from storage.compaction import NotCompactable, compact, compact_run, pending_runs
from storage.integrity import diagnose
from tests.helpers import SCRIPTED

CONFIG = SynthesizeConfig(n_tasks=16, batch_size=4, agents=SCRIPTED)
RUN = CONFIG.run_id
STAGE = "synthesize"
BATCHES = list(range(CONFIG.n_batches))


class Killed(BaseException):
    """The process dies here: no handler of the compaction runs."""


@pytest.fixture(scope="module")
def batches() -> list[tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]]:
    return [(r.tables, r.summary) for r in (run_batch(CONFIG, b) for b in BATCHES)]


@pytest.fixture(scope="module")
def written(tmp_path_factory, batches) -> Path:
    """A complete run as the synthesize flow leaves it: catalog, four batches, manifest with its batches."""
    c = Corpus(tmp_path_factory.mktemp("written") / "corpus")
    c.write_batch(RUN, "catalog", 0, catalog_rows(open_sources(CONFIG)), {"domains": CONFIG.domains})
    for b, (tables, summary) in enumerate(batches):
        c.write_batch(RUN, STAGE, b, tables, summary)
    c.write_manifest(RUN, {"run_id": RUN, "stage": STAGE, "config": CONFIG.model_dump(mode="json")})
    c.complete_run(RUN, {"catalog": [0], STAGE: BATCHES}, {"summary": {}})
    return c.root


@pytest.fixture
def corpus(written, tmp_path) -> Corpus:
    root = tmp_path / "corpus"
    shutil.copytree(written, root)
    return Corpus(root)


@pytest.fixture(scope="module")
def before(written, tmp_path_factory) -> dict[str, Any]:
    return fingerprint(Corpus(written), tmp_path_factory.mktemp("export"))


def fingerprint(c: Corpus, tmp: Path) -> dict[str, Any]:
    """Per view its row count and a hash of its rows (order-free), per table ``read``'s rows, the TRL export,
    resume's view of the batches and their summaries."""
    con = c.connect()
    views = sorted(r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall())
    out: dict[str, Any] = {}
    for view in views:
        rows = con.execute(f"SELECT * FROM {view}").fetchall()
        lines = sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
        out[f"view {view}"] = (len(rows), hashlib.sha256("\n".join(lines).encode()).hexdigest())
    con.close()
    for table in c.tables():
        out[f"read {table}"] = sorted(json.dumps(r, sort_keys=True, default=str) for r in c.read(table))
    path = tmp / f"trl-{len(list(tmp.iterdir()))}.parquet"
    export_trl(c, path, run_id=RUN)
    out["export"] = pq.read_table(path).to_pylist()
    out["done"] = [c.batch_done(RUN, STAGE, b) for b in BATCHES] + [c.batch_done(RUN, "catalog", 0)]
    out["summaries"] = [{k: v for k, v in m.items() if k != "shards"} for m in c.batch_summaries(RUN, STAGE)]
    return out


def files(c: Corpus) -> dict[str, int]:
    return {p.relative_to(c.root).as_posix(): p.stat().st_mtime_ns for p in sorted(c.root.rglob("*"))
            if p.is_file() and "_locks" not in p.parts}


def shard_files(c: Corpus) -> list[str]:
    return sorted(p.relative_to(c.root).as_posix() for p in c.root.rglob(f"*/run={RUN}/stage={STAGE}/*.parquet"))


def test_views_reads_exports_and_resume_see_the_same_rows_after_compaction(corpus: Corpus, before, tmp_path) -> None:
    assert pending_runs(corpus) == [RUN]
    shards = len(shard_files(corpus))  # one per table a batch writes, for every batch
    (result,) = compact(corpus)
    assert [p.batches for p in result.parts] == [BATCHES] and result.shards_removed == shards
    assert fingerprint(corpus, tmp_path) == before
    tables = sorted({t for t, *_ in (f.split("/") for f in shard_files(corpus))})
    assert shard_files(corpus) == [f"{t}/run={RUN}/stage={STAGE}/compact-00000.parquet" for t in tables]
    assert not list(corpus.root.glob(f"_runs/{RUN}/{STAGE}/batch-*.done.json"))
    assert corpus.batch_done(RUN, "catalog", 0) and corpus.shard_path("tools", RUN, "catalog", 0).exists()


def test_a_part_is_sorted_zstd_with_statistics_and_its_marker_records_it(corpus: Corpus) -> None:
    compact_run(corpus, RUN)
    marker = json.loads(corpus.part_marker_path(RUN, STAGE, 0).read_text())
    assert marker["kind"] == "compacted" and marker["batches"] == BATCHES
    assert [m["batch"] for m in marker["markers"]] == BATCHES
    for table, record in marker["shards"].items():
        path = corpus.root / record["path"]
        assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert (record["bytes"], record["mtime_ns"]) == (path.stat().st_size, path.stat().st_mtime_ns)
        assert record["rows"] == pq.read_metadata(path).num_rows == marker["rows"][table]
    path = corpus.root / marker["shards"]["trajectories"]["path"]
    keys = pq.read_table(path, columns=["task_id", "trajectory_id"]).to_pylist()
    assert keys == sorted(keys, key=lambda r: (r["task_id"], r["trajectory_id"]))
    meta = pq.ParquetFile(path).metadata
    column = meta.row_group(0).column(meta.schema.names.index("task_id"))
    assert column.compression == "ZSTD" and column.statistics.has_min_max
    assert column.statistics.min == keys[0]["task_id"]


def test_doctor_is_clean_after_compaction(corpus: Corpus, capsys) -> None:
    from flows.cli import main

    assert main(["compact", "--corpus", str(corpus.root)]) == 0
    assert f"run {RUN}: {len(BATCHES)} batch(es) into 1 part(s)" in capsys.readouterr().out
    assert main(["doctor", "--root", str(corpus.root)]) == 0
    assert "no damage found" in capsys.readouterr().out
    report = diagnose(corpus)
    assert not report.damaged and report.runs[0].stale_shards == 0


def test_a_second_compaction_changes_nothing(corpus: Corpus, capsys) -> None:
    from flows.cli import main

    compact(corpus)
    after = files(corpus)
    assert pending_runs(corpus) == []
    assert compact_run(corpus, RUN).line() == f"run {RUN}: already compacted, nothing to do"
    assert main(["compact", "--corpus", str(corpus.root)]) == 0
    assert "nothing to compact" in capsys.readouterr().out
    assert files(corpus) == after


def test_parts_are_cut_by_size_and_keep_the_rows(corpus: Corpus, before, tmp_path) -> None:
    (result,) = compact(corpus, part_bytes=two_batches(corpus))
    assert len(result.parts) >= 2 and sorted(b for p in result.parts for b in p.batches) == BATCHES
    assert fingerprint(corpus, tmp_path) == before
    assert not diagnose(corpus).damaged


def two_batches(c: Corpus) -> int:
    """A part size that holds about two of these batches (batch 0's rows in memory, twice)."""
    shards = json.loads(c.marker_path(RUN, STAGE, 0).read_text())["shards"].values()
    return 2 * sum(pq.read_table(c.root / r["path"]).nbytes for r in shards) + 1


def _kill_on(monkeypatch, name: str, call: int, after: bool = False) -> None:
    """Make ``storage.compaction.<name>`` die on its ``call``-th call (before it runs, or after with ``after``)."""
    real, calls = getattr(compaction, name), []

    def dying(*args, **kwargs):
        calls.append(1)
        if len(calls) == call and not after:
            raise Killed()
        out = real(*args, **kwargs)
        if len(calls) == call:
            raise Killed()
        return out

    monkeypatch.setattr(compaction, name, dying)


def _half_retire(monkeypatch) -> None:
    real = compaction._retire

    def dying(corpus, part, batches, records):
        real(corpus, part, list(batches)[:1], records)
        corpus.marker_path(part.run_id, part.stage, list(batches)[1]).unlink()  # the next marker, not its shards
        raise Killed()

    monkeypatch.setattr(compaction, "_retire", dying)


@pytest.mark.parametrize("step", ["first part file", "all part files", "part marker", "before retiring",
                                  "retiring half", "second part"])
def test_a_compaction_killed_at_any_step_leaves_the_same_rows_and_the_next_one_finishes(
        corpus: Corpus, before, tmp_path, monkeypatch, step: str) -> None:
    part_bytes = compaction.PART_BYTES
    if step == "first part file":
        _kill_on(monkeypatch, "_write_table", 1, after=True)
    elif step == "all part files":
        _kill_on(monkeypatch, "_commit", 1)
    elif step == "part marker":
        _kill_on(monkeypatch, "_commit", 1, after=True)
    elif step == "before retiring":
        _kill_on(monkeypatch, "_retire", 1)
    elif step == "retiring half":
        _half_retire(monkeypatch)
    else:  # the first of two parts done, the second's marker not written
        part_bytes = two_batches(corpus)
        _kill_on(monkeypatch, "_commit", 2)
    with pytest.raises(Killed):
        compact(corpus, part_bytes=part_bytes)
    monkeypatch.undo()

    assert fingerprint(corpus, tmp_path) == before  # readable, correct, no row twice
    assert not diagnose(corpus).damaged
    assert pending_runs(corpus) == [RUN]
    compact(corpus, part_bytes=part_bytes)
    assert fingerprint(corpus, tmp_path) == before
    assert not diagnose(corpus).damaged
    assert not list(corpus.root.glob(f"_runs/{RUN}/{STAGE}/batch-*.done.json"))
    assert all("compact-" in f for f in shard_files(corpus)), shard_files(corpus)
    assert not list(corpus.root.rglob("*.tmp"))
    assert compact_run(corpus, RUN).line().endswith("nothing to do")


def test_a_run_that_is_not_complete_is_refused(corpus: Corpus, capsys) -> None:
    from flows.cli import main

    corpus.write_manifest(RUN, {"status": "running"})
    untouched = files(corpus)
    with pytest.raises(NotCompactable, match=f"run {RUN} is not complete \\(status 'running'\\)"):
        compact_run(corpus, RUN)
    assert pending_runs(corpus) == []
    assert main(["compact", "--corpus", str(corpus.root), RUN]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"synthloop compact: run {RUN} is not complete") and "\n" not in err
    assert files(corpus) == untouched


def test_a_damaged_shard_is_refused_and_not_compacted(corpus: Corpus, capsys) -> None:
    from flows.cli import main

    path = corpus.shard_path("trajectories", RUN, STAGE, 2)
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # passes the readers' cheap check; the hash does not
    untouched = files(corpus)
    with pytest.raises(NotCompactable, match=f"run {RUN} is damaged, not compacted: trajectories/run={RUN}/"
                                             f"stage={STAGE}/batch-00002.parquet: .*synthloop repair"):
        compact_run(corpus, RUN)
    assert main(["compact", "--corpus", str(corpus.root)]) == 1
    err = capsys.readouterr().err.strip()
    assert "batch-00002.parquet" in err and "\n" not in err
    assert files(corpus) == untouched
    assert not list(corpus.root.rglob("compact-*"))


def test_a_shard_changed_after_the_check_is_refused_too(corpus: Corpus, monkeypatch) -> None:
    real = Corpus.scan

    def scan_then_damage(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        shard = self.shard_path("verdicts", RUN, STAGE, 1)
        data = bytearray(shard.read_bytes())
        data[len(data) // 3] ^= 0xFF  # the footer still reads: only the hash taken while reading tells
        shard.write_bytes(bytes(data))
        return out

    monkeypatch.setattr(Corpus, "scan", scan_then_damage)
    with pytest.raises(NotCompactable, match=f"verdicts/run={RUN}/stage={STAGE}/batch-00001.parquet: its content "
                                             f"changed since it was checked"):
        compact_run(corpus, RUN)
    monkeypatch.undo()
    assert not corpus.part_marker_path(RUN, STAGE, 0).exists()
    assert corpus.batch_done(RUN, STAGE, 0)


def test_a_run_being_written_is_refused(corpus: Corpus) -> None:
    from storage.locks import lock_path

    path = lock_path(corpus.root, RUN)
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], "
                               "os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); "
                               "time.sleep(60)", str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(NotCompactable, match=f"run {RUN} is being written now"):
            compact_run(corpus, RUN)
    finally:
        holder.kill()
        holder.wait()
    assert compact_run(corpus, RUN).parts


def test_a_damaged_part_makes_its_batches_not_done_and_rewriting_them_restores_the_corpus(
        corpus: Corpus, batches, before, tmp_path) -> None:
    compact(corpus)
    part = corpus.part_path("tasks", RUN, STAGE, 0)
    part.write_bytes(part.read_bytes()[:200])
    assert not any(corpus.batch_done(RUN, STAGE, b) for b in BATCHES)
    report = diagnose(corpus)
    assert report.damaged
    (line,) = [x for x in report.lines() if x.startswith("DAMAGED")]
    assert f"tasks/run={RUN}/stage={STAGE}/compact-00000.parquet: truncated" in line
    assert f"batches 0–{BATCHES[-1]} ({len(BATCHES)}, compacted)" in line
    with pytest.raises(NotCompactable, match="is damaged, not compacted"):
        compact_run(corpus, RUN)
    for b, (tables, summary) in enumerate(batches):  # what the flow does for batches that are not done
        corpus.write_batch(RUN, STAGE, b, tables, summary)
    assert not corpus.part_marker_path(RUN, STAGE, 0).exists() and not part.exists()
    assert not diagnose(corpus).damaged
    again = fingerprint(corpus, tmp_path)
    redone = again.pop("summaries")
    assert [(m["batch"], m["summary"]) for m in redone] == [(m["batch"], m["summary"]) for m in before["summaries"]]
    assert again == {k: v for k, v in before.items() if k != "summaries"}


def test_a_copied_compacted_corpus_is_verified_by_hash_and_its_part_markers_rerecorded(corpus: Corpus, before,
                                                                                        tmp_path) -> None:
    compact(corpus)
    for p in corpus.root.rglob("*.parquet"):
        os.utime(p, ns=(1, 1))  # a copy that did not keep mtimes
    assert fingerprint(corpus, tmp_path) == before
    report = diagnose(corpus)
    assert not report.damaged and report.runs[0].stale_shards == len(list(corpus.root.rglob("*.parquet")))
    assert corpus.rerecord(corpus.scan(full=True)) == 2  # the catalog's batch marker and the part's marker
    assert diagnose(corpus).runs[0].stale_shards == 0
    assert json.loads(corpus.part_marker_path(RUN, STAGE, 0).read_text())["batches"] == BATCHES
