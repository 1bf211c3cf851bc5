"""Helpers shared by tests (no side effects on import, unlike conftest.py)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env(api_url: str | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    if api_url:
        env["PREFECT_API_URL"] = api_url
    env.update(extra)
    return env


def execute_steps(env, calls):
    """Hand-built executed plan steps on a fork of ``env``: ``(tool, args)`` per call, each argument a literal
    or ``{"$ref": "sK", "path": [...]}``; returns (working env in its final state, steps, initial rows)."""
    from generators.tasks import ExecutedStep, resolve

    work = env.fork()
    initial = work.rows()
    steps = []
    for i, (tool, args) in enumerate(calls):
        refs = {p: v for p, v in args.items() if isinstance(v, dict)}
        values = {p: resolve(steps[int(v["$ref"][1:])].result, v["path"]) if p in refs else v for p, v in args.items()}
        result, error = work.execute(tool, values)
        assert error is None, error
        parents = sorted({v["$ref"] for v in refs.values()})
        level = 1 + max((s.level for s in steps if s.id in parents), default=-1)
        steps.append(ExecutedStep(f"s{i}", tool, args, values, result, level, parents))
    return work, steps, initial


SCRIPTED = {"llm_tasks": 0}  # agents config of tests that need no model: scripted user and oracle assistant only


def task_from_calls(env, calls, private_share: float = 0.0):
    """A task built from hand-picked executed calls (see ``execute_steps``), phrased as the pipeline phrases it."""
    import random

    from generators.config import SamplingConfig
    from generators.tasks import build_task

    work, steps, initial = execute_steps(env, calls)
    task = build_task(env=env, work=work, steps=steps, initial=initial, rng=random.Random(0),
                      config=SamplingConfig(private_share=private_share), task_id="hand", run_id="test", batch=0,
                      sampler_seed=0)
    assert task is not None
    return task


def pids_with_marker(marker: str) -> set[int]:
    """Processes whose command line contains marker (sandbox children carry the entrypoint)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.add(int(entry))
            except OSError:
                continue
    return found


def need_mcp_server(servers: dict, name: str) -> None:
    """Skip where a reference MCP server could not be installed here; in CI (``CI`` set) that is a failure, since
    the tests that claim real servers work must run on real servers."""
    import os

    import pytest

    if not servers[name]:
        message = f"mcp-server-{name} is not installed: {servers['log'][-500:]}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def pids_cgroup_available() -> bool:
    """Whether a sandbox that may start processes can be bounded here (a pids cgroup can be made)."""
    from sandbox import SandboxUnavailable, pids_cgroup_parent

    try:
        pids_cgroup_parent()
        return True
    except SandboxUnavailable:
        return False


def need_pids_cgroup() -> None:
    """Skip where no pids cgroup can be made (such servers are refused there, which the refusal tests cover); in
    CI (``CI`` set) that is a failure, since CI runs as root with cgroup v1's pids controller, where the tests
    claiming that programs run bounded must run."""
    import os

    import pytest

    from sandbox import SandboxUnavailable, pids_cgroup_parent

    try:
        pids_cgroup_parent()
    except SandboxUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"no pids cgroup here: {exc.reason}")
        pytest.skip(f"no pids cgroup here: {exc.reason}")


def scripted_corpus(root, *, run_name: str, n_tasks: int, depth_max: int, catalog: bool = False):
    """A one-batch corpus synthesized by the scripted agents (no model), its manifest carrying the config so
    ``generators.sources.Environments`` reopens each task's environment; ``catalog``: with the run's ``tools``
    and ``tool_edges`` too, as the synthesize flow writes them (the exports read the tools' schemas there)."""
    from generators.config import SynthesizeConfig
    from generators.sources import open_sources
    from stages.synthesize import catalog_rows, run_batch
    from storage import Corpus

    corpus = Corpus(root)
    config = SynthesizeConfig(run_name=run_name, n_tasks=n_tasks, batch_size=n_tasks, agents=SCRIPTED,
                              sampling={"depth_max": depth_max})
    if catalog:
        sources = open_sources(config)
        try:
            corpus.write_batch(config.run_id, "catalog", 0, catalog_rows(sources), {"domains": list(sources)})
        finally:
            for src in sources.values():
                src.close()
    result = run_batch(config, 0)
    corpus.write_batch(config.run_id, "synthesize", 0, result.tables, result.summary)
    corpus.write_manifest(config.run_id, {"stage": "synthesize", "status": "complete", "config": config.model_dump()})
    return corpus


def recorded(corpus, role: str, *, accepted_only: bool = False) -> list:
    """The stored trajectories of one role (``reference``, a control kind), optionally of accepted tasks only."""
    from schemas import Trajectory

    accepted = {r["task_id"] for r in corpus.read("tasks") if r["accepted"]} if accepted_only else None
    return [Trajectory(**{k: v for k, v in r.items() if k != "schema_version"})
            for r in corpus.read("trajectories")
            if r["role"] == role and (accepted is None or r["task_id"] in accepted)]
