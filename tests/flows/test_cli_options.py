"""The command line is generated from the config models: a flag per top-level field, ``--set a.b=VALUE`` for
nested ones, ``--config`` files, with one precedence; the Prefect form shows the same knobs; one place maps a
failure to its exit status."""

from __future__ import annotations

import errno
import json

import pytest

from flows.cli import build_parser, config_model, exit_status, load_config, main
from flows.options import UsageError, field_at, flag_kind

COMMANDS = ("synthesize", "curate", "train", "loop")


def config_of(argv: list[str]):
    args = build_parser(argv[0]).parse_args(argv)
    return load_config(args)


def run(argv: list[str], capsys) -> tuple[int, list[str]]:
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err.strip().splitlines()


def test_set_reaches_a_nested_field():
    config = config_of(["synthesize", "--set", "agents.llm_tasks=0", "--set", "sampling.depth_max=3"])
    assert (config.agents.llm_tasks, config.sampling.depth_max) == (0, 3)
    assert config.agents.assistant.sampling.max_tokens == 256, "the rest of agents kept its defaults"


def test_set_values_are_json_or_else_text():
    config = config_of(["train", "--set", "sft=null", "--set", "run_name=nightly", "--set", "grpo.beta=0.5"])
    assert (config.sft, config.run_name, config.grpo.beta) == (None, "nightly", 0.5)
    config = config_of(["synthesize", "--set", 'domains=["retail"]'])
    assert config.domains == ["retail"]


def test_set_into_a_nested_config_keeps_its_other_defaults():
    """The loop's synthesize settings are small; setting one of them must not bring back the full-size rest."""
    config = config_of(["loop", "--set", "synthesize.n_tasks=50", "--set", "train.sft.max_steps=3"])
    assert config.synthesize.n_tasks == 50
    assert (config.synthesize.run_name, config.synthesize.batch_size, config.synthesize.agents.llm_tasks) == \
        ("loop", 100, 0)
    assert (config.train.sft.max_steps, config.train.sft.batch_size) == (3, 2)


def test_set_reaches_list_items_by_index(tmp_path):
    config = config_of(["synthesize", "--env", "a.b:C", "--set", "environments.0.name=shop",
                        "--set", 'environments.1={"kind": "module", "ref": "d.e:F"}'])
    assert [(s.ref, s.name) for s in config.environments] == [("a.b:C", "shop"), ("d.e:F", None)]
    with pytest.raises(UsageError, match="environments has 0 item"):
        config_of(["synthesize", "--set", "environments.3.name=x"])


def test_an_unknown_set_key_is_one_line_with_the_nearest_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, lines = run(["synthesize", "--set", "agents.llm_task=0", "--corpus", "corpus"], capsys)
    assert (code, lines) == (2, ["synthloop synthesize: unknown key 'agents.llm_task' in --set: did you mean "
                                 "'llm_tasks'?"])
    code, lines = run(["curate", "--set", "necesity.k=0"], capsys)
    assert (code, lines) == (2, ["synthloop curate: unknown key 'necesity' in --set: did you mean 'necessity'?"])
    code, lines = run(["train", "--set", "sft.max_steps"], capsys)
    assert (code, lines) == (2, ["synthloop train: --set sft.max_steps: give KEY=VALUE, e.g. --set "
                                 "agents.llm_tasks=0"])
    assert not (tmp_path / "corpus").exists()


def test_a_value_the_model_refuses_is_one_line_naming_the_field(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, lines = run(["synthesize", "--set", "agents.llm_tasks=-1"], capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("synthloop synthesize: invalid agents.llm_tasks:")
    code, lines = run(["loop", "--rounds", "0"], capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("synthloop loop: invalid rounds:")


def test_precedence_defaults_then_config_file_then_flags_then_set(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"n_tasks": 5, "seed": 9, "agents": {"llm_tasks": 1}}))
    assert config_of(["synthesize"]).n_tasks == 1400
    from_file = config_of(["synthesize", "--config", str(path)])
    assert (from_file.n_tasks, from_file.seed, from_file.agents.llm_tasks) == (5, 9, 1)
    flag = config_of(["synthesize", "--config", str(path), "--n-tasks", "6", "--llm-tasks", "2"])
    assert (flag.n_tasks, flag.seed, flag.agents.llm_tasks) == (6, 9, 2)
    both = config_of(["synthesize", "--set", "n_tasks=7", "--n-tasks", "6", "--config", str(path),
                      "--set", "agents.llm_tasks=3", "--llm-tasks", "2"])
    assert (both.n_tasks, both.seed, both.agents.llm_tasks) == (7, 9, 3)


def test_a_stage_the_config_file_skips_stays_skipped(tmp_path):
    """``"sft": null`` in the file skips SFT, as it does in the Prefect form (the old mapper turned it back on)."""
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"sft": None}))
    assert config_of(["train", "--config", str(path)]).sft is None
    assert config_of(["train", "--config", str(path), "--max-steps", "3"]).sft.max_steps == 3


@pytest.mark.parametrize("old, new", [
    (["curate", "--no-tool-k", "0", "--necessity-tasks", "5", "--continuation", "model", "--rollouts", "2",
      "--difficulty-tasks", "3"],
     ["curate", "--set", "necessity.k=0", "--set", "necessity.max_tasks=5", "--set", "necessity.continuation=model",
      "--set", "difficulty.k=2", "--set", "difficulty.max_tasks=3"]),
    (["train", "--max-steps", "3", "--batch-size", "4", "--adapter", "lora", "--grpo-steps", "2", "--group-size", "8",
      "--engine", "vllm", "--eval-tasks", "6"],
     ["train", "--set", "sft.max_steps=3", "--set", "sft.batch_size=4", "--set", "sft.adapter=lora",
      "--set", "grpo.max_steps=2", "--set", "grpo.group_size=8", "--set", "grpo.engine=vllm",
      "--set", "evaluation.tasks=6"]),
    (["train", "--max-steps", "3", "--no-sft", "--no-grpo"], ["train", "--set", "sft=null", "--set", "grpo=null"]),
    (["synthesize", "--llm-tasks", "0"], ["synthesize", "--set", "agents.llm_tasks=0"]),
])
def test_the_short_flags_users_already_type_are_the_set_keys_they_name(old, new):
    assert config_of(old) == config_of(new)


def test_list_fields_take_comma_separated_values_and_sources_keep_their_rules(tmp_path):
    assert config_of(["curate", "--runs", "a-1,b-2"]).runs == ["a-1", "b-2"]
    config = config_of(["synthesize", "--env", "bookshop.domain:Bookshop"])
    assert config.domains == [] and [s.kind for s in config.environments] == ["module"]
    config = config_of(["synthesize", "--env", "bookshop.domain:Bookshop", "--domains", "retail"])
    assert config.domains == ["retail"]


def test_base_url_is_one_endpoint_for_every_role():
    config = config_of(["synthesize", "--base-url", "http://h:1/v1", "--model", "m", "--max-concurrency", "3"])
    assert config.agents.endpoints["cli"].model == "m" and config.agents.endpoints["cli"].max_concurrency == 3
    roles = (config.agents.assistant, config.agents.user, config.agents.task_writer)
    assert {role.endpoint for role in roles} == {"cli"}
    config = config_of(["curate", "--base-url", "http://h:1/v1"])
    assert (config.necessity.endpoint, config.difficulty.endpoint) == ("cli", "cli")


@pytest.mark.parametrize("command", COMMANDS)
def test_help_lists_every_field_with_its_description(command):
    sub = build_parser(command).commands[command]
    text = " ".join(sub.format_help().split())
    model = config_model(command)
    for name, field in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        assert flag in sub.option_names or f"  {name}" in sub.format_help(), (command, name)
        if flag_kind(field.annotation) and field.description:
            assert " ".join(field.description.split()[:4]) in text, (command, name)


def flow_of(command: str):
    import importlib

    return getattr(importlib.import_module(f"flows.{command}"), command)


# flow parameters that are not config fields, and the option that gives each on the command line;
# curate's ``sources`` is set by `synthloop repair` only
FLOW_OPTIONS = {"corpus_root": "--corpus", "workers": "--workers", "ray": "--ray"}


@pytest.mark.parametrize("command", COMMANDS)
def test_the_cli_and_the_prefect_form_are_the_same_knobs(command):
    flow = flow_of(command)
    schema = flow.parameters.model_dump()
    model = config_model(command)
    definitions = schema["definitions"]
    config = definitions[schema["properties"]["config"]["$ref"].rsplit("/", 1)[1]]
    assert set(config["properties"]) == set(model.model_fields), "the form and the model differ"
    sub = build_parser(command).commands[command]
    for name, field in model.model_fields.items():
        assert config["properties"][name].get("description") == field.description, (command, name)
        # every field is reachable: its own flag, documented as in the form, or --set (which checks the key
        # against the same model)
        flag = "--" + name.replace("_", "-")
        if flag in sub.option_names:
            shown = sub._option_string_actions[flag].help.replace("%%", "%")
            assert shown.startswith(config["properties"][name].get("description") or "("), (command, name)
        else:
            field_at(model, [name])
    for name in schema["properties"]:
        if name == "config" or (command, name) == ("curate", "sources"):
            continue
        assert FLOW_OPTIONS[name] in sub.option_names, (command, name)


def test_every_nested_key_a_set_names_exists_in_the_model():
    model = config_model("synthesize")
    assert field_at(model, ["agents", "endpoints", "cli", "base_url"]) is not None
    with pytest.raises(UsageError, match="unknown key 'agents.endpoints.cli.base_ur' in --set: did you mean "
                                         "'base_url'"):
        field_at(model, ["agents", "endpoints", "cli", "base_ur"])


def test_one_place_maps_a_failure_to_its_exit_status(capsys):
    from pydantic import ValidationError

    from flows.server import PrefectUnreachable
    from generators.llm import EndpointUnreachable
    from storage import CorpusDamaged

    try:
        config_model("train")(run_name="A b")
    except ValidationError as exc:
        invalid = exc
    said = PrefectUnreachable("gone")
    said.said = True
    cases = [(UsageError("no corpus"), "train", 2, "synthloop train: no corpus"),
             (invalid, "train", 2, "synthloop train: invalid run_name:"),
             (PrefectUnreachable("the Prefect API does not answer"), "curate", 3, "synthloop curate: the Prefect"),
             (said, "curate", 3, None),
             (EndpointUnreachable("endpoint 'cli' does not answer"), "curate", 3, "synthloop curate stopped: endpoint"),
             (ConnectionError("no Ray cluster answers"), "synthesize", 3, "synthloop synthesize stopped: no Ray"),
             (CorpusDamaged([], "corpus"), "train", 2, "synthloop train failed:"),
             (OSError(errno.ENOSPC, "No space left on device", "corpus/x"), "synthesize", 4,
              "synthloop synthesize: No space left on device: corpus/x; free some space")]
    for exc, command, status, line in cases:
        assert exit_status(exc, command) == status, exc
        err = capsys.readouterr().err
        assert err.startswith(line) if line else err == "", (exc, err)
    assert exit_status(ValueError("a bug"), "synthesize") is None, "an unexpected error keeps its traceback"
    assert exit_status(KeyError("a bug"), "train") is None


def test_the_bfcl_commands_question_options_are_the_train_flows_bfcl_settings(capsys):
    """One declaration of the BFCL knobs: ``synthloop bfcl``'s options and the train flow's ``bfcl`` are the same
    model, with the same defaults and the same refusals."""
    from flows.options import build_config
    from training.bfcl_eval import BfclSettings
    from training.config import TrainConfig

    args = build_parser("bfcl").parse_args(["bfcl", "--per-category", "3", "--categories", "simple_python,irrelevance",
                                            "--set", "seed=7"])
    assert build_config(BfclSettings, args) == BfclSettings(categories=["simple_python", "irrelevance"],
                                                            per_category=3, seed=7)
    assert build_config(BfclSettings, build_parser("bfcl").parse_args(["bfcl"])) == BfclSettings()
    assert TrainConfig(bfcl={}).bfcl == BfclSettings()
    assert main(["bfcl", "--categories", "multi_turn_nope", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]) == 2
    assert "BFCL categories ['multi_turn_nope'] are not among" in capsys.readouterr().err
