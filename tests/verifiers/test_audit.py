"""The corpus audit re-verifies stored tasks and mutation-tests their verifiers."""

from __future__ import annotations

from generators.config import SynthesizeConfig
from stages.synthesize import run_batch
from storage import Corpus
from tests.helpers import SCRIPTED
from verifiers.audit import MUTATIONS, audit


def test_audit_of_a_fresh_corpus_finds_every_verifier_sound(tmp_path):
    config = SynthesizeConfig(n_tasks=40, batch_size=40, run_name="audit", agents=SCRIPTED)
    result = run_batch(config, 0)
    corpus = Corpus(tmp_path)
    corpus.write_batch(config.run_id, "synthesize", 0, result.tables, result.summary)
    accepted = sum(t["accepted"] for t in result.tables["tasks"])

    report = audit(corpus, sample=25)

    assert report["tasks"] == min(25, accepted)
    assert report["recheck"]["reference_passed"] == report["tasks"]
    assert report["recheck"]["control_rejected"] >= 3 * report["tasks"]
    assert "reference_failed" not in report["recheck"] and "control_accepted" not in report["recheck"]
    assert set(report["mutations"]) == set(MUTATIONS)
    assert report["mutations"]["corrupt_answer"].get("effective_rejected") == report["tasks"]
    assert report["effective_mutants"] > report["tasks"] and report["effective_rejection_rate"] == 1.0


def test_audit_reports_environment_drift(tmp_path, monkeypatch):
    """A task whose environment changed since it was made is not silently judged against the new one."""
    config = SynthesizeConfig(n_tasks=8, batch_size=8, run_name="drift", domains=["retail"], agents=SCRIPTED)
    result = run_batch(config, 0)
    for row in result.tables["tasks"]:
        row["initial_state_hash"] = "0" * 16  # as if the generator had changed since
    corpus = Corpus(tmp_path)
    corpus.write_batch(config.run_id, "synthesize", 0, result.tables, result.summary)

    report = audit(corpus, sample=8)

    assert report["recheck"]["environment_drift"] > 0
    assert report["recheck"].get("reference_passed", 0) == 0
