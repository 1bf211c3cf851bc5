"""What a new user types cannot mislead: a misspelt key or option, a bad run name, a missing or malformed config
file, a command with no corpus, an unreachable Prefect API: each is one line naming the culprit and a non-zero
exit, before any run starts (so no default run, no orphan folder)."""

from __future__ import annotations

import json
import time

import pytest

from flows.cli import main
from tests.helpers import free_port


def run(argv: list[str], capsys) -> tuple[int, list[str]]:
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err.strip().splitlines()


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """A fresh directory: the default corpus data/corpus is not there."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_misspelt_key_in_the_config_file_is_refused_with_the_nearest_name(cwd, capsys):
    (cwd / "config.json").write_text(json.dumps({"n_task": 30}))
    code, lines = run(["synthesize", "--config", "config.json", "--corpus", "corpus"], capsys)
    assert code == 2
    assert lines == ["synthloop synthesize: unknown key 'n_task' in config.json: did you mean 'n_tasks'?"]
    assert not (cwd / "corpus").exists(), "the default run started anyway"


@pytest.mark.parametrize("command, data, line", [
    ("synthesize", {"agents": {"llm_task": 1}},
     "unknown key 'agents.llm_task' in config.json: did you mean 'llm_tasks'?"),
    ("curate", {"necessity": {"kk": 0}}, "unknown key 'necessity.kk' in config.json: did you mean 'k'?"),
    ("train", {"sft": {"max_step": 3}}, "unknown key 'sft.max_step' in config.json: did you mean 'max_steps'?"),
    ("loop", {"round": 3}, "unknown key 'round' in config.json: did you mean 'rounds'?"),
])
def test_every_command_refuses_misspelt_keys_nested_ones_too(cwd, capsys, command, data, line):
    (cwd / "config.json").write_text(json.dumps(data))
    code, lines = run([command, "--config", "config.json", "--corpus", "corpus"], capsys)
    assert (code, lines) == (2, [f"synthloop {command}: {line}"])


def test_a_misspelt_option_names_the_nearest_option(cwd, capsys):
    code, lines = run(["synthesize", "--n-taks", "30"], capsys)
    assert (code, lines) == (2, ["synthloop synthesize: unknown option --n-taks: did you mean --n-tasks?"])
    code, lines = run(["curate", "--necesity-tasks=3"], capsys)
    assert (code, lines) == (2, ["synthloop curate: unknown option --necesity-tasks: did you mean --necessity-tasks?"])


def test_a_missing_config_file_is_one_line_naming_it(cwd, capsys):
    code, lines = run(["synthesize", "--config", "nowhere.json"], capsys)
    assert (code, lines) == (2, ["synthloop synthesize: config file nowhere.json does not exist"])


@pytest.mark.parametrize("text, says", [
    ('{"n_tasks": 30,', "is not valid JSON: Expecting property name enclosed in double quotes at line 1 column 16"),
    ("[1, 2]", "must hold a JSON object of config fields, not a list"),
    (b"\xff\xfe{}", "is not UTF-8 text (byte 0)"),
    ("[" * 100_000 + "]" * 100_000, "is nested too deeply to be a config"),
])
def test_a_malformed_config_file_is_one_line_naming_it(cwd, capsys, text, says):
    path = cwd / "bad.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    for command in ("synthesize", "train"):
        code, lines = run([command, "--config", "bad.json"], capsys)
        assert (code, lines) == (2, [f"synthloop {command}: config file bad.json {says}"])


@pytest.mark.parametrize("argv", [
    ["synthesize", "--run-name", "my_run"],
    ["curate", "--run-name", "my_run"],
    ["train", "--run-name", "my_run"],
])
def test_an_underscore_run_name_is_refused_before_anything_is_written(cwd, capsys, argv):
    code, lines = run([*argv, "--corpus", "corpus"], capsys)
    assert code == 2
    assert len(lines) == 1 and "invalid run_name: 'my_run' is not allowed as a run name" in lines[0], lines
    assert "e.g. 'my-run'" in lines[0]
    assert not (cwd / "corpus").exists(), "an orphan folder was left for a run that cannot start"


@pytest.mark.parametrize("argv", [
    ["query", "SELECT count(*) FROM tasks"],
    ["export", "trl", "--out", "x.jsonl"],
    ["export", "verl", "--out", "x.parquet"],
    ["openenv"],
    ["audit"],
    ["train"],
    ["curate"],
])
def test_a_command_run_where_there_is_no_corpus_says_so(cwd, capsys, argv):
    code, lines = run(argv, capsys)
    assert (code, lines) == (2, [f"synthloop {argv[0]}: no corpus at data/corpus: run `synthloop synthesize` first "
                                 "or pass --corpus <folder>"])


def test_an_unreachable_prefect_api_fails_in_seconds_naming_its_url(cwd, capsys, monkeypatch):
    dead = f"http://127.0.0.1:{free_port()}/api"
    monkeypatch.setenv("PREFECT_API_URL", dead)
    start = time.monotonic()
    code, lines = run(["synthesize", "--n-tasks", "4", "--llm-tasks", "0", "--corpus", "corpus"], capsys)
    assert time.monotonic() - start < 30
    assert code == 3
    assert lines == [f"synthloop synthesize: the Prefect API at {dead} (PREFECT_API_URL) does not answer: start that "
                     "server, or unset PREFECT_API_URL to let synthloop start a local one"]
    assert not (cwd / "corpus").exists()


def test_flow_parameters_from_the_api_refuse_misspelt_keys_with_the_nearest_name():
    """A run created through the API or the UI gets its parameters validated by Prefect with the same models."""
    from prefect.exceptions import ParameterTypeError

    from flows.loop import loop
    from flows.synthesize import synthesize

    with pytest.raises(ParameterTypeError, match=r"config: unknown key 'n_task': did you mean 'n_tasks'\?"):
        synthesize.validate_parameters({"config": {"n_task": 30}})
    with pytest.raises(ParameterTypeError, match=r"unknown key 'llm_task': did you mean 'llm_tasks'\?"):
        loop.validate_parameters({"config": {"synthesize": {"agents": {"llm_task": 0}}}})
    with pytest.raises(ParameterTypeError, match="'my_run' is not allowed as a run name"):
        synthesize.validate_parameters({"config": {"run_name": "my_run"}})
    assert synthesize.validate_parameters({"config": {"n_tasks": 30}})["config"].n_tasks == 30


def test_the_ui_form_schema_of_every_flow_forbids_unknown_keys_and_shows_the_run_name_rule():
    from flows.curate import curate
    from flows.loop import loop
    from flows.synthesize import synthesize
    from flows.train import train

    for flow in (synthesize, curate, train, loop):
        schema = flow.parameters.model_dump()
        objects = [d for d in schema["definitions"].values() if "properties" in d]
        assert objects and all(d.get("additionalProperties") is False for d in objects), flow.name
        config = schema["definitions"][schema["properties"]["config"]["$ref"].rsplit("/", 1)[1]]
        assert config["properties"]["run_name"]["pattern"] == "^[a-z0-9][a-z0-9-]{0,63}$", flow.name


def test_a_logging_handler_failing_during_a_run_writes_nothing_that_would_glue_to_our_lines(capsys, monkeypatch):
    """Prefect's log shipper reports a failed batch on stderr without ending the line; the run's own one-line
    messages (a server gone, an endpoint down) must start on a line of their own, so nothing is written then."""
    import http.server
    import logging
    import threading

    from flows.server import prefect_api

    class Health(http.server.BaseHTTPRequestHandler):  # a live API as far as the health check goes
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"true")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{server.server_port}/api")

    class Failing(logging.Handler):
        def emit(self, record):
            try:
                raise ConnectionError("All connection attempts failed")
            except ConnectionError:
                self.handleError(record)

    log = logging.getLogger("synthloop-test-failing-handler")
    log.addHandler(Failing())
    log.propagate = False
    try:
        with prefect_api(watch=False):
            log.warning("lost")
        assert capsys.readouterr().err == ""
        log.warning("after the run")
        assert "All connection attempts failed" in capsys.readouterr().err, "the setting leaked past the run"
    finally:
        server.shutdown()
        log.handlers.clear()
