"""Import once per run (issue 22, item 5): a run's batches import each catalog once, a change to what the import read
is imported again, a run's cache file that is not exactly what the command wrote is ignored with one log line, and
the corpus is the same with the cache as without it (real stage, real catalogs from ``../shared/catalogs``)."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from generators import imports
from generators.config import EnvironmentSource, SynthesizeConfig
from generators.graph import ToolGraph
from generators.imports import COUNTS, IMPORTS
from generators.sources import SourceError, content_hash
from stages.contract import JobContext, execute
from stages.synthesize import SynthesizeStage
from storage import Corpus

CATALOGS = Path(__file__).resolve().parents[2].parent / "shared" / "catalogs" / "openapi"
PETSTORE = CATALOGS / "oai" / "petstore-expanded.yaml"
TWILIO = CATALOGS / "twilio" / "twilio_conversations_v1.json"
# CI has ../shared beside the checkout: there a missing catalog fails the test instead of skipping it
needs_catalogs = pytest.mark.skipif(not PETSTORE.is_file() and not os.environ.get("CI"),
                                    reason="../shared/catalogs is not there")

ROOT = """openapi: 3.0.3
info: {title: Shop, version: "1"}
paths:
  /pets:
    get:
      operationId: listPets
      summary: List pets
      responses:
        "200":
          description: ok
          content:
            application/json:
              schema: {type: array, items: {$ref: "pet.yaml#/Pet"}}
    post:
      operationId: createPet
      summary: Add a pet
      requestBody:
        content:
          application/json:
            schema: {$ref: "pet.yaml#/Pet"}
      responses:
        "201":
          description: created
          content:
            application/json:
              schema: {$ref: "pet.yaml#/Pet"}
"""
PET = """Pet:
  type: object
  required: [id, name]
  properties:
    id: {type: integer}
    name: {type: string}
"""


@pytest.fixture(autouse=True)
def fresh_memo():
    """Each test starts as a new process does: nothing imported."""
    IMPORTS.clear()
    yield
    IMPORTS.clear()


def shop(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pet.yaml").write_text(PET)
    (folder / "shop.yaml").write_text(ROOT)
    return folder / "shop.yaml"


def config_for(ref: Path, n_batches: int = 3, batch_size: int = 2) -> SynthesizeConfig:
    return SynthesizeConfig(run_name="imports", domains=[], n_tasks=n_batches * batch_size, batch_size=batch_size,
                            agents={"llm_tasks": 0}, environments=[EnvironmentSource(kind="catalog", ref=str(ref))])


def run(stage: SynthesizeStage, root: Path, between=None) -> list[dict]:
    """The runner's order (the catalog, then each batch's job); ``between(batch)`` runs before each job (a fresh
    worker process: ``IMPORTS.clear``)."""
    corpus = Corpus(str(root))
    stage.prepare(corpus, None)
    for job in stage.plan(corpus):
        if between is not None:
            between(job.batch)
        execute(stage, job, JobContext(str(root)))
    return tasks(root)


def tasks(root: Path) -> list[dict]:
    rows = Corpus(str(root)).read("tasks")
    assert rows
    return sorted(rows, key=lambda r: r["task_id"])


class Uncached(SynthesizeStage):
    """The stage as before issue 22: no run cache files, and (with ``IMPORTS.size = 0``) nothing kept in memory."""

    def imports(self, corpus_location: str):  # noqa: ANN201
        return None


def uncached_rows(config: SynthesizeConfig, root: Path, monkeypatch) -> list[dict]:
    with monkeypatch.context() as m:
        m.setattr(IMPORTS, "size", 0)
        return run(Uncached(config), root)


def cache_file(root: Path) -> Path:
    (found,) = (root / "_runs").glob("*/imports/*.json")
    return found


def test_a_run_of_several_batches_imports_its_catalog_and_builds_its_graph_once(tmp_path):
    config = config_for(shop(tmp_path / "spec"), n_batches=4)
    before = dict(COUNTS)
    run(SynthesizeStage(config), tmp_path / "corpus")
    assert COUNTS["imported"] - before.get("imported", 0) == 1  # the run id's content hash, the catalog, 4 batches
    assert COUNTS["built"] - before.get("built", 0) == 1
    assert COUNTS["built_hits"] - before.get("built_hits", 0) >= 4


def test_a_worker_reads_the_run_s_cache_file_instead_of_importing(tmp_path):
    """Pool workers and Ray tasks are other processes: each batch here starts with an empty memory."""
    config = config_for(shop(tmp_path / "spec"))
    before = dict(COUNTS)
    run(SynthesizeStage(config), tmp_path / "corpus", between=lambda batch: IMPORTS.clear())
    assert COUNTS["file_writes"] - before.get("file_writes", 0) == 1
    assert COUNTS["file_hits"] - before.get("file_hits", 0) == 3
    assert COUNTS["imported"] - before.get("imported", 0) == 1


def _shop_tools(path: Path) -> dict[str, dict]:
    return {t.name: t.parameters for t in IMPORTS.catalog(path).tools}


@pytest.mark.parametrize("change", ["root bytes", "$ref'd file", "link retargeted", "$ref'd file appears"])
def test_a_change_to_what_the_import_read_is_imported_again(tmp_path, change):
    spec = shop(tmp_path / "spec")
    if change == "link retargeted":
        (tmp_path / "spec" / "shop-v1.yaml").write_text(ROOT)
        (tmp_path / "spec" / "shop-v2.yaml").write_text(ROOT.replace("List pets", "List every pet"))
        spec.unlink()
        spec.symlink_to("shop-v1.yaml")
    if change == "$ref'd file appears":
        (tmp_path / "spec" / "pet.yaml").unlink()
    first = IMPORTS.catalog(spec)
    hash_before = content_hash(EnvironmentSource(kind="catalog", ref=str(spec)))
    assert IMPORTS.catalog(spec) is first  # unchanged: served from memory
    imported = COUNTS["imported"]
    if change == "root bytes":
        spec.write_text(ROOT.replace("List pets", "List every pet"))
    elif change == "$ref'd file":
        (tmp_path / "spec" / "pet.yaml").write_text(PET.replace("name: {type: string}", "name: {type: string}\n"
                                                                 "    age: {type: integer}"))
    elif change == "link retargeted":
        spec.unlink()
        spec.symlink_to("shop-v2.yaml")
    else:
        (tmp_path / "spec" / "pet.yaml").write_text(PET)
    again = IMPORTS.catalog(spec)
    assert again is not first and COUNTS["imported"] == imported + 1
    assert (again.tools, again.skipped) != (first.tools, first.skipped)
    assert content_hash(EnvironmentSource(kind="catalog", ref=str(spec))) != hash_before


def _resign(stage: SynthesizeStage, path: Path, edit) -> None:
    """Rewrite the cache file with the command's own key: what only a bug (or a holder of the key) could write."""
    head, _, blob = path.read_bytes().partition(b"\n")
    blob = edit(blob)
    runs = stage.imports(str(path.parents[3]))
    mac = imports.hmac.new(stage.cache_key, blob, "sha256").hexdigest()
    path.write_bytes(f"{runs.key_id} {mac}\n".encode() + blob)


def _edit_json(edit):
    def apply(blob: bytes) -> bytes:
        data = json.loads(blob)
        edit(data)
        return json.dumps(data).encode()
    return apply


def _tools_edited(blob: bytes) -> bytes:  # a tool's text changed, the file's digests left as they were
    return blob.replace(b"List pets", b"Delete every pet")


def _tool_field_missing(data):
    del data["catalog"]["tools"][0]["parameters"]


def _foreign_edge(data):
    data["graph"].append(["listPets", "deleteEverything", []])


def _wrong_digest(data):
    key = next(iter(data["catalog"]["digests"]))
    data["catalog"]["digests"][key] = "0" * 64


DAMAGES = {
    "edited after it was written": lambda stage, f: f.write_bytes(_tools_edited(f.read_bytes())),
    "bad JSON, signed": lambda stage, f: _resign(stage, f, lambda b: b[: len(b) // 2]),
    "a tool row without parameters, signed": lambda stage, f: _resign(stage, f, _edit_json(_tool_field_missing)),
    "an edge to a tool the catalog does not have, signed":
        lambda stage, f: _resign(stage, f, _edit_json(_foreign_edge)),
    "no signature": lambda stage, f: f.write_bytes(f.read_bytes().partition(b"\n")[2]),
    "content hash not the files', signed": lambda stage, f: _resign(stage, f, _edit_json(_wrong_digest)),
    "a link out of the corpus": lambda stage, f: (f.unlink(), f.symlink_to("/etc/hostname")),
    "huge": lambda stage, f: f.open("ab").truncate(imports.MAX_CACHE_BYTES + 1),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_cache_file_is_ignored_with_one_log_line_and_the_rows_are_the_same(tmp_path, damage, caplog,
                                                                                     monkeypatch):
    config = config_for(shop(tmp_path / "spec"), n_batches=2)
    want = uncached_rows(config, tmp_path / "plain", monkeypatch)
    stage = SynthesizeStage(config)
    corpus = Corpus(str(tmp_path / "corpus"))
    stage.prepare(corpus, None)  # imports the catalog and writes the run's file
    path = cache_file(tmp_path / "corpus")
    DAMAGES[damage](stage, path)
    before = dict(COUNTS)
    caplog.set_level(logging.INFO, logger="generators.imports")
    for job in stage.plan(corpus):
        IMPORTS.clear()  # a worker process: it would read the file
        execute(stage, job, JobContext(str(tmp_path / "corpus")))
    assert tasks(tmp_path / "corpus") == want
    lines = [r for r in caplog.records if r.name == "generators.imports" and r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "ignored" in lines[0].getMessage() and path.name in lines[0].getMessage()
    assert COUNTS["file_refused"] - before.get("file_refused", 0) == 1
    assert COUNTS["file_hits"] - before.get("file_hits", 0) == 1  # rewritten by the first batch, read by the next


def test_a_cache_file_of_another_command_is_not_read(tmp_path, caplog):
    """An earlier command of the same run (a resume) had another key: its file is replaced, never trusted."""
    config = config_for(shop(tmp_path / "spec"), n_batches=1)
    corpus = Corpus(str(tmp_path / "corpus"))
    SynthesizeStage(config).prepare(corpus, None)
    path = cache_file(tmp_path / "corpus")
    written = path.read_bytes()
    caplog.set_level(logging.INFO, logger="generators.imports")
    before = dict(COUNTS)
    stage = SynthesizeStage(config)  # the next command: another key
    (job,) = stage.plan(corpus)
    assert stage.run_id  # as the runner does before it hands the stage to a worker
    IMPORTS.clear()
    execute(stage, job, JobContext(str(tmp_path / "corpus")))
    assert COUNTS["file_hits"] == before.get("file_hits", 0) and COUNTS["imported"] == before["imported"] + 1
    assert [r.levelno for r in caplog.records] == [logging.INFO] and "another command" in caplog.text
    assert path.read_bytes() != written and path.read_bytes().startswith(stage.imports(corpus.location).key_id.encode())


@needs_catalogs
def test_a_real_catalog_s_corpus_is_the_same_with_the_cache_as_without(tmp_path, monkeypatch):
    spec = TWILIO if TWILIO.is_file() else PETSTORE
    config = config_for(spec, n_batches=3, batch_size=2)
    want = uncached_rows(config, tmp_path / "plain", monkeypatch)
    stage = SynthesizeStage(config)
    assert stage.run_id == Uncached(config).run_id == config.run_id
    assert run(stage, tmp_path / "memory") == want  # batches in one process: the memo
    before = dict(COUNTS)
    assert run(SynthesizeStage(config), tmp_path / "files", between=lambda batch: IMPORTS.clear()) == want
    assert COUNTS["file_hits"] - before.get("file_hits", 0) == 3  # each "worker" read the run's file


def test_a_graph_that_holds_more_than_its_edges_is_not_cached_in_the_run_s_file(tmp_path, monkeypatch, caplog):
    """The file carries a graph's edges and bindings; a ToolGraph that grows other state is not carried (and lost),
    it is built by each process."""
    build = ToolGraph.build.__func__

    def with_more(cls, *args, **kwargs):
        graph = build(cls, *args, **kwargs)
        graph.entities = {"Pet": ["id"]}
        return graph

    monkeypatch.setattr(ToolGraph, "build", classmethod(with_more))
    config = config_for(shop(tmp_path / "spec"), n_batches=1)
    caplog.set_level(logging.WARNING, logger="generators.imports")
    SynthesizeStage(config).prepare(Corpus(str(tmp_path / "corpus")), None)
    assert not list((tmp_path / "corpus").glob("_runs/*/imports/*.json"))
    assert "not written" in caplog.text and "entities" in caplog.text


def _job_in_worker(stage: SynthesizeStage, job, root: str) -> tuple[int, dict[str, int]]:
    before = dict(COUNTS)
    execute(stage, job, JobContext(root))
    return os.getpid(), {k: v - before.get(k, 0) for k, v in COUNTS.items()}


def test_spawned_workers_read_the_file_and_import_nothing(tmp_path, monkeypatch):
    """The stage travels to a worker pickled, as to the runner's process pool or a Ray task: with the run id and
    the key it signs with, so the worker reads the run's file instead of importing or hashing the catalog."""
    config = config_for(shop(tmp_path / "spec"), n_batches=4)
    want = uncached_rows(config, tmp_path / "plain", monkeypatch)
    stage = SynthesizeStage(config)
    corpus = Corpus(str(tmp_path / "corpus"))
    stage.prepare(corpus, None)
    jobs = stage.plan(corpus)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = list(pool.map(_job_in_worker, [stage] * len(jobs), jobs, [str(tmp_path / "corpus")] * len(jobs)))
    counts = Counter()
    for _, c in done:
        counts.update(c)
    assert counts["imported"] == 0 and counts["file_refused"] == 0
    assert counts["file_hits"] == len({pid for pid, _ in done})  # once per worker process, then its memory
    assert tasks(tmp_path / "corpus") == want


def test_a_catalog_edited_while_its_run_runs_fails_the_batch_instead_of_mixing_content(tmp_path):
    """Before, a batch after the edit sampled the new content under the old run id."""
    spec = shop(tmp_path / "spec")
    stage = SynthesizeStage(config_for(spec, n_batches=2))
    corpus = Corpus(str(tmp_path / "corpus"))
    stage.prepare(corpus, None)
    first, second = stage.plan(corpus)
    execute(stage, first, JobContext(corpus.location))
    spec.write_text(ROOT.replace("List pets", "List every pet"))
    with pytest.raises(SourceError, match="its content changed while run .* ran"):
        execute(stage, second, JobContext(corpus.location))
