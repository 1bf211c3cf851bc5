"""A damaged corpus is redone to the corpus an uninterrupted run writes: by the next run of the same config,
or by ``synthloop repair``; ``synthloop doctor`` tells a damaged corpus from a sound one (exit code).

Damage here is what a disk, a careless copy or a user does to finished shards: truncation, a valid shard of
another batch copied over one (swap), deletion. Comparison as in ``test_resume``: every row of every table,
wall-clock timings dropped.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from generators.config import SynthesizeConfig
from stages.curate import CurateConfig
from storage import Corpus
from tests.helpers import REPO, SCRIPTED, subprocess_env

pytestmark = pytest.mark.slow

CONFIG = SynthesizeConfig(n_tasks=60, batch_size=20, run_name="repairtest", agents=SCRIPTED)
RUN = CONFIG.run_id
CURATE = CurateConfig(run_name="repaircurate", batch_size=25, necessity={"k": 0}, difficulty={"k": 0})
TIMINGS = ("duration_s", "measured_at", "ablation_seconds", "no_tool_seconds", "seconds", "latency_s")
TABLES = ("tasks", "trajectories", "verdicts", "environments", "tools", "tool_edges")


def rows(root: Path, name: str) -> list[str]:
    """The table's rows as sorted canonical strings, wall-clock fields dropped."""
    out = []
    for row in Corpus(root).read(name):
        for key in TIMINGS:
            row.pop(key, None)
        if isinstance(row.get("metadata"), dict):
            row["metadata"].pop("duration_s", None)
        out.append(repr(sorted(row.items())))
    return sorted(out)


def damage(root: Path) -> list[Path]:
    """Truncate one shard, copy another batch's valid shard over one, delete one (the catalog's too); batch 2 is
    left alone."""
    c = Corpus(root)
    truncated = c.shard_path("tasks", RUN, "synthesize", 1)
    truncated.write_bytes(truncated.read_bytes()[:500])
    swapped = c.shard_path("trajectories", RUN, "synthesize", 0)
    shutil.copyfile(c.shard_path("trajectories", RUN, "synthesize", 1), swapped)
    deleted = c.shard_path("verdicts", RUN, "synthesize", 0)
    deleted.unlink()
    tools = c.shard_path("tools", RUN, "catalog", 0)
    tools.unlink()
    return [truncated, swapped, deleted, tools]


def doctor(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", "doctor", "--root", str(root)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def clean(prefect_server, tmp_path_factory) -> Path:
    """The uninterrupted run, then a curate run over it (ablation only: no model)."""
    from flows.curate import curate
    from flows.synthesize import synthesize

    root = tmp_path_factory.mktemp("clean")
    synthesize(config=CONFIG, corpus_root=str(root))
    curate(config=CURATE, corpus_root=str(root))
    return root


def test_a_rerun_of_the_same_config_redoes_exactly_the_damaged_batches(clean, tmp_path):
    from flows.synthesize import synthesize

    root = tmp_path / "damaged"
    shutil.copytree(clean, root)
    damaged = damage(root)
    untouched = Corpus(root).shard_path("environments", RUN, "synthesize", 2)
    before = untouched.stat().st_mtime_ns

    summary = synthesize(config=CONFIG, corpus_root=str(root))

    assert summary["tasks"] == 60 and summary["batches_done"] == 3
    assert Corpus(root).manifest(RUN)["status"] == "complete"
    assert all(p.exists() for p in damaged)
    assert untouched.stat().st_mtime_ns == before  # an intact batch is not redone
    for name in TABLES:
        assert rows(root, name) == rows(clean, name), name
    assert Corpus(root).problems() == []


def test_doctor_then_repair_bring_a_damaged_corpus_back(clean, tmp_path, prefect_server):
    root = tmp_path / "damaged"
    shutil.copytree(clean, root)
    damaged = damage(root)

    found = doctor(root)
    assert found.returncode == 1, found.stdout + found.stderr
    for path in damaged:
        assert any(path.relative_to(root).as_posix() in line and "repair" in line
                   for line in found.stdout.splitlines() if line.startswith("DAMAGED")), (path, found.stdout)
    assert "Traceback" not in found.stdout + found.stderr

    fixed = subprocess.run([sys.executable, "-m", "flows.cli", "repair", "--root", str(root)], cwd=REPO,
                           env=subprocess_env(prefect_server), capture_output=True, text=True, timeout=600)
    assert fixed.returncode == 0, fixed.stdout[-3000:] + fixed.stderr[-3000:]
    assert f"redid the damaged batches of run {RUN}" in fixed.stdout
    assert doctor(root).returncode == 0
    for name in (*TABLES, "necessity", "dedup"):
        assert rows(root, name) == rows(clean, name), name


def test_curate_refuses_a_damaged_source_and_redoes_its_own_damaged_batch(clean, tmp_path):
    from flows.curate import curate
    from flows.repair import repair

    root = tmp_path / "damaged"
    shutil.copytree(clean, root)
    corpus = Corpus(root)
    (curate_run,) = [r for r in corpus.runs() if corpus.manifest(r).get("stage") == "curate"]
    necessity = corpus.shard_path("necessity", curate_run, "curate", 1)
    necessity.write_bytes(b"")
    source = corpus.shard_path("tasks", RUN, "synthesize", 0)
    saved = source.read_bytes()
    source.write_bytes(saved[:300])

    with pytest.raises(ValueError, match=r"tasks/run=.*batch-00000\.parquet: truncated"):
        curate(config=CURATE, corpus_root=str(root))
    source.write_bytes(saved)  # put back as written (the cheap check then hashes it: content matches)

    outcome = repair(root)
    assert outcome.redone == [curate_run] and outcome.failed == {}
    assert outcome.rerecorded == 1  # the restored shard's new mtime was recorded
    assert not outcome.after.damaged
    assert corpus.manifest(curate_run)["status"] == "complete"
    for name in ("necessity", "dedup", "trajectories", "verdicts"):
        assert rows(root, name) == rows(clean, name), name


def test_repair_refuses_a_run_its_config_no_longer_names_and_one_without_a_config(tmp_path):
    from flows.repair import repair
    from stages.synthesize import run_batch

    small = SynthesizeConfig(n_tasks=4, batch_size=4, run_name="small", agents=SCRIPTED)
    corpus = Corpus(tmp_path / "corpus")
    result = run_batch(small, 0)
    for run_id, manifest in ((small.run_id, {"stage": "synthesize", "status": "complete",
                                             "config": {**small.model_dump(mode="json"), "seed": 99}}),
                             ("scripted-run", {"stage": "synthesize", "status": "complete"})):
        corpus.write_batch(run_id, "synthesize", 0, result.tables, result.summary)
        corpus.write_manifest(run_id, manifest)
        corpus.shard_path("tasks", run_id, "synthesize", 0).unlink()

    outcome = repair(corpus.root)

    assert outcome.redone == []
    assert "its config now gives run id small-" in outcome.failed[small.run_id]
    assert "holds no config" in outcome.failed["scripted-run"]
    assert outcome.after.damaged
    assert any("cannot be repaired automatically" in line for line in outcome.after.lines())


def test_a_compacted_corpus_resumes_as_done_and_a_damaged_part_is_repaired(clean, tmp_path):
    """Compaction keeps what resume and repair rely on: a compacted run is done (a rerun redoes nothing), and
    a damaged part makes its batches not done, so repair redoes them as ordinary shards."""
    from flows.repair import repair
    from flows.synthesize import synthesize
    from storage.compaction import compact

    root = tmp_path / "compacted"
    shutil.copytree(clean, root)
    corpus = Corpus(root)
    done = compact(corpus)
    assert len(done) == 2 and all(c.parts for c in done)  # the synthesize run and the curate run
    for name in (*TABLES, "necessity", "dedup"):
        assert rows(root, name) == rows(clean, name), name

    part = corpus.part_path("trajectories", RUN, "synthesize", 0)
    written = part.stat().st_mtime_ns
    summary = synthesize(config=CONFIG, corpus_root=str(root))
    assert summary["tasks"] == 60 and summary["batches_done"] == 3
    assert part.stat().st_mtime_ns == written  # nothing redone

    part.write_bytes(part.read_bytes()[:500])
    found = doctor(root)
    assert found.returncode == 1 and "compact-00000.parquet: truncated" in found.stdout, found.stdout
    outcome = repair(root)
    assert outcome.redone == [RUN] and outcome.failed == {} and not outcome.after.damaged
    assert not corpus.part_marker_path(RUN, "synthesize", 0).exists()
    for name in (*TABLES, "necessity", "dedup"):
        assert rows(root, name) == rows(clean, name), name
    assert compact(corpus)[0].parts  # compacted again
    assert doctor(root).returncode == 0
