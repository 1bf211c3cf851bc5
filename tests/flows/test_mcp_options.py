"""The --mcp options of `synthesize` (per server, no config file needed) and which domains a run samples when
the user brings their own tools."""

from __future__ import annotations

import pytest

from flows.cli import build_parser, mcp_sources, synthesize_config
from flows.options import UsageError
from generators.config import EnvironmentSource, SynthesizeConfig


def _config(argv: list[str]) -> SynthesizeConfig:
    args, _ = build_parser("synthesize").parse_known_args(["synthesize", *argv])
    return synthesize_config(args)


def test_mcp_options_apply_to_the_server_before_them_and_before_any_to_every_server(tmp_path):
    config = _config([
        "--mcp-env", "LOG_LEVEL=warn",
        "--mcp", "node_modules/.bin/mcp-server-memory", "--mcp-env", "MEMORY_FILE_PATH={workdir}/memory.jsonl",
        "--mcp-state", str(tmp_path),
        "--mcp", "mcp-server-sqlite --db-path {workdir}/x.db", "--mcp-value", "read_query.query=SELECT 1",
        "--mcp-value", "read_query.query=SELECT count(*) FROM t", "--mcp-value", 'files=["a.txt", "b.txt"]',
        "--n-tasks", "3"])
    memory, sqlite = config.environments
    assert (memory.ref, memory.state) == ("node_modules/.bin/mcp-server-memory", str(tmp_path.resolve()))
    assert memory.env == {"LOG_LEVEL": "warn", "MEMORY_FILE_PATH": "{workdir}/memory.jsonl"}
    assert memory.values == {}
    assert (sqlite.state, sqlite.env) == (None, {"LOG_LEVEL": "warn"})
    assert sqlite.values == {"read_query.query": ["SELECT 1", "SELECT count(*) FROM t"], "files": [["a.txt", "b.txt"]]}
    assert config.domains == []


def test_an_mcp_option_without_a_server_or_without_a_value_is_a_clear_error():
    with pytest.raises(UsageError, match="--mcp-env without --mcp"):
        mcp_sources([("--mcp-env", "A=1")])
    with pytest.raises(SystemExit):
        build_parser("synthesize").parse_known_args(["synthesize", "--mcp", "x", "--mcp-env", "NOEQUALS"])


def test_own_sources_without_domains_sample_no_built_in_domain_and_naming_them_samples_both():
    own = [EnvironmentSource(kind="mcp", ref="mcp-server-memory")]
    assert SynthesizeConfig(environments=own).domains == []
    assert SynthesizeConfig(environments=own, domains=["retail"]).domains == ["retail"]
    assert SynthesizeConfig().domains == ["retail", "calendar", "banking", "files"]  # no sources: unchanged
    # what a config file says is what the Prefect form sends back: the same run either way
    dumped = SynthesizeConfig(environments=own).model_dump(mode="json")
    assert SynthesizeConfig.model_validate(dumped).run_id == SynthesizeConfig(environments=own).run_id


def test_help_says_when_built_in_domains_are_sampled():
    described = SynthesizeConfig.model_fields["domains"].description
    assert "none when environments are given" in described
