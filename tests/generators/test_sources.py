"""Sources of environments: naming, identity, the config that lists them and reopening them for stored tasks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from envs import Environment
from flows.cli import main, synthesize_config
from generators.config import EnvironmentSource, SynthesizeConfig
from generators.sources import Environments, SourceError, content_hash, domain_names, open_sources, source_name

CATALOGS = Path(__file__).resolve().parents[2].parent / "shared" / "catalogs" / "openapi"
PETSTORE = CATALOGS / "oai" / "petstore-expanded.yaml"


def test_a_run_needs_some_environment():
    with pytest.raises(ValidationError, match="no environment to sample from"):
        SynthesizeConfig(domains=[], environments=[])


@pytest.mark.parametrize("kind, ref, name", [
    ("catalog", "/specs/twilio_conversations_v1.json", "twilio_conversations_v1"),
    ("catalog", "api/petstore-expanded.yaml", "petstore_expanded"),
    ("mcp", "/root/.cache/mcp/bin/mcp-server-sqlite --db-path {workdir}/db.sqlite", "mcp_server_sqlite"),
    ("module", "bookshop.domain:Bookshop", "bookshop"),
    ("module", "shop.domain:PetShopDomain", "pet_shop_domain"),
    ("module", "bookshop", "bookshop"),
    ("catalog", "2024-api.yaml", "s_2024_api"),
])
def test_default_domain_names_are_identifiers_taken_from_the_ref(kind, ref, name):
    assert source_name(EnvironmentSource(kind=kind, ref=ref)) == name
    assert source_name(EnvironmentSource(kind=kind, ref=ref, name="mine")) == "mine"


def test_a_name_that_is_not_an_identifier_is_refused():
    with pytest.raises(ValidationError, match="name"):
        EnvironmentSource(kind="catalog", ref="x.yaml", name="Pet Store")


def test_sources_spread_tasks_after_the_built_in_domains():
    config = SynthesizeConfig(domains=["retail"], environments=[
        EnvironmentSource(kind="catalog", ref=str(PETSTORE)), EnvironmentSource(kind="module", ref="a.b:Shop")])
    assert domain_names(config) == ["retail", "petstore_expanded", "shop"]


def test_editing_a_catalog_makes_a_new_run(tmp_path):
    spec = tmp_path / "petstore.yaml"
    shutil.copy(PETSTORE, spec)
    config = SynthesizeConfig(domains=[], environments=[EnvironmentSource(kind="catalog", ref=str(spec))])
    before, hash_before = config.run_id, content_hash(config.environments[0])
    assert SynthesizeConfig(**config.model_dump()).run_id == before  # same content, same run (resume)
    spec.write_text(spec.read_text().replace("Swagger Petstore", "Swagger Petstore, edited"))
    assert content_hash(config.environments[0]) != hash_before
    assert SynthesizeConfig(**config.model_dump()).run_id != before


def test_a_catalog_name_clashing_with_a_built_in_domain_is_refused(tmp_path):
    config = SynthesizeConfig(domains=["retail"],
                              environments=[EnvironmentSource(kind="catalog", ref=str(PETSTORE), name="retail")])
    with pytest.raises(SourceError, match="'retail' is taken by a built-in domain"):
        open_sources(config)


def test_a_catalog_that_cannot_be_read_names_the_file(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("openapi: 3.0.0\npaths: [unclosed\n")
    config = SynthesizeConfig(domains=[], environments=[EnvironmentSource(kind="catalog", ref=str(bad))])
    with pytest.raises(SourceError, match="broken.yaml"):
        open_sources(config)


def test_the_cli_turns_catalog_mcp_and_env_options_into_sources(tmp_path):
    parsed = {}

    def capture(args):
        parsed["config"] = synthesize_config(args)
        return 0

    import flows.cli as cli

    original = cli.cmd_synthesize
    cli.cmd_synthesize = capture
    try:
        main(["synthesize", "--catalog", str(PETSTORE), "--mcp", "server --db {workdir}/x.db",
              "--mcp-state", str(tmp_path), "--env", "bookshop.domain:Bookshop", "--n-tasks", "3"])
    finally:
        cli.cmd_synthesize = original
    config = parsed["config"]
    assert config.domains == []  # only the user's tools unless --domains asks for built-in ones too
    assert [(s.kind, s.ref) for s in config.environments] == [
        ("catalog", str(PETSTORE.resolve())), ("mcp", "server --db {workdir}/x.db"),
        ("module", "bookshop.domain:Bookshop")]
    assert config.environments[1].state == str(tmp_path.resolve())


class _Manifests:
    def __init__(self, manifests):
        self.manifests = manifests

    def manifest(self, run_id):
        return self.manifests.get(run_id, {})


def test_stored_tasks_reopen_on_their_run_s_source():
    corpus = _Manifests({"r1": {"config": {"environments": [{"kind": "catalog", "ref": str(PETSTORE)}]}}})
    with Environments(corpus) as environments:
        builtin = environments.open(SimpleNamespace(run_id="r1", domain="retail", env_seed=3))
        assert isinstance(builtin, Environment) and builtin.seed == 3
        assert environments.open(SimpleNamespace(run_id="r1", domain="retail", env_seed=3)) is builtin
        with pytest.raises(SourceError, match="run r1: domain 'nowhere'"):
            environments.open(SimpleNamespace(run_id="r1", domain="nowhere", env_seed=0))


def test_the_run_manifest_records_sources_as_json():
    config = SynthesizeConfig(domains=[], environments=[EnvironmentSource(kind="mcp", ref="srv {workdir}")])
    dumped = json.loads(json.dumps(config.model_dump(mode="json")))
    assert SynthesizeConfig(**dumped).environments == config.environments


def test_the_prefect_form_shows_sources_as_typed_fields():
    from prefect.utilities.callables import parameter_schema

    from flows.synthesize import synthesize

    schema = parameter_schema(synthesize.fn).model_dump()
    kinds = {"catalog": "CatalogSourceConfig", "mcp": "MCPSourceConfig", "module": "ModuleSourceConfig",
             "objects": "ObjectsSourceConfig"}
    assert schema["definitions"]["SynthesizeConfig"]["properties"]["environments"]["items"] == {
        "oneOf": [{"$ref": f"#/definitions/{kinds[k]}"} for k in sorted(kinds)]}
    for kind, model in kinds.items():  # one form per kind, with the fields that apply to it
        fields = schema["definitions"][model]["properties"]
        assert fields["kind"]["const"] == kind
        assert all(f.get("description") for name, f in fields.items() if name != "kind"), model
    assert "overlay" in schema["definitions"]["CatalogSourceConfig"]["properties"]
    assert "state" not in schema["definitions"]["CatalogSourceConfig"]["properties"]
    assert {"state", "env", "values", "programs", "http"} <= set(schema["definitions"]["MCPSourceConfig"]["properties"])


def test_each_kind_takes_only_its_own_fields_and_old_manifests_still_open():
    with pytest.raises(ValidationError, match="state applies to mcp sources, not to catalog"):
        EnvironmentSource(kind="catalog", ref="x.yaml", state="/tmp/s")
    with pytest.raises(ValidationError, match="kind must be one of catalog, mcp, module, objects"):
        SynthesizeConfig(environments=[{"kind": "graphql", "ref": "x"}])
    # a manifest written when one model had every kind's fields: the other kinds' fields at their defaults
    old = {"kind": "catalog", "ref": str(PETSTORE), "name": None, "state": None, "path": None, "env": {},
           "values": {}, "programs": [], "http": None, "overlay": None}
    (source,) = SynthesizeConfig(domains=[], environments=[old]).environments
    assert type(source).__name__ == "CatalogSourceConfig" and source == EnvironmentSource(kind="catalog",
                                                                                          ref=str(PETSTORE))
    assert set(source.model_dump()) == {"kind", "ref", "name", "overlay"}


def test_a_catalog_without_an_implementation_becomes_a_simulated_source(tmp_path):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]))
    config = SynthesizeConfig(domains=[], environments=[EnvironmentSource(kind="catalog", ref=str(tools))])
    (source,) = open_sources(config).values()
    assert source.simulated and source.report()["format"] == "openai"
    with pytest.raises(SourceError, match="tools.json: its tools have no implementation and this run has no model"):
        source.open(0)


def test_an_openapi_catalog_opens_as_a_rest_environment_with_its_report():
    config = SynthesizeConfig(domains=[], environments=[EnvironmentSource(kind="catalog", ref=str(PETSTORE))])
    (source,) = open_sources(config).values()
    report = source.report()
    assert report["name"] == "petstore_expanded" and report["tools"] == 4 and report["not_crud"] == 0
    assert report["executable"] == {"list": 1, "get": 1, "create": 1, "update": 0, "delete": 1}
    env = source.open(5)
    assert env.state_hash() == source.open(5).state_hash() and env.row_counts()
    assert source.graph().graph.number_of_edges() > 0
