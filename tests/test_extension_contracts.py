"""The extension seams, checked: an extension registered in one place and forgotten in another fails here.

Until issue 24's registries exist, adding a source kind, a catalog format, a negative-control kind, a stage or
an export means editing several lists and if-chains (``docs/extending.md`` maps them). Each test below runs
over the real lists and the real code behind them (no doubles) and names the list it found out of step.

Specified here:
* source kinds: every kind registered in ``SOURCE_KINDS`` is opened by ``open_source`` (a missing ref is a
  ``SourceError`` naming it), names itself from its ref, is hashed by its content (an edit makes a new run id),
  is produced by its ``synthesize`` command-line flag, and is documented; the registry refuses a second class
  under a taken kind and takes the same class twice;
* catalog formats (``generators.catalog.registry``): ``catalog inspect --format`` offers every registered
  format; a file of each is detected as it, imports at least one tool (the same when the format is named), and
  opens as an executable environment exactly when its registration says so; registering is idempotent, a taken
  name or detection rank is refused, an unknown format name is an error (never read as another format), and a
  new format is one module with one registration;
* control kinds: ``make_controls`` produces every kind ``schemas.controls.CONTROLS`` registers and no other;
  every registered kind has a play (``generators.agents.PLAYS``) and, where it carries fields, a maker
  (``verifiers.controls.MAKERS``); each kind, played by the oracle, departs from the reference and is rejected on
  outcome; ``accept`` requires only registered kinds; a kind is no role other stages write;
* stages: every stage of the registry (``flows.registry.STAGES``) has a flow ``flows.<name>.<name>`` taking its
  config model, a CLI command, a deployment, and a ``Stage`` class declaring its config and the tables it writes;
  the lists of the layers below (``STAGE_ORDER``, the viewer's ``STAGE_PLOTS``) equal it; repair can redo a run
  of it (what each stage reads and writes is checked by ``tests/stages/test_stage_tables.py``);
* exports: ``export``'s formats are the registry's (``flows.registry.EXPORTS``): ``trl``, ``verl`` and exactly the
  named selections, each writer taking the options it is given;
* failure labels: the ``Weakness`` literal and ``WEAKNESSES`` agree;
* the guide: each axis's heading in ``docs/extending.md`` lists exactly the names the code registers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import io
import json
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from envs import DOMAINS, Environment
from flows.cli import CONFIG_COMMANDS, build_parser, config_model, load_config
from flows.repair import repair
from flows.registry import EXPORTS, STAGES, resolve
from flows.serve import FLOWS, deployment_specs
from generators.agents import PLAYS, OracleAssistant, ScriptedUser, run_episode
from generators.catalog import (
    CatalogFormat,
    catalog_format,
    catalog_formats,
    format_names,
    import_catalog,
    register_format,
)
from generators.config import WEAKNESSES, EnvironmentSource, Weakness
from generators.sources import (
    SOURCE_KINDS,
    ModuleSource,
    Source,
    SourceError,
    SourceFlag,
    content_hash,
    open_source,
    register,
    source_name,
)
from generators.tasks import sample_tasks
from schemas import CheckResult, Verdict
from schemas.controls import CONTROLS
from stages.contract import Stage
from storage import Corpus
from storage.integrity import STAGE_ORDER
from viewer.app import PLOTS, STAGE_PLOTS
from storage.selections import SELECTIONS
from storage.sql import split_view
from verifiers.checks import verify
from verifiers.controls import MAKERS, accept, make_controls

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "extending.md"
KINDS = tuple(SOURCE_KINDS)


def subclasses(cls: type) -> list[type]:
    found, todo = [], [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


def help_choices(argv: list[str], option: str | None = None) -> list[str]:
    """The ``{a,b,c}`` choices ``synthloop ARGV --help`` shows for ``option`` (or for the first positional)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    pattern = (re.escape(option) + r" \{([^}]*)\}") if option else r"\{([^}]*)\}"
    found = re.search(pattern, out.getvalue())
    assert found, f"no choices{' of ' + option if option else ''} in: {out.getvalue()}"
    return found.group(1).split(",")


# --- source kinds -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_open_source_dispatches_every_kind_and_names_a_ref_it_cannot_open(kind, tmp_path):
    missing = {"catalog": str(tmp_path / "missing.yaml"), "mcp": "no-such-mcp-server-4711 --db x",
               "module": "no_such_pkg_4711.domain:Shop", "objects": "no_such_pkg_4711.env:make"}.get(
        kind, "no_such_thing_4711")
    with pytest.raises(SourceError) as err:  # a KeyError here: the kind has no entry in open_source's table
        open_source(EnvironmentSource(kind=kind, ref=missing, **({"path": str(tmp_path)}
                                                                 if "path" in SOURCE_KINDS[kind].config.model_fields
                                                                 else {})))
    assert str(err.value).startswith(kind) and missing in str(err.value), err.value


def test_every_source_class_of_a_kind_is_registered_or_opened_by_one_that_is():
    by_kind: dict[str, list[str]] = {}
    for cls in subclasses(Source):
        if not inspect.isabstract(cls) and isinstance(cls.__dict__.get("kind"), str) and cls.__module__ != __name__:
            by_kind.setdefault(cls.kind, []).append(cls.__name__)
    assert all(SOURCE_KINDS[k].kind == k and issubclass(SOURCE_KINDS[k], Source) for k in KINDS)
    # builtin is the run's domains, not a kind a config names; catalog has two classes: an OpenAPI description
    # runs, any other format is played by a model (CatalogSource.from_config picks)
    assert sorted(by_kind) == sorted({*KINDS, "builtin"}), by_kind
    assert sorted(by_kind["catalog"]) == ["CatalogSource", "SimulatedSource"]


def test_the_registry_takes_a_class_twice_and_refuses_a_second_class_under_a_taken_kind():
    assert register(ModuleSource) is ModuleSource and SOURCE_KINDS["module"] is ModuleSource

    class Impostor(ModuleSource):
        kind = "module"

    with pytest.raises(ValueError, match="source kind 'module' is taken by generators.sources.ModuleSource"):
        register(Impostor)

    class Flagless(ModuleSource):
        kind = "flagless4711"
        flag = None

    with pytest.raises(TypeError, match="declares no `flag`"):
        register(Flagless)

    class Configless(ModuleSource):
        kind = "configless4711"  # its config is ModuleSource's, of kind module

    with pytest.raises(TypeError, match="declares no `config`"):
        register(Configless)
    assert SOURCE_KINDS["module"] is ModuleSource and not {"flagless4711", "configless4711"} & set(SOURCE_KINDS)
    with pytest.raises(ValueError, match="unknown source kind 'flagless4711'; source kinds: catalog, mcp, module"):
        EnvironmentSource(kind="flagless4711", ref="x")


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_names_itself_from_its_ref(kind):
    name = source_name(EnvironmentSource(kind=kind, ref="/some/where/Pet-Shop4711.yaml --flag x:y"))
    assert re.fullmatch(r"[a-z][a-z0-9_]{0,39}", name), name
    assert source_name(EnvironmentSource(kind=kind, ref="whatever", name="mine")) == "mine"


def _package(root: Path, module: str, body: str) -> Path:
    pkg = root / module.split(".")[0]
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    path = pkg / (module.split(".")[1] + ".py")
    path.write_text(body)
    return path


def _catalog_case(tmp: Path) -> tuple[EnvironmentSource, Path, str]:
    path = tmp / "tools.json"
    path.write_text(json.dumps(SAMPLES["jsonschema"][1]))
    return EnvironmentSource(kind="catalog", ref=str(path)), path, path.read_text().replace("Look", "Find")


def _mcp_case(tmp: Path) -> tuple[EnvironmentSource, Path, str]:
    (tmp / "state").mkdir()
    path = tmp / "state" / "notes.json"
    path.write_text('{"a": 1}')
    return EnvironmentSource(kind="mcp", ref="some-mcp-server --dir {workdir}", state=str(tmp / "state")), path, \
        '{"a": 2}'


def _module_case(tmp: Path) -> tuple[EnvironmentSource, Path, str]:
    path = _package(tmp, "shop4711.domain", "class Shop:\n    name = 'shop'\n")
    return EnvironmentSource(kind="module", ref="shop4711.domain:Shop", path=str(tmp)), path, \
        "class Shop:\n    name = 'shop2'\n"


def _objects_case(tmp: Path) -> tuple[EnvironmentSource, Path, str]:
    path = _package(tmp, "things4711.env", "class Counter:\n    n = 0\n\ndef make(seed):\n    return Counter()\n")
    return EnvironmentSource(kind="objects", ref="things4711.env:make", path=str(tmp)), path, \
        path.read_text().replace("n = 0", "n = 1")


# One case per kind: a source whose content is on disk, the file to edit and its edited text. A kind without a
# case fails below.
CONTENT_CASES = {"catalog": _catalog_case, "mcp": _mcp_case, "module": _module_case, "objects": _objects_case}


def test_every_kind_has_a_content_case():
    assert sorted(CONTENT_CASES) == sorted(KINDS), "add a case for the new kind: what of it is content, on disk"


@pytest.mark.parametrize("kind", KINDS)
def test_editing_a_source_s_content_changes_its_hash(kind, tmp_path):
    """``content_hash`` must read the kind's content (its ``hash_content``, or the ``state`` folder): otherwise an
    edited source resumes the old run and mixes batches of two different environments."""
    source, path, edited = CONTENT_CASES[kind](tmp_path)
    before = content_hash(source)
    assert content_hash(source) == before  # the same content, the same run (resume)
    assert edited != path.read_text()
    path.write_text(edited)
    assert content_hash(source) != before, f"{kind}: editing {path.name} left content_hash unchanged"


def _kinds_from_flag(option: str, value: str) -> list[str] | None:
    """The environment kinds ``synthesize OPTION VALUE`` gives, or None where the option does not take it."""
    argv = ["synthesize", option, value]
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            args, extra = build_parser("synthesize").parse_known_args(argv)
            if extra:
                return None
            config = load_config(args)
        except (SystemExit, Exception):  # noqa: BLE001 - an option that refuses this value gives no source
            return None
    return [s.kind for s in config.environments]


def test_every_kind_has_a_synthesize_flag_and_every_source_flag_a_kind():
    synthesize = build_parser("synthesize").commands["synthesize"]
    produced: dict[str, list[str]] = {}
    for option in synthesize.option_names:
        if option.startswith("--") and option not in ("--help", "--config", "--set"):
            kinds = _kinds_from_flag(option, "pkg4711.mod:make")
            if kinds:
                produced[option] = kinds
    assert sorted({k for ks in produced.values() for k in ks}) == sorted(KINDS), \
        f"synthesize flags give {produced}; every registered kind needs one (its Source class's `flag`)"
    for kind in KINDS:  # and each kind's own flag gives that kind
        assert isinstance(SOURCE_KINDS[kind].flag, SourceFlag)
        assert produced.get(SOURCE_KINDS[kind].flag.option) == [kind], (kind, produced)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_is_documented(kind):
    docs = (ROOT / "docs" / "sources.md").read_text() + (ROOT / "docs" / "objects.md").read_text()
    assert f"`{kind}`" in docs or f"`--{kind}`" in docs, f"docs/sources.md or docs/objects.md says nothing of {kind}"


# --- catalog formats --------------------------------------------------------------------------------------------

_PARAMS = {"type": "object", "properties": {"pet_id": {"type": "string", "description": "Look up this pet"}},
           "required": ["pet_id"]}
_PET = {"type": "object", "required": ["id", "name"],
        "properties": {"id": {"type": "string"}, "name": {"type": "string", "example": "Rex"}}}
_OPENAPI = {
    "openapi": "3.0.3", "info": {"title": "Pets", "version": "1"},
    "paths": {
        "/pets": {
            "get": {"operationId": "listPets", "responses": {"200": {"description": "Look", "content": {
                "application/json": {"schema": {"type": "array", "items": {"$ref": "#/components/schemas/Pet"}}}}}}},
            "post": {"operationId": "createPet", "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Pet"}}}},
                "responses": {"201": {"description": "made", "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/Pet"}}}}}}},
        "/pets/{petId}": {
            "get": {"operationId": "getPet", "parameters": [{"name": "petId", "in": "path", "required": True,
                                                             "schema": {"type": "string"}}],
                    "responses": {"200": {"description": "one", "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/Pet"}}}}}}}},
    "components": {"schemas": {"Pet": _PET}},
}
# One file per format (name, content); a format without a sample fails below.
SAMPLES: dict[str, tuple[str, typing.Any]] = {
    "openai": ("tools.json", [{"type": "function", "function": {"name": "get_pet", "description": "Look up a pet",
                                                               "parameters": _PARAMS}}]),
    "jsonschema": ("functions.json", [{"name": "get_pet", "description": "Look up a pet", "parameters": _PARAMS}]),
    "bfcl": ("BFCL_v4_simple_python.json", [{"id": "simple_python_0", "question": [[{"role": "user", "content": "x"}]],
                                             "function": [{"name": "get_pet", "description": "Look up a pet",
                                                           "parameters": {**_PARAMS, "type": "dict"}}]}]),
    "mcp": ("listing.json", {"tools": [{"name": "get_pet", "description": "Look up a pet", "inputSchema": _PARAMS}]}),
    "openapi": ("openapi.json", _OPENAPI),
}
DETECTED = [f.name for f in catalog_formats()]


def _sample(fmt: str, tmp: Path) -> Path:
    name, content = SAMPLES[fmt]
    path = tmp / name
    if fmt == "bfcl":  # BFCL's files are JSON lines
        path.write_text("\n".join(json.dumps(r) for r in content) + "\n")
    else:
        path.write_text(json.dumps(content))
    return path


def test_the_cli_offers_every_registered_format():
    assert help_choices(["catalog", "inspect"], "--format") == list(format_names()) == ["auto", *DETECTED], \
        "flows/cli.py: `catalog inspect --format` choices are not generators.catalog.format_names()"


def test_every_format_has_a_sample():
    assert sorted(SAMPLES) == sorted(DETECTED)


@pytest.mark.parametrize("fmt", DETECTED)
def test_every_format_is_detected_and_imports_a_tool(fmt, tmp_path):
    path = _sample(fmt, tmp_path)
    assert catalog_format(fmt).detect(json.loads(path.read_text().splitlines()[0] if fmt == "bfcl" else
                                                 path.read_text()))
    detected = import_catalog(path)
    assert detected.format == fmt and detected.tools, (detected.format, detected.skipped)
    named = import_catalog(path, format=fmt)
    assert [t.to_row() for t in named.tools] == [t.to_row() for t in detected.tools]


@pytest.mark.parametrize("fmt", DETECTED)
def test_a_format_opens_as_an_executable_environment_exactly_when_registered_so(fmt, tmp_path):
    """open_source routes on the registration: an executable format (OpenAPI) runs as a REST domain, every other
    format is played by a model."""
    source = open_source(EnvironmentSource(kind="catalog", ref=str(_sample(fmt, tmp_path))), play=None)
    try:
        assert source.kind == "catalog" and source.simulated == (not catalog_format(fmt).executable)
        assert source.specs, fmt
    finally:
        source.close()
    assert [f.name for f in catalog_formats() if f.executable] == ["openapi"]


def test_registering_is_idempotent_and_a_taken_name_or_rank_is_refused():
    for fmt in catalog_formats():
        assert register_format(fmt) is fmt  # a module imported again registers the same format again
    openai = catalog_format("openai")
    with pytest.raises(ValueError, match="'openai' is already registered"):
        register_format(CatalogFormat("openai", rank=999, detect=openai.detect, read=openai.read))
    with pytest.raises(ValueError, match="rank 30 is 'openai'"):
        register_format(CatalogFormat("other", rank=30, detect=openai.detect, read=openai.read))
    with pytest.raises(ValueError, match="'auto' is reserved"):
        register_format(CatalogFormat("auto", rank=999, detect=openai.detect, read=openai.read))
    assert DETECTED == [f.name for f in catalog_formats()]  # nothing refused was added


def test_an_unknown_format_is_an_error_not_another_format(tmp_path):
    path = _sample("openapi", tmp_path)
    with pytest.raises(ValueError, match=r"format 'swagger' is not one of auto, openapi, .*jsonschema"):
        import_catalog(path, format="swagger")


ANTHROPIC = '''
"""Anthropic-style tool definitions: [{"name", "description", "input_schema"}] (docs/extending.md's example)."""
from generators.catalog import CatalogFormat, register_format
from generators.catalog.tools import collect_each, first_record, records
from generators.catalog.schema import parameters_schema
from schemas import Tool


def detect(data):
    entry = first_record(data)
    return isinstance(entry, dict) and "input_schema" in entry and "parameters" not in entry


def read(data, files, domain):
    def build(entry):
        return Tool(name=entry["name"], description=entry.get("description") or "", domain=domain,
                    parameters=parameters_schema(entry.get("input_schema"), field="input_schema"),
                    source=f"anthropic:{files.path.name}", origin={"kind": "anthropic", "name": entry["name"]})
    tools, skipped = collect_each(records(data), build)
    return tools, skipped, []


FORMAT = register_format(CatalogFormat("anthropic", rank=35, detect=detect, read=read))
'''


def test_a_new_format_is_one_module_and_one_registration(tmp_path):
    """docs/extending.md's worked example, run: a module that registers an Anthropic-style format is all it
    takes for detection (before ``jsonschema``, which would otherwise take such a list), import and the CLI."""
    (tmp_path / "anthropic_format.py").write_text(ANTHROPIC)
    sample = tmp_path / "claude_tools.json"
    sample.write_text(json.dumps([{"name": "get_pet", "description": "Look up a pet", "input_schema": _PARAMS}]))
    assert import_catalog(sample).format == "jsonschema"  # today: read as specs, with no arguments
    script = (f"import anthropic_format, json\nfrom generators.catalog import import_catalog\n"
              f"from flows.cli import build_parser\nresult = import_catalog({str(sample)!r})\n"
              "args = build_parser().parse_args(['catalog', 'inspect', 'x', '--format', 'anthropic'])\n"
              "print(json.dumps([result.format, [t.to_row() for t in result.tools], args.format]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    assert done.returncode == 0, done.stderr[-2000:]
    fmt, [tool], offered = json.loads(done.stdout)
    assert (fmt, offered, tool["name"], tool["origin"]["kind"]) == ("anthropic", "anthropic", "get_pet", "anthropic")
    assert tool["parameters"] == _PARAMS  # its arguments, which jsonschema's reading of the same file loses


# --- negative-control kinds -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def controlled() -> list[tuple[Environment, object, object, list]]:
    """(initial env, task, reference trajectory, controls) for sampled tasks of every built-in domain."""
    out = []
    for name in sorted(DOMAINS):
        env = Environment(DOMAINS[name], 0)
        for task, rng in sample_tasks(env, 6, seed=11, run_id="contracts"):
            final = env.fork()
            reference = run_episode(task, ScriptedUser(task), OracleAssistant(task), final, role="reference",
                                    trajectory_id="r")
            out.append((env, task, reference, make_controls(task, env, final, rng)))
    return out


def test_make_controls_produces_exactly_the_declared_kinds(controlled):
    produced = {control.kind for *_, controls in controlled for control in controls}
    declared = set(CONTROLS)
    assert produced == declared, f"declared, never made: {declared - produced}; made, undeclared: {produced - declared}"


def test_every_control_kind_has_a_play_and_its_fields_a_maker():
    """A kind is registered in ``schemas.controls``; the oracle's play and the maker of its fields hang off it."""
    assert set(PLAYS) == set(CONTROLS), "generators.agents: a @plays(Kind) per registered kind, and no other"
    carrying = {k for k, cls in CONTROLS.items() if dataclasses.fields(cls)}
    assert carrying <= set(MAKERS) <= set(CONTROLS), "verifiers.controls: a @makes(Kind) per kind with fields"


def test_every_control_kind_departs_from_the_reference_and_is_rejected_on_outcome(controlled):
    """A play that departs nowhere plays the reference unchanged: the verifier would then accept the control and
    every task would be rejected."""
    rejected = dict.fromkeys(CONTROLS, 0)
    for env, task, reference, controls in controlled:
        for fault in controls:
            control = run_episode(task, ScriptedUser(task), OracleAssistant(task, fault=fault), env.fork(),
                                  role=fault.kind, trajectory_id=f"c-{fault.kind}")
            assert control.messages != reference.messages, f"{fault.kind}: the faulty oracle played the reference"
            rejected[fault.kind] += not verify(task, control, env, expected_pass=False).outcome_passed
    assert all(rejected.values()), f"control kinds never rejected on outcome: {rejected}"


def _verdict(control: str, passed: bool) -> Verdict:
    names = ["format", "schema", "execution", "state_diff", "answer", "constraints"]
    components = [CheckResult(n, passed or n != "answer", 1.0 if passed or n != "answer" else 0.0) for n in names]
    return Verdict(f"{control}/v", control, "t", "r", 0, control, control == "reference", passed, components)


def test_accept_requires_only_declared_control_kinds():
    """``accept`` names its required kinds in a literal of its own: a renamed kind leaves every task unaccepted."""
    controls = [_verdict(k, False) for k in CONTROLS]
    assert accept(_verdict("reference", True), controls) == (True, None)


def test_control_kinds_are_no_role_other_stages_write():
    # the roles synthesize, curate, train and the rollouts give their trajectories (views select by role)
    others = {"reference", "rollout", "no_tool", "minimal", "probe", "grpo", "eval"}
    assert not set(CONTROLS) & others


# --- stages -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_has_a_flow_taking_its_config_model(stage):
    flow = STAGES[stage].flow_function()
    assert flow.name == stage and flow is FLOWS[stage]
    config = inspect.signature(flow.fn).parameters["config"]
    assert isinstance(config.default, config_model(stage)), (stage, config.default, config_model(stage))
    for key in STAGES[stage].inputs:  # what repair hands the flow again from the manifest
        assert key in inspect.signature(flow.fn).parameters, (stage, key)


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_has_a_cli_command_and_a_deployment(stage, tmp_path):
    assert stage in CONFIG_COMMANDS
    args, extra = build_parser(stage).parse_known_args([stage, "--corpus", str(tmp_path)])
    assert not extra and args.command == stage
    assert isinstance(load_config(args), config_model(stage))
    specs = {s.flow: s for s in deployment_specs(str(tmp_path))}
    assert list(specs) == list(STAGES)
    config_model(stage).model_validate(specs[stage].parameters["config"])
    assert all(issubclass(e, BaseException) for e in STAGES[stage].error_types())


def test_the_lists_below_the_registry_name_its_stages_in_its_order():
    """``storage`` and ``viewer`` cannot import ``flows``; their lists must equal the registry."""
    assert STAGE_ORDER == tuple(STAGES), "storage/integrity.py STAGE_ORDER vs flows/registry.py STAGES"
    assert set(STAGE_PLOTS) == set(STAGES), "viewer/app.py STAGE_PLOTS vs flows/registry.py STAGES"
    assert all(key in PLOTS for keys in STAGE_PLOTS.values() for key in keys)


def test_every_stage_class_declares_its_config_and_its_tables():
    stages = {cls.name: cls for cls in subclasses(Stage) if cls.__module__.startswith("stages.")}
    assert {"synthesize", "curate", "train", "select", "loop"} <= set(stages)
    for name, cls in stages.items():
        assert isinstance(getattr(cls, "Config", None), type), f"{cls.__name__} has no Config"
        assert cls.writes, f"{cls.__name__} declares no table it writes"
    for name, spec in STAGES.items():
        cls = spec.stage_class()
        assert issubclass(cls, Stage)
        assert cls.name == name and cls.Config is config_model(name), (name, cls.Config, config_model(name))


@pytest.mark.parametrize("stage", STAGES)
def test_repair_can_redo_a_run_of_every_stage(stage, tmp_path):
    """``repair`` reruns a damaged run by the registry; a stage it does not know is reported as "names no
    stage". Here the run id is not the config's, so repair stops before running."""
    corpus = Corpus(tmp_path)
    corpus.write_manifest("r0", {"run_id": "r0", "stage": stage, "status": "incomplete", "config": {}})
    outcome = repair(tmp_path)
    assert list(outcome.failed) == ["r0"], outcome.lines()
    assert outcome.failed["r0"].startswith("its config now gives run id"), outcome.failed["r0"]


# --- exports ----------------------------------------------------------------------------------------------------


def test_export_offers_trl_verl_and_every_selection():
    offered = help_choices(["export"])
    assert offered == list(EXPORTS)
    assert sorted(offered) == sorted({"trl", "verl", *SELECTIONS})
    for name, export in EXPORTS.items():
        writer = inspect.signature(resolve(export.write)).parameters
        assert all(option in writer for option in export.options), (name, export.options)
        if export.selection:
            split_view(export.selection)  # raises for a name no selection implements


# --- failure labels ---------------------------------------------------------------------------------------------


def test_the_weakness_literal_and_list_agree():
    assert list(typing.get_args(Weakness)) == list(WEAKNESSES), "generators/config.py: Weakness vs WEAKNESSES"


# --- the guide --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("heading, names", [
    ("Source kinds", KINDS), ("Catalog formats", DETECTED), ("Negative-control kinds", tuple(CONTROLS)),
    ("Stages", tuple(STAGES)), ("Exports", tuple(EXPORTS)),
], ids=["source kinds", "catalog formats", "control kinds", "stages", "exports"])
def test_the_guide_lists_exactly_the_registered_names(heading, names):
    """Each axis's heading in docs/extending.md lists its names (``## Stages: `synthesize`, ...``)."""
    line = next((x for x in GUIDE.read_text().splitlines() if x.startswith(f"## {heading}: ")), None)
    assert line is not None, f"docs/extending.md has no heading '## {heading}: ...'"
    assert sorted(re.findall(r"`([^`]+)`", line)) == sorted(names), f"docs/extending.md: {line!r} vs {sorted(names)}"
