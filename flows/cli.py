"""The ``synthloop`` command."""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import sys
import time
from pathlib import Path

from flows.server import apply_offline_env, console_without_tracebacks, prefect_api

DEFAULT_CORPUS = "data/corpus"


class UsageError(Exception):
    """A mistake in what the user gave (a config file, a folder): printed as one line, exit status 2."""


def read_config_file(path: str | None) -> dict:
    """The JSON object in a ``--config`` file ({} without one); a missing or malformed file is a ``UsageError``
    naming it, never a traceback."""
    if not path:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"config file {path} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"config file {path} is a folder, not a JSON file") from None
    except PermissionError:
        raise UsageError(f"config file {path} cannot be read (permission denied)") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"config file {path} is not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"config file {path} is not valid JSON: {exc.msg} at line {exc.lineno} column "
                         f"{exc.colno}") from None
    except RecursionError:
        raise UsageError(f"config file {path} is nested too deeply to be a config") from None
    if not isinstance(data, dict):
        raise UsageError(f"config file {path} must hold a JSON object of config fields, not a "
                         f"{type(data).__name__}") from None
    return data


def require_corpus(path: str):
    """The corpus at ``path``, or a ``UsageError`` saying there is none (DuckDB would otherwise answer a query
    with "Table with name tasks does not exist! Did you mean pg_tablespace?")."""
    from storage import Corpus

    if not (Path(path) / "_runs").is_dir():
        raise UsageError(f"no corpus at {path}: run `synthloop synthesize` first or pass --corpus <folder>")
    return Corpus(path)


def synthesize_config(args: argparse.Namespace):
    """The SynthesizeConfig of a command line: --config, then the options over it (serve uses it too)."""
    from generators.config import SynthesizeConfig

    data = read_config_file(args.config)
    for key in ("n_tasks", "batch_size", "seed", "run_name"):
        value = getattr(args, key, None)
        if value is not None:
            data[key] = value
    sources = [{"kind": "catalog", "ref": str(Path(ref).resolve())} for ref in getattr(args, "catalog", None) or []]
    mcp_extra = {**({"state": str(Path(args.mcp_state).resolve())} if getattr(args, "mcp_state", None) else {}),
                 **({"programs": args.mcp_programs} if getattr(args, "mcp_programs", None) else {}),
                 **({"http": args.mcp_http} if getattr(args, "mcp_http", None) else {})}
    sources += [{"kind": "mcp", "ref": ref, **mcp_extra} for ref in getattr(args, "mcp", None) or []]
    sources += [{"kind": "module", "ref": ref,
                 **({"path": str(Path(args.env_path).resolve())} if getattr(args, "env_path", None) else {})}
                for ref in getattr(args, "env", None) or []]
    if sources:
        data["environments"] = [*data.get("environments", []), *sources]
    if args.domains is not None:
        data["domains"] = [d for d in args.domains.split(",") if d]
    elif sources and "domains" not in data:
        data["domains"] = []  # the user's own tools only, unless built-in domains are asked for too
    agents = data.setdefault("agents", {})
    if getattr(args, "llm_tasks", None) is not None:
        agents["llm_tasks"] = args.llm_tasks
    if getattr(args, "base_url", None):
        # one named endpoint for every LLM role: the same flow on vLLM, OpenAI or any compatible server
        endpoint = {"base_url": args.base_url, "model": args.model or "default",
                    "structured_output": args.structured_output or "json_schema"}
        if args.max_concurrency:
            endpoint["max_concurrency"] = args.max_concurrency
        agents.setdefault("endpoints", {})["cli"] = endpoint
        for role in ("assistant", "user", "task_writer"):
            agents.setdefault(role, {})["endpoint"] = "cli"
    return SynthesizeConfig(**data)


def cmd_synthesize(args: argparse.Namespace) -> int:
    from generators.embedded import EmbeddedModelError
    from generators.llm import EndpointUnavailable, EndpointUnreachable, LLMError

    config = synthesize_config(args)
    with prefect_api(args.port):
        from flows.synthesize import synthesize  # after the API URL is set: Prefect reads it on import
        console_without_tracebacks()

        try:
            summary = synthesize(config=config, corpus_root=args.corpus, workers=args.workers, ray=args.ray)
        except ConnectionError as exc:  # --ray: no cluster answers
            print(f"synthesize stopped: {exc}", file=sys.stderr)
            return 3
        except (EndpointUnreachable, EndpointUnavailable, LLMError, EmbeddedModelError) as exc:
            # what was finished is kept; the same command resumes (answers so far are in the request cache)
            print(f"synthesize stopped: {exc}", file=sys.stderr)
            return 3
    cov = summary["coverage"]
    print(json.dumps({k: summary[k] for k in ("run_id", "tasks", "accepted", "acceptance_rate", "trajectories")}
                     | {"coverage": cov, "llm": summary["llm"], "llm_usage": summary["llm_usage"],
                        "embedded_server_requests": summary["embedded_server_requests"]}, indent=2))
    return 0


def _load_curate_config(args: argparse.Namespace):
    from flows.probes import CurateConfig

    data = read_config_file(args.config)
    for key in ("run_name", "seed", "batch_size"):
        if getattr(args, key, None) is not None:
            data[key] = getattr(args, key)
    if args.runs:
        data["runs"] = args.runs.split(",")
    for probe, k, n in (("necessity", args.no_tool_k, args.necessity_tasks), ("difficulty", args.rollouts, args.difficulty_tasks)):
        if k is not None:
            data.setdefault(probe, {})["k"] = k
        if n is not None:
            data.setdefault(probe, {})["max_tasks"] = n
    if args.continuation:
        data.setdefault("necessity", {})["continuation"] = args.continuation
    if args.base_url:
        endpoint = {"base_url": args.base_url, "model": args.model or "default",
                    "structured_output": args.structured_output or "json_schema"}
        data.setdefault("endpoints", {})["cli"] = endpoint
        for probe in ("necessity", "difficulty"):
            data.setdefault(probe, {})["endpoint"] = "cli"
    if args.model_version:
        data["model_version"] = args.model_version
    return CurateConfig(**data)


def cmd_curate(args: argparse.Namespace) -> int:
    from generators.embedded import EmbeddedModelError
    from generators.llm import EndpointUnavailable, EndpointUnreachable, LLMError

    config = _load_curate_config(args)
    require_corpus(args.corpus)
    with prefect_api(args.port):
        from flows.curate import curate
        console_without_tracebacks()

        try:
            summary = curate(config=config, corpus_root=args.corpus)
        except (EndpointUnreachable, EndpointUnavailable, LLMError, EmbeddedModelError) as exc:
            print(f"curate stopped: {exc}", file=sys.stderr)
            return 3
        except (ValueError, FileNotFoundError) as exc:
            print(f"curate failed: {exc}", file=sys.stderr)
            return 2
    print(json.dumps({k: v for k, v in summary.items() if k != "pass_rates"}, indent=2, default=str))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from training.config import TrainConfig

    data = read_config_file(args.config)
    if args.run_name:
        data["run_name"] = args.run_name
    if args.no_sft:
        data["sft"] = None
    else:
        sft = data.setdefault("sft", {}) or {}
        for key in ("max_steps", "batch_size", "policy", "adapter"):
            if getattr(args, key, None) is not None:
                sft[key] = getattr(args, key)
        data["sft"] = sft
    if args.no_grpo:
        data["grpo"] = None
    else:
        grpo = data.setdefault("grpo", {}) or {}
        for key, name in (("grpo_steps", "max_steps"), ("group_size", "group_size"), ("engine", "engine")):
            if getattr(args, key, None) is not None:
                grpo[name] = getattr(args, key)
        data["grpo"] = grpo
    if args.eval_tasks:
        data.setdefault("evaluation", {})["tasks"] = args.eval_tasks
    config = TrainConfig(**data)
    require_corpus(args.corpus)
    with prefect_api(args.port):
        from flows.train import train
        console_without_tracebacks()

        try:
            summary = train(config=config, corpus_root=args.corpus)
        except ValueError as exc:
            print(f"train failed: {exc}", file=sys.stderr)
            return 2
    print(json.dumps(summary, indent=2, default=str))
    return 0


def cmd_bfcl(args: argparse.Namespace) -> int:
    """BFCL accuracy per category of a local policy or an endpoint's model; needs no Prefect."""
    from generators.llm import EndpointUnavailable, EndpointUnreachable, LLMError
    from training.bfcl_eval import EndpointAgent, LocalAgent, bfcl_accuracy, format_table
    from training.policy import PolicyError

    if args.base_url and args.policy:
        print("bfcl: give --policy or --base-url, not both", file=sys.stderr)
        return 2
    if args.base_url and not args.model:
        print("bfcl: --base-url needs --model (the model name the endpoint serves)", file=sys.stderr)
        return 2
    categories = args.categories.split(",") if args.categories else None
    try:
        if args.base_url:
            agent = EndpointAgent(base_url=args.base_url, model=args.model, max_concurrency=args.max_concurrency,
                                  **({"max_tokens": args.max_new_tokens} if args.max_new_tokens else {}))
        else:
            agent = LocalAgent.from_path(args.policy, **({"max_new_tokens": args.max_new_tokens}
                                                         if args.max_new_tokens else {}))
        kwargs = {"categories": categories} if categories else {}
        result = bfcl_accuracy(agent, args.root, per_category=args.per_category, seed=args.seed,
                               log=lambda line: print(line, file=sys.stderr, flush=True), **kwargs)
    except (EndpointUnreachable, EndpointUnavailable, LLMError) as exc:
        print(f"bfcl stopped: {exc}", file=sys.stderr)
        return 3
    except (PolicyError, ValueError, FileNotFoundError) as exc:
        print(f"bfcl failed: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, default=str) if args.json else format_table(result))
    return 0


def cmd_loop(args: argparse.Namespace) -> int:
    from flows.loop import LoopConfig

    data = read_config_file(args.config)
    if args.rounds:
        data["rounds"] = args.rounds
    config = LoopConfig(**data)
    with prefect_api(args.port):
        from flows.loop import loop
        console_without_tracebacks()

        try:
            summary = loop(config=config, corpus_root=args.corpus)
        except ValueError as exc:
            print(f"loop failed: {exc}", file=sys.stderr)
            return 2
    print(json.dumps(summary, indent=2, default=str))
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    con = require_corpus(args.corpus).connect()
    try:
        rel = con.sql(args.sql)
    except Exception as exc:  # DuckDB's message names the table or column at fault
        print(f"query failed: {exc}", file=sys.stderr)
        return 2
    if rel is None:
        return 0
    if args.format == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(rel.columns)
        writer.writerows(rel.fetchall())
    elif args.format == "json":
        cols = rel.columns
        for row in rel.fetchall():
            print(json.dumps(dict(zip(cols, row)), default=str))
    else:
        rel.show(max_rows=args.max_rows, max_width=200)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from storage import export_selection, export_trl

    corpus = require_corpus(args.corpus)
    try:
        if args.format == "trl":
            n = export_trl(corpus, args.out, run_id=args.run_id)
        else:
            n = export_selection(corpus, args.format, args.out)
    except ValueError as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {n} rows to {args.out}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    own_server = not os.environ.get("PREFECT_API_URL")
    with prefect_api(args.port) as api_url:
        from flows.serve import deploy_to_pool, serve_deployments

        ui = api_url.removesuffix("/api")
        if not args.pool:
            print(f"Serving deployments against {api_url}; open the UI at {ui}", flush=True)
            serve_deployments(cron=args.cron, corpus_root=args.corpus, config=synthesize_config(args), ray=args.ray)
            return 0
        names = deploy_to_pool(args.pool, cron=args.cron, corpus_root=args.corpus, config=synthesize_config(args),
                               ray=args.ray)
        print(f"Deployed {', '.join(names)} to work pool {args.pool!r} on {api_url}; runs started from the UI "
              f"({ui}) wait there for workers:\n    PREFECT_API_URL={api_url} prefect worker start --pool "
              f"{args.pool}", flush=True)
        if own_server:  # the local server lives as long as this command: keep it up for the workers
            print("Keeping the local Prefect server up for them; Ctrl-C stops it.", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from generators.sources import Environments
    from verifiers.audit import audit

    corpus = require_corpus(args.corpus)
    with Environments(corpus) as environments:
        report = audit(corpus, run_id=args.run_id, sample=args.sample, seed=args.seed,
                       environment=environments.open)
    print(json.dumps(report, indent=2))
    bad = report["recheck"].get("reference_failed", 0) + report["recheck"].get("control_accepted", 0)
    return 1 if bad else 0


def cmd_schemas(args: argparse.Namespace) -> int:
    from schemas import TABLES

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, table in TABLES.items():
        (out / f"{name}.schema.json").write_text(json.dumps(table.json_schema, indent=2))
        (out / f"{name}.arrow.txt").write_text(table.arrow_schema.to_string())
    print(f"wrote JSON and Arrow schemas of {len(TABLES)} tables to {out}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from storage import Corpus
    from storage.integrity import diagnose

    root = Path(args.root)
    if not (root / "_runs").is_dir():
        print(f"no corpus at {root} (no _runs folder); pass --root", file=sys.stderr)
        return 2
    report = diagnose(Corpus(root))
    print("\n".join(report.lines()))
    return 1 if report.damaged else 0


def cmd_repair(args: argparse.Namespace) -> int:
    root = Path(args.root)
    if not (root / "_runs").is_dir():
        print(f"no corpus at {root} (no _runs folder); pass --root", file=sys.stderr)
        return 2
    with prefect_api(args.port):
        from flows.repair import repair  # after the API URL is set: Prefect reads it on import

        outcome = repair(root)
    print("\n".join(outcome.lines()))
    return 1 if outcome.after is None or outcome.after.damaged else 0


def cmd_compact(args: argparse.Namespace) -> int:
    """``compact [RUN ...]``: complete runs' batch shards rewritten as a few large sorted files
    (``storage.compaction``)."""
    from storage.compaction import NotCompactable, compact_run, pending_runs

    corpus = require_corpus(args.corpus)
    runs = args.runs or pending_runs(corpus)
    if not runs:
        print(f"nothing to compact in {corpus.root}: every complete run is compacted")
        return 0
    failed = 0
    for run in runs:
        try:
            print(compact_run(corpus, run).line(), flush=True)
        except NotCompactable as exc:
            print(f"synthloop compact: {exc}", file=sys.stderr)
            failed += 1
    if (corpus.root / "catalog.duckdb").exists():
        corpus.write_catalog()  # its views name files by path: the compacted runs' shards are gone
    return 1 if failed else 0


def cmd_catalog(args: argparse.Namespace) -> int:
    """``catalog inspect FILE``: what a catalog file imports, what it skips and why, and its tool graph's size."""
    from generators.catalog import CatalogError, import_catalog
    from generators.graph import ToolGraph

    try:
        result = import_catalog(args.file, format=args.format, strict=args.strict)
    except CatalogError as exc:
        if args.json:
            print(json.dumps({"file": args.file, "error": exc.problems}, indent=2))
        else:
            print("\n".join(exc.problems), file=sys.stderr)
        return 1
    graph = ToolGraph.build(result.tools)
    report = {
        "file": result.file, "format": result.format, "content_hash": result.content_hash,
        "files": result.files, "seconds": round(result.seconds, 3),
        "imported": len(result.tools), "skipped": len(result.skipped),
        "tools": [{"name": t.name, "original": (t.origin or {}).get("name"), "mutates": t.mutates,
                   "arguments": len(t.parameters.get("properties") or {}), "returns": t.returns is not None}
                  for t in result.tools],
        "skipped_tools": [{"label": label, "reason": reason} for label, reason in result.skipped],
        "notes": result.notes,
        "graph": {"nodes": graph.graph.number_of_nodes(), "edges": graph.graph.number_of_edges(),
                  "bindings": len(graph.edges())},
    }
    if result.format == "openapi" and result.tools:  # what `synthesize --catalog` would run it as
        from envs import OpenAPIDomainError, domain_from_tools
        from generators.config import EnvironmentSource
        from generators.sources import source_name

        try:
            domain = domain_from_tools(result.tools, name=source_name(EnvironmentSource(kind="catalog", ref=args.file)),
                                       source=args.file)
            report["environment"] = {**domain.report.summary(), "tables": sorted(domain.report.resources),
                                     "not_crud": [{"tool": o.tool, "operation": o.operation, "reason": o.reason}
                                                  for o in domain.report.not_crud()]}
        except OpenAPIDomainError as exc:
            report["environment"] = {"error": str(exc)}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{result.file}: {result.format}, {len(result.tools)} tools imported, {len(result.skipped)} skipped "
          f"({result.seconds:.2f} s; sha256 {result.content_hash[:12]}; {len(result.files)} file(s) read)")
    for note in result.notes:
        print(f"  note: {note}")
    for tool in report["tools"]:
        renamed = f" (written {tool['original']!r})" if tool["original"] not in (None, tool["name"]) else ""
        effect = {True: "writes", False: "reads", None: "effect unknown"}[tool["mutates"]]
        print(f"  + {tool['name']}{renamed}: {tool['arguments']} arguments, {effect}"
              f"{', returns a schema' if tool['returns'] else ''}")
    for label, reason in result.skipped:
        print(f"  - {label}: {reason}")
    g = report["graph"]
    print(f"tool graph: {g['nodes']} nodes, {g['edges']} edges ({g['bindings']} bindings)")
    env = report.get("environment")
    if env and "error" in env:
        print(f"environment: none ({env['error']})")
    elif env:
        kinds = ", ".join(f"{k} {n}" for k, n in env["executable"].items() if n)
        print(f"environment: {env['resources']} resource tables ({', '.join(env['tables'])}); executable: {kinds}; "
              f"not CRUD (left to the tool mock or an overlay): {env['not_crud'] and len(env['not_crud'])}")
        for op in env["not_crud"]:
            print(f"  ~ {op['tool']} ({op['operation']}): {op['reason']}")
    return 0


class _Parser(argparse.ArgumentParser):
    """An argument parser that remembers its option names, to suggest the nearest one for a misspelt option."""

    def __init__(self, *args, **kwargs):
        self.option_names: list[str] = []  # before the base class adds --help
        super().__init__(*args, **kwargs)

    def add_argument(self, *names, **kwargs):
        self.option_names += [n for n in names if n.startswith("-")]
        return super().add_argument(*names, **kwargs)


def unknown_options(parser: _Parser, extra: list[str]) -> list[str]:
    """One line per argument the command does not take, with the nearest option it does take."""
    from generators.strict import nearest

    options = [a for a in extra if a.startswith("-")]
    if not options:
        return [f"{parser.prog}: unexpected argument(s) {' '.join(extra)}"]
    lines = []
    for arg in options:  # the words after an unknown option are its values, not worth a line each
        name = arg.split("=", 1)[0]
        close = nearest(name, parser.option_names)
        lines.append(f"{parser.prog}: unknown option {name}" + (f": did you mean {close}?" if close else
                                                               f"; options: {' '.join(parser.option_names)}"))
    return lines


def main(argv: list[str] | None = None) -> int:
    apply_offline_env()
    parser = _Parser(prog="synthloop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def config_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", help="JSON file with SynthesizeConfig fields")
        p.add_argument("--n-tasks", dest="n_tasks", type=int)
        p.add_argument("--batch-size", dest="batch_size", type=int)
        p.add_argument("--seed", type=int)
        p.add_argument("--run-name", dest="run_name")
        p.add_argument("--domains", help="comma-separated built-in domains, e.g. retail,banking (default: all four, "
                                          "or none when --catalog/--mcp/--env is given)")
        p.add_argument("--catalog", action="append", metavar="FILE",
                       help="an OpenAPI description (JSON/YAML) to sample tasks on as a REST environment; repeatable")
        p.add_argument("--mcp", action="append", metavar="COMMAND",
                       help="an MCP server command over stdio, {workdir} standing for its working copy; repeatable")
        p.add_argument("--mcp-state", dest="mcp_state", metavar="DIR",
                       help="folder copied as each --mcp server's initial working copy")
        p.add_argument("--mcp-program", dest="mcp_programs", action="append", metavar="PROGRAM",
                       help="a program the --mcp servers run per call (git); they may then start processes, "
                            "bounded by a pids cgroup; repeatable")
        p.add_argument("--mcp-http", dest="mcp_http", metavar="URL",
                       help="the --mcp servers speak Streamable HTTP on this URL inside their sandbox "
                            "(http://127.0.0.1:3001/mcp) instead of stdio")
        p.add_argument("--env", action="append", metavar="MODULE:CLASS",
                       help="a Python Domain (package.module:Class or an entry-point name); runs sandboxed; repeatable")
        p.add_argument("--env-path", dest="env_path", metavar="DIR",
                       help="folder to find --env packages in before the Python path, e.g. examples/bookshop")
        p.add_argument("--llm-tasks", dest="llm_tasks", type=int,
                       help="tasks that also get LLM rollouts (0 = scripted agents only, no model)")
        p.add_argument("--base-url", dest="base_url",
                       help="an OpenAI-compatible endpoint for every LLM role, e.g. http://127.0.0.1:8000/v1 "
                            "(default: the embedded local model)")
        p.add_argument("--model", help="model name at --base-url")
        p.add_argument("--structured-output", dest="structured_output",
                       choices=["json_schema", "json_object_schema", "none"],
                       help="how --base-url takes JSON-schema output (vLLM/OpenAI: json_schema; llama.cpp: "
                            "json_object_schema; none: native tool calls)")
        p.add_argument("--max-concurrency", dest="max_concurrency", type=int, help="requests in flight to --base-url")

    p = sub.add_parser("synthesize", help="run the synthesize flow (resumes a run with the same config)")
    config_args(p)
    p.add_argument("--corpus", default=DEFAULT_CORPUS)
    p.add_argument("--port", type=int, default=4200, help="port of the local Prefect server started if none is set")
    p.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 4),
                   help="processes running batches at once (default: the CPU count, at most 4)")
    p.add_argument("--ray", metavar="ADDRESS",
                   help="run the batches as Ray tasks on the cluster at ADDRESS (host:port, or auto for the one "
                        "started on this machine); needs `pip install -e '.[ray]'`")
    p.set_defaults(fn=cmd_synthesize)

    p = sub.add_parser("query", help="run SQL over the corpus (views: tasks, trajectories, verdicts, ...)")
    p.add_argument("sql")
    p.add_argument("--corpus", default=DEFAULT_CORPUS)
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.add_argument("--max-rows", dest="max_rows", type=int, default=50)
    p.set_defaults(fn=cmd_query)

    p = sub.add_parser("curate", help="run the curate flow: dedup, decontamination, necessity and difficulty probes")
    p.add_argument("--config", help="JSON file with CurateConfig fields")
    p.add_argument("--run-name", dest="run_name")
    p.add_argument("--runs", help="comma-separated synthesize run ids (default: every complete run)")
    p.add_argument("--seed", type=int)
    p.add_argument("--batch-size", dest="batch_size", type=int)
    p.add_argument("--no-tool-k", dest="no_tool_k", type=int, help="no-tool attempts per probed task (0 = none)")
    p.add_argument("--necessity-tasks", dest="necessity_tasks", type=int, help="tasks probed without tools")
    p.add_argument("--continuation", choices=["replay", "model"], help="how an ablated conversation is finished")
    p.add_argument("--rollouts", type=int, help="policy rollouts per probed task (0 = no difficulty probe)")
    p.add_argument("--difficulty-tasks", dest="difficulty_tasks", type=int, help="tasks probed for difficulty")
    p.add_argument("--base-url", dest="base_url", help="an OpenAI-compatible endpoint for both probes "
                   "(default: the embedded local model)")
    p.add_argument("--model", help="model name at --base-url")
    p.add_argument("--model-version", dest="model_version", help="version recorded with the labels")
    p.add_argument("--structured-output", dest="structured_output", choices=["json_schema", "json_object_schema", "none"])
    p.add_argument("--corpus", default=DEFAULT_CORPUS)
    p.add_argument("--port", type=int, default=4200, help="port of the local Prefect server started if none is set")
    p.set_defaults(fn=cmd_curate)

    p = sub.add_parser("train", help="run the train flow: evaluate the base policy, SFT on sft_v1, GRPO, evaluate "
                                     "after each stage")
    p.add_argument("--config", help="JSON file with TrainConfig fields")
    p.add_argument("--run-name", dest="run_name")
    p.add_argument("--max-steps", dest="max_steps", type=int, help="SFT optimizer steps")
    p.add_argument("--batch-size", dest="batch_size", type=int, help="SFT conversations per step")
    p.add_argument("--policy", help="base policy folder or hub id (default: the embedded SmolLM2-135M)")
    p.add_argument("--adapter", choices=["lora", "full"])
    p.add_argument("--no-sft", dest="no_sft", action="store_true", help="skip SFT")
    p.add_argument("--no-grpo", dest="no_grpo", action="store_true", help="skip GRPO")
    p.add_argument("--grpo-steps", dest="grpo_steps", type=int, help="GRPO steps")
    p.add_argument("--group-size", dest="group_size", type=int, help="GRPO rollouts per task")
    p.add_argument("--engine", choices=["transformers", "vllm"], help="GRPO rollout engine (vllm: GPU)")
    p.add_argument("--eval-tasks", dest="eval_tasks", type=int, help="held-out tasks evaluated per stage")
    p.add_argument("--corpus", default=DEFAULT_CORPUS)
    p.add_argument("--port", type=int, default=4200)
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser("bfcl", help="BFCL accuracy per category of a policy (local) or a model (OpenAI-compatible "
                                    "endpoint) on ../shared/benchmarks/bfcl")
    p.add_argument("--policy", help="a policy folder (trained by synthloop, or any transformers folder); "
                                    "default: the embedded SmolLM2-135M base policy")
    p.add_argument("--base-url", dest="base_url", help="an OpenAI-compatible endpoint instead of a local policy, "
                                                       "e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", help="model name at --base-url")
    p.add_argument("--per-category", dest="per_category", type=int, default=20,
                   help="questions per category, a seeded sample (0 = all)")
    p.add_argument("--categories", help="comma-separated (default: simple_python,multiple,parallel,"
                                        "parallel_multiple,irrelevance)")
    p.add_argument("--seed", type=int, default=0, help="seeds the sample")
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int,
                   help="longest reply (default: 256 for a local policy, 512 for an endpoint)")
    p.add_argument("--max-concurrency", dest="max_concurrency", type=int, default=4,
                   help="requests in flight to --base-url")
    p.add_argument("--root", help="the BFCL folder (default: ../shared/benchmarks/bfcl)")
    p.add_argument("--json", action="store_true", help="print the whole result (per item too) as JSON")
    p.set_defaults(fn=cmd_bfcl)

    p = sub.add_parser("loop", help="run the loop flow: rounds of synthesize → curate → train → select → variants")
    p.add_argument("--config", help="JSON file with LoopConfig fields")
    p.add_argument("--rounds", type=int)
    p.add_argument("--corpus", default="data/loop", help="the loop's own corpus (default: data/loop)")
    p.add_argument("--port", type=int, default=4200)
    p.set_defaults(fn=cmd_loop)

    p = sub.add_parser("export", help="export accepted conversations for TRL (messages + tools), or a named split")
    p.add_argument("format", choices=["trl", "sft_v1", "rl_v1"])
    p.add_argument("--out", required=True)
    p.add_argument("--run-id", dest="run_id")
    p.add_argument("--corpus", default=DEFAULT_CORPUS)
    p.set_defaults(fn=cmd_export)

    p = sub.add_parser("serve", help="start a local Prefect server if needed and serve every flow as a deployment")
    config_args(p)
    p.add_argument("--cron", help="optional schedule, e.g. '0 3 * * *'")
    p.add_argument("--port", type=int, default=4200)
    p.add_argument("--corpus", default=DEFAULT_CORPUS)
    p.add_argument("--pool", metavar="NAME", help="deploy to this Prefect process work pool (created if missing) "
                   "for `prefect worker start --pool NAME` processes to run, instead of serving from here")
    p.add_argument("--ray", metavar="ADDRESS", help="synthesize deployments run their batches on this Ray cluster")
    p.set_defaults(fn=cmd_serve)

    p = sub.add_parser("audit", help="re-verify a sample of accepted tasks from disk and mutation-test their verifiers")
    p.add_argument("--sample", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-id", dest="run_id")
    p.add_argument("--corpus", default=DEFAULT_CORPUS)
    p.set_defaults(fn=cmd_audit)

    p = sub.add_parser("catalog", help="tool catalogs: `catalog inspect FILE` says what a file imports and skips")
    catalog = p.add_subparsers(dest="catalog_command", required=True, parser_class=_Parser)
    c = catalog.add_parser("inspect", help="what a catalog file (OpenAPI, OpenAI tools, MCP tools/list, BFCL) "
                                           "imports, what it skips and why, and the size of its tool graph")
    c.add_argument("file", help="the catalog file (JSON, JSON lines or YAML)")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.add_argument("--strict", action="store_true", help="fail (exit 1) if any tool cannot be imported")
    c.add_argument("--format", default="auto", choices=["auto", "openai", "jsonschema", "bfcl", "openapi", "mcp"])
    c.set_defaults(fn=cmd_catalog)

    p = sub.add_parser("schemas", help="write the JSON Schema and Arrow schema of every table")
    p.add_argument("--out", default="data/schemas")
    p.set_defaults(fn=cmd_schemas)

    p = sub.add_parser("doctor", help="check every shard of a corpus against its done marker (sha256, rows) and "
                                      "say what is wrong; exit 1 if damaged")
    p.add_argument("--root", "--corpus", dest="root", default=DEFAULT_CORPUS, help="the corpus folder")
    p.set_defaults(fn=cmd_doctor)

    p = sub.add_parser("compact", help="rewrite complete runs' many batch shards as a few large sorted Parquet files "
                                       "(faster queries); default: every complete run not compacted yet")
    p.add_argument("runs", nargs="*", metavar="RUN", help="run ids to compact (default: all pending)")
    p.add_argument("--corpus", "--root", dest="corpus", default=DEFAULT_CORPUS, help="the corpus folder")
    p.set_defaults(fn=cmd_compact)

    p = sub.add_parser("repair", help="redo the damaged batches of a corpus (each run again with its manifest's config)")
    p.add_argument("--root", "--corpus", dest="root", default=DEFAULT_CORPUS, help="the corpus folder")
    p.add_argument("--port", type=int, default=4200, help="port of the local Prefect server started if none is set")
    p.set_defaults(fn=cmd_repair)

    args, extra = parser.parse_known_args(argv)
    if extra:
        print("\n".join(unknown_options(sub.choices[args.command], extra)), file=sys.stderr)
        return 2
    from pydantic import ValidationError

    from flows.server import PrefectUnreachable
    from generators.strict import describe

    command = f"synthloop {args.command}"
    try:
        return args.fn(args)
    except UsageError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # a bad knob: which key, why, and the nearest valid name; no traceback
        print("\n".join(f"{command}: {line}" for line in describe(exc, getattr(args, "config", None))),
              file=sys.stderr)
        return 2
    except PrefectUnreachable as exc:
        if not getattr(exc, "said", False):
            print(f"{command}: {exc}", file=sys.stderr)
        return 3
    except OSError as exc:  # a full disk, a read-only or foreign folder: name the path, not a traceback
        print(f"{command}: {os_error_line(exc)}", file=sys.stderr)
        return 4


def os_error_line(exc: OSError) -> str:
    """A filesystem failure in one line that names the path and what to do about it."""
    import errno

    path = exc.filename if exc.filename is not None else "(the path was not reported)"
    reason = exc.strerror or str(exc)
    fix = {errno.ENOSPC: "free some space there (or pass another --corpus) and run the same command again: "
                         "finished batches are kept",
           errno.EDQUOT: "free some of your quota and run the same command again: finished batches are kept",
           errno.EACCES: "make it writable for this user (or pass another --corpus)",
           errno.EPERM: "make it writable for this user (or pass another --corpus)",
           errno.EROFS: "the file system is read-only: pass a --corpus on a writable one"}.get(exc.errno)
    return f"{reason}: {path}" + (f"; {fix}" if fix else "")


if __name__ == "__main__":
    sys.exit(main())
