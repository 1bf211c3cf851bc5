"""``synthloop repair``: redo the damaged batches of a corpus.

A damaged batch (a shard missing, truncated, altered or copied from another batch: see ``storage.integrity``)
is not done, so running its run's flow again with the same config redoes exactly that batch and skips the
rest; a batch is deterministic (config + index in, rows out), so the corpus ends as an uninterrupted run wrote
it. The config comes from the run's manifest, and is accepted only if it still gives the same run id: after a
change to the code that shapes a corpus the batch could not be redone identically, and repair says so instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flows.registry import STAGES
from storage import Corpus
from storage.integrity import Report, diagnose


@dataclass
class RepairOutcome:
    """What a repair did: runs redone, runs it could not redo (and why), and the corpus checked again."""

    redone: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    rerecorded: int = 0
    before: Report | None = None
    after: Report | None = None

    def lines(self) -> list[str]:
        out = []
        if self.rerecorded:
            out.append(f"recorded the shards of {self.rerecorded} batch marker(s) again (legacy or copied corpus)")
        out += [f"redid the damaged batches of run {r}" for r in self.redone]
        out += [f"could not repair run {r}: {why}" for r, why in self.failed.items()]
        if self.after is not None:
            out += self.after.lines()
        return out


def _rerun(corpus: Corpus, run_id: str, manifest: dict[str, Any]) -> None:
    """Run the flow that wrote ``run_id`` again with its manifest's config; ValueError if that config no longer
    names this run."""
    name = manifest.get("stage")
    stage = STAGES.get(name) if isinstance(name, str) else None
    if stage is None:
        raise ValueError(f"its manifest names no stage this command can run again (stage {name!r})")
    config = stage.config_model()(**manifest.get("config"))
    inputs = {key: list(manifest.get(key) or []) for key in stage.inputs}
    _same_run(run_id, stage.run_id(config, inputs))
    stage.flow_function()(config=config, corpus_root=str(corpus.root), **inputs)


def _same_run(run_id: str, now: str) -> None:
    if now != run_id:
        raise ValueError(f"its config now gives run id {now}: the code (or a model version) changed since it was "
                         f"written, so its batches cannot be redone identically; check out the code that wrote it, "
                         f"or remove the run (its folder under _runs/ and its run={run_id} shard folders)")


def repair(corpus_root: str | Path) -> RepairOutcome:
    """Check the corpus (sha256 of every shard), record again what only needs recording, and run every damaged
    run's flow again with its manifest's config (synthesize runs first: the others read them)."""
    corpus = Corpus(corpus_root)
    outcome = RepairOutcome()
    outcome.rerecorded = corpus.rerecord(corpus.scan(full=True, report=False))
    outcome.before = diagnose(corpus)
    for run in outcome.before.runs:
        if not run.problems and run.status != "incomplete":
            continue
        if not run.repairable:
            outcome.failed[run.run_id] = run.why_not
            continue
        try:
            _rerun(corpus, run.run_id, corpus.manifest(run.run_id))
        except Exception as exc:  # noqa: BLE001 - one run that cannot be redone must not stop the others
            outcome.failed[run.run_id] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            continue
        outcome.redone.append(run.run_id)
    outcome.after = diagnose(corpus)
    return outcome

