"""A small synthesized corpus (scripted agents, no model) that the interop tests serve to outside agents."""

from __future__ import annotations

import pytest

from generators.config import SynthesizeConfig
from stages.synthesize import run_batch
from storage import Corpus
from tests.helpers import SCRIPTED


@pytest.fixture(scope="session")
def interop_corpus(tmp_path_factory) -> Corpus:
    corpus = Corpus(tmp_path_factory.mktemp("interop-corpus"))
    config = SynthesizeConfig(run_name="interop", n_tasks=40, batch_size=40, agents=SCRIPTED,
                              sampling={"depth_max": 3})
    result = run_batch(config, 0)
    corpus.write_batch(config.run_id, "synthesize", 0, result.tables, result.summary)
    corpus.write_manifest(config.run_id, {"stage": "synthesize", "status": "complete", "config": config.model_dump()})
    return corpus
