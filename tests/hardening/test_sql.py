"""Split names and users' queries cannot make DuckDB touch a host file.

A split name (``--split``, a config's ``sft.split`` / ``grpo.split``, a Prefect flow parameter) was formatted into
SQL as ``split_{name}``, and a ``--query`` was pasted into ``FROM ({query})``: a name could end the statement and
``COPY ... TO`` any path, or ``UNION`` in the rows of ``read_csv`` of any file (they came back in the error naming
the missing task). Each attack goes through a real entry point (the CLI in a subprocess, the interop library, the
training loaders as a config reaches them) and checks that no file was written or read, and that what the user
sees is one line naming the known splits or the refusal.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO, scripted_corpus

SECRET = "s3cr3t-marker-4b1d"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return scripted_corpus(tmp_path_factory.mktemp("sql-corpus"), run_name="sql", n_tasks=12, depth_max=2)


@pytest.fixture
def target(tmp_path):
    """Where an attack would write, and a file whose content it would read."""
    secret = tmp_path / "secret.txt"
    secret.write_text(f"{SECRET}-1\n{SECRET}-2\n")
    return tmp_path / "pwned.csv", secret


def copy_split(path) -> str:
    return f"sft_v1; COPY (SELECT 42) TO '{path}' (FORMAT csv); --"


def union_split(secret) -> str:
    return f"sft_v1 UNION SELECT column0, column0 FROM read_csv('{secret}', header = false) --"


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def one_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr[-2000:])
    return lines[0]


@pytest.mark.parametrize("command", ["export", "mcp"])
def test_a_split_name_cannot_copy_to_a_host_file(corpus, target, tmp_path, command):
    pwned, _ = target
    args = (["export", "verl", "--out", str(tmp_path / "v.parquet")] if command == "export" else ["mcp"])
    line = one_line(cli(*args, "--corpus", str(corpus.root), "--split", copy_split(pwned)))
    assert not pwned.exists(), "the split name ran a COPY"
    assert "unknown split" in line and line.endswith("known: sft_v1, rl_v1")


def test_a_split_name_cannot_read_a_host_file(corpus, target, tmp_path):
    _, secret = target
    for split in (union_split(secret), union_split("/etc/passwd")):
        done = cli("export", "verl", "--out", str(tmp_path / "v.parquet"), "--corpus", str(corpus.root),
                   "--split", split)
        line = one_line(done)
        assert SECRET not in done.stdout + done.stderr and "root:x:0:0" not in done.stdout + done.stderr
        assert "unknown split" in line


def test_an_unknown_split_names_the_known_ones(corpus, tmp_path):
    line = one_line(cli("export", "verl", "--out", str(tmp_path / "v.parquet"), "--corpus", str(corpus.root),
                        "--split", "sft_v9"))
    assert line == "synthloop export failed: unknown split 'sft_v9'; known: sft_v1, rl_v1"


def test_a_split_of_an_uncurated_corpus_says_to_curate(corpus, tmp_path):
    out = tmp_path / "rl.parquet"
    line = one_line(cli("export", "rl_v1", "--out", str(out), "--corpus", str(corpus.root)))
    assert f"`synthloop curate --corpus {corpus.root}` first" in line and not out.exists()
    from interop import TaskLibrary

    with pytest.raises(ValueError, match="has not been curated"):
        TaskLibrary(corpus).keys(split="rl_v1")


def test_the_interop_library_refuses_hostile_split_names(corpus, target):
    from interop import TaskLibrary
    from interop.trl_env import trl_dataset

    pwned, secret = target
    library = TaskLibrary(corpus)
    try:
        for split in (copy_split(pwned), union_split(secret)):
            with pytest.raises(ValueError, match="unknown split") as raised:
                library.keys(split=split)
            assert SECRET not in str(raised.value)
            with pytest.raises(ValueError, match="unknown split"):
                trl_dataset(library, split=split)
    finally:
        library.close()
    assert not pwned.exists()


@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_a_training_config_cannot_carry_sql_in_a_split_name(corpus, target, stage):
    """The loaders as a ``--config`` file or a Prefect flow parameter reaches them: validated settings."""
    from training.grpo import GRPOSettings, task_pool
    from training.sft import SFTSettings, training_rows

    pwned, _ = target
    settings, load = (SFTSettings, training_rows) if stage == "sft" else (GRPOSettings, task_pool)
    for key in (["split"] if stage == "sft" else ["split", "fallback_split"]):
        with pytest.raises(ValueError, match="unknown split"):
            load(corpus, settings.model_validate({key: copy_split(pwned)}))
        assert not pwned.exists(), f"{stage}.{key} ran a COPY"


def test_the_train_command_refuses_a_hostile_split_before_it_starts(corpus, target, tmp_path):
    pwned, _ = target
    config = tmp_path / "train.json"
    config.write_text('{"sft": {"split": "' + copy_split(pwned).replace("'", "\\u0027") + '"}}')
    line = one_line(cli("train", "--corpus", str(corpus.root), "--config", str(config)))
    assert "invalid sft.split: unknown split" in line and not pwned.exists()


def test_a_query_cannot_add_a_statement(corpus, target, tmp_path):
    pwned, _ = target
    query = (f"SELECT run_id, task_id FROM tasks); COPY (SELECT 42) TO '{pwned}' (FORMAT csv); "
             "SELECT run_id, task_id FROM (SELECT run_id, task_id FROM tasks")
    line = one_line(cli("export", "verl", "--out", str(tmp_path / "v.parquet"), "--corpus", str(corpus.root),
                        "--query", query))
    assert not pwned.exists() and "query" in line


def test_a_query_reads_the_corpus_and_no_other_file(corpus, target, tmp_path):
    _, secret = target
    out = tmp_path / "v.parquet"
    query = f"SELECT column0 AS run_id, column0 AS task_id FROM read_csv('{secret}', header = false)"
    done = cli("export", "verl", "--out", str(out), "--corpus", str(corpus.root), "--query", query)
    line = one_line(done)
    assert SECRET not in done.stdout + done.stderr and "Permission Error" in line
    # the feature itself still works: a query over the corpus's own views
    done = cli("export", "verl", "--out", str(out), "--corpus", str(corpus.root),
               "--query", "SELECT run_id, task_id FROM accepted_tasks ORDER BY task_id LIMIT 2")
    assert done.returncode == 0 and "wrote 2 rows" in done.stdout, done.stderr


def test_synthloop_query_cannot_write_a_host_file(corpus, target):
    pwned, secret = target
    done = cli("query", "--corpus", str(corpus.root), f"COPY (SELECT 42) TO '{pwned}' (FORMAT csv)")
    assert done.returncode == 2 and not pwned.exists()
    done = cli("query", "--corpus", str(corpus.root), f"SELECT * FROM read_csv('{secret}', header = false)")
    assert done.returncode == 2 and SECRET not in done.stdout + done.stderr
    done = cli("query", "--corpus", str(corpus.root), "SELECT count(*) AS n FROM split_sft_v1", "--format", "csv")
    assert done.returncode == 0 and done.stdout.splitlines()[0] == "n", done.stderr
