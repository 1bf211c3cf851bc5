"""The synthesize flow over plain Python objects (``--objects``) on a real Prefect server: tasks accepted with all
their controls rejected, and audit reopening the object source from the corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

from generators.config import EnvironmentSource, SynthesizeConfig
from generators.sources import Environments
from storage import Corpus
from tests.helpers import SCRIPTED

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PANTRY = EnvironmentSource(kind="objects", ref="pantry.kitchen:make_pantry", path=str(ROOT / "examples" / "pantry"),
                           name="pantry")


def test_an_object_source_runs_through_the_flow_and_audit_reopens_it(prefect_server, tmp_path):
    from flows.synthesize import synthesize
    from verifiers.audit import audit

    config = SynthesizeConfig(n_tasks=12, batch_size=12, run_name="objects", domains=[], environments=[PANTRY],
                              agents=SCRIPTED)
    summary = synthesize(config=config, corpus_root=str(tmp_path), workers=1)
    counts = summary["per_domain"]["pantry"]
    assert counts.get("accepted", 0) >= 2 and counts["controls_rejected"] == counts["controls"], counts
    corpus = Corpus(tmp_path)
    con = corpus.connect()
    assert con.execute("SELECT count(*) FROM tools WHERE domain = 'pantry'").fetchone()[0] == 4
    with Environments(corpus) as environments:
        report = audit(corpus, run_id=config.run_id, sample=50, environment=environments.open)
    assert report["recheck"].get("reference_failed", 0) == 0 and report["recheck"].get("control_accepted", 0) == 0
