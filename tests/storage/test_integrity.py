"""A corpus that checks itself (``storage.integrity``, ``Corpus`` readers, ``synthloop doctor``).

Specified here:
* a done marker records, per table, its shard's path, row count, size, mtime and sha256;
* a shard that is truncated, deleted, altered or swapped (another batch's valid shard copied over it) is
  named with its path in one line, its batch is not done (``batch_done`` False) and every reader leaves the
  batch out — ``read``, the DuckDB views (other tables' views keep working) — while exports refuse;
* the cheap check (size + mtime) trusts an untouched file; a same-size rewrite with its mtime set back passes
  it and is caught by ``doctor``, which hashes everything;
* legacy markers (no shard records) are accepted as unverified, checked by footer and row count, and get
  their hashes from ``rerecord`` (``synthloop repair``);
* a run is marked ``complete`` only when every expected batch is done and intact;
* ``synthloop doctor`` prints path, what is wrong and what to run, and exits 1 on damage, 0 when clean.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from generators.config import SynthesizeConfig
from generators.sources import open_sources
from stages.synthesize import catalog_rows, run_batch
from storage import Corpus, export_trl
from tests.helpers import SCRIPTED

CONFIG = SynthesizeConfig(n_tasks=16, batch_size=8, agents=SCRIPTED)
RUN = CONFIG.run_id
STAGE = "synthesize"


@pytest.fixture(scope="module")
def batches() -> list[tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]]:
    out = []
    for b in range(CONFIG.n_batches):
        result = run_batch(CONFIG, b)
        out.append((result.tables, result.summary))
    return out


@pytest.fixture(scope="module")
def written(tmp_path_factory, batches) -> Path:
    """A corpus as the synthesize flow writes it: catalog, two batches, a complete manifest."""
    c = Corpus(tmp_path_factory.mktemp("written") / "corpus")
    c.write_batch(RUN, "catalog", 0, catalog_rows(open_sources(CONFIG)), {"domains": CONFIG.domains})
    for b, (tables, summary) in enumerate(batches):
        c.write_batch(RUN, STAGE, b, tables, summary)
    c.write_manifest(RUN, {"run_id": RUN, "stage": STAGE, "status": "complete",
                           "config": CONFIG.model_dump(mode="json")})
    return c.root


@pytest.fixture
def corpus(written, tmp_path) -> Corpus:
    """A fresh copy of the written corpus (mtimes kept, as ``cp -p`` / ``rsync -a`` keep them)."""
    root = tmp_path / "corpus"
    shutil.copytree(written, root)
    return Corpus(root)


def shard(c: Corpus, table: str, batch: int) -> Path:
    return c.shard_path(table, RUN, STAGE, batch)


def task_ids(c: Corpus) -> list[str]:
    return sorted(t["task_id"] for t in c.read("tasks"))


def view_count(c: Corpus, sql: str) -> int:
    con = c.connect()
    try:
        return con.execute(sql).fetchone()[0]
    finally:
        con.close()


def ids_of(batches, b: int, table: str = "tasks", key: str = "task_id") -> list[str]:
    return sorted(r[key] for r in batches[b][0][table])


# --- what a marker records ----------------------------------------------------------------------------------------


def test_marker_records_every_shards_sha256_rows_and_size(corpus: Corpus, batches) -> None:
    marker = json.loads(corpus.marker_path(RUN, STAGE, 1).read_text())
    tables = batches[1][0]
    assert set(marker["shards"]) == set(tables)
    for table, rows in tables.items():
        path = shard(corpus, table, 1)
        record = marker["shards"][table]
        assert record["path"] == path.relative_to(corpus.root).as_posix()
        assert record["rows"] == len(rows) == pq.read_metadata(path).num_rows
        assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert record["bytes"] == path.stat().st_size
        assert record["mtime_ns"] == path.stat().st_mtime_ns


# --- damage: detected, named, left out ----------------------------------------------------------------------------


def test_a_truncated_shard_is_named_and_its_batch_left_out_while_other_views_work(corpus: Corpus, batches,
                                                                                     caplog) -> None:
    path = shard(corpus, "tasks", 0)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    caplog.set_level(logging.WARNING, logger="synthloop.corpus")

    assert not corpus.batch_done(RUN, STAGE, 0) and corpus.batch_done(RUN, STAGE, 1)
    assert task_ids(corpus) == ids_of(batches, 1)  # the damaged batch is left out of every table
    assert sorted(t["trajectory_id"] for t in corpus.read("trajectories")) == ids_of(batches, 1, "trajectories",
                                                                                     "trajectory_id")
    # views: no raw DuckDB error, other tables (and this table's intact batches) still answer
    assert view_count(corpus, "SELECT count(*) FROM tasks") == len(batches[1][0]["tasks"])
    assert view_count(corpus, "SELECT count(*) FROM tools") > 0
    assert view_count(corpus, "SELECT count(*) FROM verdicts") == len(batches[1][0]["verdicts"])
    lines = [r.getMessage() for r in caplog.records if "batch-00000.parquet" in r.getMessage()]
    assert lines and all("\n" not in line for line in lines)
    assert f"tasks/run={RUN}/stage={STAGE}/batch-00000.parquet: truncated" in lines[0]
    assert "synthloop repair" in lines[0]


def test_a_valid_shard_of_another_batch_copied_over_one_is_detected(corpus: Corpus, batches) -> None:
    target, source = shard(corpus, "trajectories", 0), shard(corpus, "trajectories", 1)
    shutil.copyfile(source, target)  # a valid Parquet file, the right table, another batch's rows

    trajectories = [t["trajectory_id"] for t in corpus.read("trajectories")]
    assert len(trajectories) == len(set(trajectories))  # no duplicated ids (before: 1's twice, 0's lost)
    assert sorted(trajectories) == ids_of(batches, 1, "trajectories", "trajectory_id")
    assert not corpus.batch_done(RUN, STAGE, 0)
    (problem,) = corpus.problems(RUN)
    assert problem.kind == "swapped" and problem.path == target
    assert source.relative_to(corpus.root).as_posix() in problem.line(corpus.root)


def test_a_swap_that_keeps_the_source_mtime_is_detected_too(corpus: Corpus) -> None:
    target, source = shard(corpus, "verdicts", 1), shard(corpus, "verdicts", 0)
    shutil.copy2(source, target)  # cp -p: size and mtime of the other shard
    assert not corpus.batch_done(RUN, STAGE, 1)
    assert [p.kind for p in corpus.problems(RUN)] == ["swapped"]


def test_a_deleted_shard_is_named_and_its_batch_not_done(corpus: Corpus, batches) -> None:
    shard(corpus, "environments", 1).unlink()
    assert not corpus.batch_done(RUN, STAGE, 1)
    assert task_ids(corpus) == ids_of(batches, 0)
    (problem,) = corpus.problems(RUN)
    assert problem.kind == "missing" and problem.path == shard(corpus, "environments", 1)
    assert "missing" in problem.line(corpus.root)


def test_bytes_flipped_in_place_are_detected(corpus: Corpus) -> None:
    path = shard(corpus, "tasks", 1)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert not corpus.batch_done(RUN, STAGE, 1)
    assert [p.kind for p in corpus.problems(RUN)] in (["modified"], ["corrupt"])


def test_the_cheap_check_trusts_size_and_mtime_and_doctor_hashes_everything(corpus: Corpus) -> None:
    from storage.integrity import diagnose

    path = shard(corpus, "tasks", 1)
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, mtime set back: made to look untouched
    assert corpus.batch_done(RUN, STAGE, 1)  # the documented limit of the readers' cheap check
    report = diagnose(corpus)
    assert report.damaged
    assert [(p.path, p.kind) for p in report.problems] in ([(path, "modified")], [(path, "corrupt")])


def test_a_copied_corpus_with_new_mtimes_is_verified_by_hash_and_rerecorded(corpus: Corpus, batches) -> None:
    from storage.integrity import diagnose

    for p in corpus.root.rglob("*.parquet"):
        os.utime(p, ns=(1, 1))  # a copy that did not keep mtimes: the content is still as written
    assert corpus.batch_done(RUN, STAGE, 0) and task_ids(corpus) == sorted(ids_of(batches, 0) + ids_of(batches, 1))
    report = diagnose(corpus)
    assert not report.damaged and report.runs[0].stale_shards == len(list(corpus.root.rglob("*.parquet")))
    assert any("record them again" in line for line in report.lines())
    assert corpus.rerecord(corpus.scan(full=True)) == 3  # catalog + two batches
    assert diagnose(corpus).runs[0].stale_shards == 0


# --- legacy markers -----------------------------------------------------------------------------------------------


def _make_legacy(c: Corpus) -> None:
    for marker in c.root.glob("_runs/*/*/batch-*.done.json"):
        data = json.loads(marker.read_text())
        data.pop("shards"), data.pop("version")
        marker.write_text(json.dumps(data))


def test_legacy_markers_are_accepted_unverified_and_rerecorded(corpus: Corpus, batches) -> None:
    from storage.integrity import diagnose

    _make_legacy(corpus)
    assert corpus.batch_done(RUN, STAGE, 0)
    assert task_ids(corpus) == sorted(ids_of(batches, 0) + ids_of(batches, 1))
    report = diagnose(corpus)
    assert not report.damaged and report.runs[0].legacy_batches == 3
    assert any(line.startswith("UNVERIFIED") for line in report.lines())
    assert corpus.rerecord(corpus.scan(full=True)) == 3
    marker = json.loads(corpus.marker_path(RUN, STAGE, 0).read_text())
    assert marker["version"] == 2 and set(marker["shards"]) == set(batches[0][0])
    assert diagnose(corpus).runs[0].legacy_batches == 0


def test_a_legacy_marker_over_a_truncated_or_shortened_shard_is_caught_by_footer_and_rows(corpus: Corpus) -> None:
    _make_legacy(corpus)
    path = shard(corpus, "tasks", 0)
    path.write_bytes(path.read_bytes()[:100])
    assert not corpus.batch_done(RUN, STAGE, 0)
    assert [p.kind for p in corpus.problems(RUN)] == ["corrupt"]
    other = shard(corpus, "trajectories", 1)
    pq.write_table(pq.read_table(other).slice(0, 3), other)  # valid Parquet, fewer rows than the marker says
    assert sorted(p.kind for p in corpus.problems(RUN)) == ["corrupt", "rows"]
    assert corpus.read("tasks") == []  # both batches left out


# --- views over a file DuckDB cannot read -------------------------------------------------------------------------


def test_views_leave_out_an_unreadable_file_and_keep_the_other_tables(corpus: Corpus, tmp_path, caplog) -> None:
    import duckdb

    from storage.corpus import create_views

    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really")
    shards = {t: corpus.complete_shards(t) for t in corpus.tables()}
    shards["tasks"] = [*shards["tasks"], bad]
    con = duckdb.connect()
    caplog.set_level(logging.WARNING, logger="synthloop.corpus")
    create_views(con, shards)
    assert con.execute("SELECT count(*) FROM tasks").fetchone()[0] == 16
    assert con.execute("SELECT count(*) FROM tools").fetchone()[0] > 0
    assert any(str(bad) in r.getMessage() for r in caplog.records)


# --- exports refuse a damaged corpus ------------------------------------------------------------------------------


def test_export_refuses_a_damaged_corpus_and_names_the_shard(corpus: Corpus, tmp_path) -> None:
    shard(corpus, "trajectories", 1).unlink()
    with pytest.raises(ValueError, match=r"trajectories/run=.*batch-00001\.parquet: the shard is missing"):
        export_trl(corpus, tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()


# --- complete only when everything is written ---------------------------------------------------------------------


def test_a_run_is_complete_only_when_every_expected_batch_is_intact(corpus: Corpus) -> None:
    from storage.integrity import CorpusDamaged

    expected = {"catalog": [0], STAGE: [0, 1, 2]}  # batch 2 was never written
    with pytest.raises(CorpusDamaged, match="batch-00002.done.json: the batch has no done marker"):
        corpus.complete_run(RUN, expected, {"summary": {}})
    assert corpus.manifest(RUN)["status"] == "incomplete"
    shard(corpus, "tasks", 1).write_bytes(b"")
    with pytest.raises(CorpusDamaged, match="tasks/run=.*batch-00001.parquet: truncated"):
        corpus.complete_run(RUN, {"catalog": [0], STAGE: [0, 1]}, {"summary": {}})
    assert corpus.manifest(RUN)["status"] == "incomplete"


def test_complete_run_records_the_batches_and_clears_old_problems(corpus: Corpus) -> None:
    corpus.write_manifest(RUN, {"status": "incomplete", "problems": ["x"]})
    corpus.complete_run(RUN, {"catalog": [0], STAGE: range(2)}, {"summary": {"tasks": 16}})
    manifest = corpus.manifest(RUN)
    assert manifest["status"] == "complete" and "problems" not in manifest
    assert manifest["batches"] == {"catalog": [0], STAGE: [0, 1]} and manifest["summary"] == {"tasks": 16}


def test_rewriting_a_batch_removes_its_marker_first(corpus: Corpus, batches, monkeypatch) -> None:
    """A writer killed between two shards of a batch being redone must not leave the old marker over a mix."""
    tables, summary = batches[0]
    real, calls = pq.write_table, []

    def dying(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(pq, "write_table", dying)
    with pytest.raises(OSError, match="killed"):
        corpus.write_batch(RUN, STAGE, 0, tables, summary)
    monkeypatch.undo()
    assert not corpus.marker_path(RUN, STAGE, 0).exists()
    assert not corpus.batch_done(RUN, STAGE, 0)


# --- synthloop doctor ---------------------------------------------------------------------------------------------


def test_doctor_says_what_is_wrong_where_and_what_to_run(corpus: Corpus, capsys) -> None:
    from flows.cli import main

    assert main(["doctor", "--root", str(corpus.root)]) == 0
    assert "no damage found" in capsys.readouterr().out
    shard(corpus, "tasks", 0).write_bytes(b"PAR1")
    shutil.copyfile(shard(corpus, "verdicts", 0), shard(corpus, "verdicts", 1))
    corpus.marker_path(RUN, "catalog", 0).unlink()
    manifest = corpus.manifest(RUN)
    corpus.write_manifest(RUN, {"batches": {"catalog": [0], STAGE: [0, 1]}, "status": manifest["status"]})
    assert main(["doctor", "--root", str(corpus.root)]) == 1
    out = capsys.readouterr().out.splitlines()
    damaged = [line for line in out if line.startswith("DAMAGED")]
    assert len(damaged) == 3, out
    expect = {f"tasks/run={RUN}/stage={STAGE}/batch-00000.parquet: truncated",
              f"verdicts/run={RUN}/stage={STAGE}/batch-00001.parquet: holds the contents of another shard, "
              f"verdicts/run={RUN}/stage={STAGE}/batch-00000.parquet",
              f"_runs/{RUN}/catalog/batch-00000.done.json: the done marker is missing"}
    for fragment in expect:
        assert any(fragment in line for line in damaged), (fragment, damaged)
    assert all(f"synthloop repair --root {corpus.root}" in line for line in damaged)


def test_doctor_without_a_corpus_says_so(tmp_path, capsys) -> None:
    from flows.cli import main

    assert main(["doctor", "--root", str(tmp_path / "nothing")]) == 2
    assert "no corpus at" in capsys.readouterr().err
