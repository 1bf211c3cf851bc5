"""Config objects refuse what they do not know, with the nearest valid name, and refuse run names Prefect and the
corpus cannot take: wherever a config comes from (a file, the CLI, a flow parameter), the same model decides."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from generators.config import SynthesizeConfig
from generators.strict import RUN_NAME_PATTERN, StrictModel, describe
from stages.curate import CurateConfig
from stages.loop import LoopConfig  # with the imports below: every config model of the project is defined
from training.config import TrainConfig


def config_models() -> list[type[StrictModel]]:
    found, todo = [], [StrictModel]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return sorted(set(found), key=lambda c: c.__name__)


def misspelt(name: str) -> str:
    return name[:-1] if len(name) > 4 else name + "x"


def test_every_config_object_of_the_project_is_strict():
    names = {m.__name__ for m in config_models()}
    assert {"SynthesizeConfig", "SamplingConfig", "AgentsConfig", "RoleConfig", "VariantSeed", "EndpointConfig",
            "Sampling", "Budget", "CurateConfig", "NecessityConfig", "DifficultyConfig", "DedupConfig",
            "TrainConfig", "SFTSettings", "GRPOSettings", "EvalSettings", "LoopConfig",
            "SelectionSettings"} <= names


@pytest.mark.parametrize("model", config_models(), ids=lambda m: m.__name__)
def test_a_misspelt_key_is_an_error_naming_the_nearest_field(model):
    field = sorted(model.model_fields)[0]
    with pytest.raises(ValidationError) as err:
        model.model_validate({misspelt(field): 1})
    lines = describe(err.value, "config.json")
    assert lines[0] == f"unknown key {misspelt(field)!r} in config.json: did you mean {field!r}?", lines


def test_the_issue_example_n_task_says_did_you_mean_n_tasks():
    with pytest.raises(ValidationError) as err:
        SynthesizeConfig.model_validate({"n_task": 30})
    assert describe(err.value, "config.json") == ["unknown key 'n_task' in config.json: did you mean 'n_tasks'?"]


@pytest.mark.parametrize("model, data, line", [
    (SynthesizeConfig, {"agents": {"llm_task": 2}}, "unknown key 'agents.llm_task': did you mean 'llm_tasks'?"),
    (SynthesizeConfig, {"agents": {"endpoints": {"vllm": {"base_ur": "http://h/v1"}}}},
     "unknown key 'agents.endpoints.vllm.base_ur': did you mean 'base_url'?"),
    (SynthesizeConfig, {"sampling": {"depth_mx": 3}}, "unknown key 'sampling.depth_mx': did you mean 'depth_max'?"),
    (CurateConfig, {"necessity": {"treshold": 0.5}}, "unknown key 'necessity.treshold': did you mean 'threshold'?"),
    (TrainConfig, {"sft": {"max_step": 3}}, "unknown key 'sft.max_step': did you mean 'max_steps'?"),
    (TrainConfig, {"grpo": {"group_sise": 2}}, "unknown key 'grpo.group_sise': did you mean 'group_size'?"),
    (LoopConfig, {"curate": {"difficulty": {"kk": 0}}}, "unknown key 'curate.difficulty.kk': did you mean 'k'?"),
    (LoopConfig, {"synthesize": {"agents": {"user": {"sampling": {"temprature": 0.1}}}}},
     "unknown key 'synthesize.agents.user.sampling.temprature': did you mean 'temperature'?"),
])
def test_nested_misspelt_keys_name_their_whole_path(model, data, line):
    with pytest.raises(ValidationError) as err:
        model.model_validate(data)
    assert describe(err.value) == [line]


def test_a_key_like_no_field_lists_the_valid_ones_and_every_unknown_key_is_named():
    with pytest.raises(ValidationError) as err:
        SynthesizeConfig.model_validate({"zzzz": 1, "qqqq": 2})
    lines = describe(err.value, "c.json")
    assert lines[0].startswith("unknown key 'zzzz' in c.json: valid keys: agents, batch_size, ")
    assert lines[1] == "unknown key 'qqqq' in c.json"


def test_braces_in_an_unknown_key_are_not_formatted():
    with pytest.raises(ValidationError) as err:
        SynthesizeConfig.model_validate({"n_{hint}{message}": 1})
    assert "unknown key 'n_{hint}{message}'" in str(err.value)


def test_the_json_schema_forbids_unknown_keys_at_every_level():
    schema = SynthesizeConfig.model_json_schema()
    assert schema["additionalProperties"] is False
    assert all(d.get("additionalProperties") is False for d in schema["$defs"].values() if d.get("type") == "object"
               and "properties" in d), "a nested config of the UI form accepts unknown keys"


@pytest.mark.parametrize("model", [SynthesizeConfig, CurateConfig, TrainConfig, LoopConfig], ids=lambda m: m.__name__)
@pytest.mark.parametrize("name", ["my_run", "MyRun", "with space", "-leading", "a/b", "x" * 65, ""])
def test_run_names_prefect_cannot_key_are_refused_up_front(model, name):
    """Prefect artifact keys take only lowercase letters, digits and dashes: a name outside that used to pass,
    then crash every run with a misleading error and leave an orphan _runs/<name> folder."""
    with pytest.raises(ValidationError) as err:
        model(run_name=name)
    (line,) = describe(err.value)
    assert line.startswith("invalid run_name: ") and "lowercase letters, digits and dashes" in line, line


def test_a_refused_run_name_suggests_one_that_is_allowed():
    with pytest.raises(ValidationError) as err:
        SynthesizeConfig(run_name="My_Run 2")
    assert "e.g. 'my-run-2'" in describe(err.value)[0]
    assert SynthesizeConfig(run_name="my-run-2").run_id.startswith("my-run-2-")


@pytest.mark.parametrize("model", [SynthesizeConfig, CurateConfig, TrainConfig, LoopConfig], ids=lambda m: m.__name__)
def test_the_run_name_rule_is_in_the_json_schema_so_the_ui_form_shows_it(model):
    prop = model.model_json_schema()["properties"]["run_name"]
    assert prop["pattern"] == RUN_NAME_PATTERN
    assert "lowercase letters, digits and dashes" in prop["description"]


def test_the_loop_refuses_a_stage_name_its_rounds_could_not_use():
    """The loop names round r's runs ``<name>-r<r>``: a valid base name whose derived name is not is refused."""
    LoopConfig(rounds=20, synthesize={"run_name": "s" * 60})
    with pytest.raises(ValidationError) as err:
        LoopConfig(rounds=20, synthesize={"run_name": "s" * 61})
    assert "synthesize.run_name is too long" in describe(err.value)[0]
