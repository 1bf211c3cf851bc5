"""The ``synthloop`` command."""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from flows.options import UsageError, add_model_options, build_config
from flows.registry import ALIASES, EXPORTS, STAGES, resolve, stage_of
from flows.server import apply_offline_env, console_without_tracebacks, prefect_api

DEFAULT_CORPUS = "data/corpus"
BFCL_SETTINGS = "training.bfcl_eval:BfclSettings"
"""The config ``synthloop bfcl``'s question options are generated from (the train flow's ``bfcl`` is the same
model); imported when the parser is built, for its defaults and help."""
STRUCTURED_OUTPUT = ["json_schema", "json_object_schema", "none"]


def config_model(command: str) -> type:
    """The config model a command's options are generated from, and the one its flow takes as ``config``
    (``flows.registry.STAGES``), imported when that command runs (the other commands stay fast)."""
    return stage_of(command).config_model()


CONFIG_COMMANDS = (*STAGES, *ALIASES)


def require_corpus(path: str):
    """The corpus at ``path``, or a ``UsageError`` saying there is none (DuckDB would otherwise answer a query
    with "Table with name tasks does not exist! Did you mean pg_tablespace?")."""
    from storage import Corpus

    if is_object_url(path):
        corpus = Corpus(path)
        if not corpus.runs():
            raise UsageError(f"no corpus at {path} (no run under its _runs/): run `synthloop synthesize --corpus "
                             f"{path}` first")
        return corpus
    if not (Path(path) / "_runs").is_dir():
        raise UsageError(f"no corpus at {path}: run `synthloop synthesize` first or pass --corpus <folder>")
    return Corpus(path)


def is_object_url(path: object) -> bool:
    return isinstance(path, str) and path.startswith("s3://")


# What an object-store corpus supports (storage.object_store): the other commands write beside the corpus
OBJECT_STORE_COMMANDS = ("synthesize", "query", "doctor")


def refuse_object_store(args: argparse.Namespace) -> None:
    root = getattr(args, "corpus", None) or getattr(args, "root", None)
    if not is_object_url(root):
        return
    from storage.object_store import UNSUPPORTED, ObjectStore

    if args.command not in OBJECT_STORE_COMMANDS:
        raise UsageError(f"{root}: " + UNSUPPORTED.format(what=f"`synthloop {args.command}`"))
    if getattr(args, "ray", None):
        raise UsageError(f"{root}: an object-store corpus is written by this machine's processes only (--ray is not "
                         f"tested against it: Ray workers would need the AWS variables and their own mirror)")
    if args.command == "synthesize":
        ObjectStore(root).list()  # an unreachable endpoint or a missing bucket: one line now, not a flow run's trace


def endpoint_options(data: dict, args: argparse.Namespace) -> dict | None:
    """The one named endpoint ``cli`` that --base-url gives every LLM role (vLLM, OpenAI, any compatible
    server), or None without --base-url."""
    if not getattr(args, "base_url", None):
        return None
    endpoint = {"base_url": args.base_url, "model": args.model or "default",
                "structured_output": args.structured_output or "json_schema"}
    if getattr(args, "max_concurrency", None):
        endpoint["max_concurrency"] = args.max_concurrency
    data.setdefault("endpoints", {})["cli"] = endpoint
    return endpoint


MCP_OPTIONS = {"--mcp-state": "state", "--mcp-env": "env", "--mcp-value": "values", "--mcp-program": "programs",
               "--mcp-http": "http"}
"""The options that set a field of an --mcp server's source (``EnvironmentSource``)."""


class _MCPOption(argparse.Action):
    """--mcp and the options that say how to run it, kept in the order given: an option after an --mcp applies
    to that server, one before the first --mcp to every server (one list, ``args.mcp``, of (option, value))."""

    def __call__(self, parser, namespace, value, option_string=None):
        if option_string in ("--mcp-env", "--mcp-value") and "=" not in value:
            parser.error(f"{option_string} {value!r}: give NAME=VALUE")
        if getattr(namespace, "mcp", None) is None:
            namespace.mcp = []
        namespace.mcp.append((option_string, value))


def _mcp_value(text: str):
    """A --mcp-value's value: a JSON array or object as that (a list of files), anything else as the text."""
    if text[:1] in "[{":
        with contextlib.suppress(ValueError):
            return json.loads(text)
    return text


def mcp_sources(given: list[tuple[str, str]]) -> list[dict]:
    """The ``environments`` entries of the --mcp options of a command line, each with the options that apply
    to it (``_MCPOption``)."""
    common: dict = {}
    servers: list[dict] = []
    for option, value in given:
        if option == "--mcp":
            servers.append({"kind": "mcp", "ref": value})
            continue
        field = MCP_OPTIONS[option]
        for target in servers[-1:] or [common]:
            if field == "state":
                target["state"] = str(Path(value).resolve())
            elif field == "http":
                target["http"] = value
            elif field == "programs":
                target.setdefault("programs", []).append(value)
            else:
                name, text = value.split("=", 1)
                if field == "env":
                    target.setdefault("env", {})[name] = text
                else:
                    target.setdefault("values", {}).setdefault(name, []).append(_mcp_value(text))
    if common and not servers:
        raise UsageError(f"{', '.join(sorted({o for o, _ in given}))} without --mcp: give the server's command")
    return [{**common, **server,
             **{k: {**common[k], **server[k]} for k in ("env", "values") if k in common and k in server},
             **({"programs": [*common["programs"], *server["programs"]]}
                if "programs" in common and "programs" in server else {})}
            for server in servers]


def flag_dest(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


def synthesize_sources(args: argparse.Namespace, data: dict) -> None:
    """Each source kind's flag (``generators.sources.SOURCE_KINDS``: --catalog, --mcp, --env, --objects) as
    environment sources, kind by kind, and --base-url as the endpoint of every role."""
    from generators.sources import SOURCE_KINDS

    sources: list[dict] = []
    for kind in sorted(SOURCE_KINDS):
        flag = SOURCE_KINDS[kind].flag
        given = getattr(args, flag_dest(flag.option), None) or []
        if flag.ordered:  # (option, value) pairs in command-line order: see _MCPOption
            sources += mcp_sources(given)
            continue
        path = getattr(args, "env_path", None) if flag.search_path else None
        sources += [{"kind": kind, "ref": str(Path(ref).resolve()) if flag.resolve else ref,
                     **({"path": str(Path(path).resolve())} if path else {})} for ref in given]
    if sources:
        data["environments"] = [*data.get("environments", []), *sources]
        data.setdefault("domains", [])  # the user's own tools only, unless built-in domains are asked for too
    agents = data.setdefault("agents", {})
    if endpoint_options(agents, args):
        for role in ("assistant", "user", "task_writer"):
            agents.setdefault(role, {})["endpoint"] = "cli"


def curate_endpoint(args: argparse.Namespace, data: dict) -> None:
    """--base-url as the endpoint of both probes."""
    if endpoint_options(data, args):
        for probe in ("necessity", "difficulty"):
            data.setdefault(probe, {})["endpoint"] = "cli"


def load_config(args: argparse.Namespace):
    """The config of a command line (model defaults < --config < flags < --set)."""
    spec = stage_of(args.command)
    return build_config(spec.config_model(), args, spec.shortcuts, resolve(spec.extra) if spec.extra else None)


def synthesize_config(args: argparse.Namespace):
    """The SynthesizeConfig of a synthesize or serve command line."""
    spec = STAGES["synthesize"]
    return build_config(spec.config_model(), args, spec.shortcuts, resolve(spec.extra))


def run_flow(args: argparse.Namespace, name: str, **parameters):
    """Run the stage ``name``'s flow (``flows.<name>.<name>``) against a reachable Prefect server; its failures reach
    :func:`exit_status`."""
    with prefect_api(args.port):
        # imported once the API URL is set: Prefect reads it on import
        flow = STAGES[name].flow_function()
        console_without_tracebacks()
        return flow(**parameters)


def cmd_synthesize(args: argparse.Namespace) -> int:
    config = synthesize_config(args)
    summary = run_flow(args, "synthesize", config=config, corpus_root=args.corpus, workers=args.workers, ray=args.ray)
    cov = summary["coverage"]
    print(json.dumps({k: summary[k] for k in ("run_id", "tasks", "accepted", "acceptance_rate", "trajectories",
                                              "sample_failures")}
                     | {"sample_failure_reasons": summary.get("sample_failure_reasons", {}), "coverage": cov, "llm": summary["llm"], "llm_usage": summary["llm_usage"],
                        "embedded_server_requests": summary["embedded_server_requests"]}, indent=2))
    return 0


def cmd_stage(args: argparse.Namespace) -> int:
    """``synthloop <stage>`` for a stage of the registry: its config from the command line, the checks its spec
    asks for, its flow, and the run's summary as JSON."""
    spec = stage_of(args.command)
    config = load_config(args)
    if spec.training:
        require_training_extra()
    if spec.reads_corpus:
        require_corpus(args.corpus)
    summary = run_flow(args, spec.name, config=config, corpus_root=args.corpus)
    print(json.dumps({k: v for k, v in summary.items() if k not in spec.not_printed}, indent=2, default=str))
    return 0


TRAINING_EXTRA = ("torch", "transformers", "trl", "peft")


def require_training_extra() -> None:
    """Training imports these inside the flow; without them a user would meet a ModuleNotFoundError traceback
    after the server has started, so say what to install first."""
    import importlib.util

    missing = []
    for name in TRAINING_EXTRA:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise UsageError(f"training needs the `train` extra ({', '.join(missing)} not installed): "
                         "pip install -e '.[train]'")


def cmd_bfcl(args: argparse.Namespace) -> int:
    """BFCL accuracy per category of a local policy or an endpoint's model; needs no Prefect."""
    from training.bfcl_eval import EndpointAgent, LocalAgent, bfcl_accuracy, format_table

    if sum(map(bool, (args.base_url, args.policy, args.embedded))) > 1:
        raise UsageError("give one of --policy, --base-url and --embedded")
    if args.base_url and not args.model:
        raise UsageError("--base-url needs --model (the model name the endpoint serves)")
    settings = build_config(resolve(BFCL_SETTINGS), args)
    with contextlib.ExitStack() as stack:
        base_url, model = args.base_url, args.model
        if args.embedded:
            from generators.embedded import MODEL_NAME, EmbeddedServer

            server = stack.enter_context(EmbeddedServer(n_ctx=args.n_ctx))
            base_url, model = server.base_url, MODEL_NAME
        if base_url:
            agent = EndpointAgent(base_url=base_url, model=model, max_concurrency=args.max_concurrency,
                                  **({"max_tokens": settings.max_new_tokens} if settings.max_new_tokens else {}))
        else:
            agent = LocalAgent.from_path(args.policy, **({"max_new_tokens": settings.max_new_tokens}
                                                         if settings.max_new_tokens else {}))
        result = bfcl_accuracy(agent, args.root, categories=settings.categories, per_category=settings.per_category,
                               seed=settings.seed, log=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(result, indent=2, default=str) if args.json else format_table(result))
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    """Serve the read-only corpus viewer until interrupted; needs no Prefect."""
    from viewer.app import serve

    corpus = require_corpus(args.corpus)
    print(f"synthloop view: http://{args.host}:{args.port}/ over {corpus.root} (Ctrl-C stops)", flush=True)
    serve(corpus.root, host=args.host, port=args.port)
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
    corpus = require_corpus(args.corpus)
    export = EXPORTS[args.format]
    for option in ("split", "query"):
        if getattr(args, option) and option not in export.options:
            takes = " ".join(f"`export {e.name}`" for e in EXPORTS.values() if option in e.options)
            raise UsageError(f"--split and --query choose the tasks of {takes} only")
    n = export(corpus, args.out, run_id=args.run_id, split=args.split, query=args.query)
    print(f"wrote {n} rows to {args.out}")
    return 0


def cmd_openenv(args: argparse.Namespace) -> int:
    corpus = require_corpus(args.corpus)
    try:
        import uvicorn

        from interop.openenv_env import ServedTasks, create_server
    except ModuleNotFoundError as exc:
        raise UsageError(f"`synthloop openenv` needs openenv-core ({exc}): pip install 'synthloop[openenv]'") from None

    served = ServedTasks.load(corpus, split=args.split, query=args.query, max_steps=args.max_steps,
                              allow_choice=args.allow_task_choice)
    app = create_server(served, max_sessions=args.sessions)
    print(f"OpenEnv environment: {len(served.keys)} tasks ({served.selection}) of {args.corpus} on "
          f"http://{args.host}:{args.port} (WebSocket /ws, {args.sessions} sessions)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
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


def cmd_mcp(args: argparse.Namespace) -> int:
    from interop.mcp_server import serve

    require_corpus(args.corpus)
    return serve(args.corpus, split=args.split, query=args.query, task=args.task, transport=args.transport,
                 host=args.host, port=args.port, out=args.out, token_file=args.token_file, repeat=args.repeat)


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

    if is_object_url(args.root):
        from storage.object_store import diagnose_objects

        lines, damaged = diagnose_objects(require_corpus(args.root))
        print("\n".join(lines))
        return 1 if damaged else 0
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

    if getattr(args, "mcp", None):
        if args.file:
            raise UsageError("catalog inspect: give a FILE or --mcp COMMAND, not both")
        return inspect_mcp(args)
    if not args.file:
        raise UsageError("catalog inspect: give a catalog FILE, or --mcp COMMAND for an MCP server")
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


def inspect_mcp(args: argparse.Namespace) -> int:
    """``catalog inspect --mcp COMMAND``: start the server as a run would (inside the boundary, on a working copy
    of --mcp-state), and say its tools, what each is taken to do, the tool graph and the state's tables."""
    from generators.config import EnvironmentSource
    from generators.sources import MCPSource

    entries = mcp_sources(args.mcp)
    if len(entries) != 1:
        raise UsageError(f"catalog inspect: one --mcp server at a time ({len(entries)} given)")
    source = MCPSource(EnvironmentSource(**entries[0]))
    try:
        specs = source.specs  # a server that cannot start fails here, as a SourceError naming it
        graph = source.graph()
        env = source.open(0)
        try:
            rows, keys = env.rows(), env.foreign_keys()
        finally:
            env.close()
    finally:
        source.close()
    report = {
        "server": source.ref, "name": source.name,
        "imported": len(specs),
        "tools": [{"name": name, "original": (spec.record.origin or {}).get("name"), "mutates": spec.mutates,
                   "mutates_from": "name" if (spec.record.origin or {}).get("mutates_inferred") else "annotations",
                   "arguments": sorted(spec.record.parameters.get("properties") or {}),
                   "required": sorted(spec.record.parameters.get("required") or []),
                   "returns": spec.record.returns is not None}
                  for name, spec in specs.items()],
        "graph": {"nodes": graph.graph.number_of_nodes(), "edges": graph.graph.number_of_edges(),
                  "bindings": len(graph.edges()), "longest_chain": graph.longest_chain(),
                  "edge_list": [{"src": e.src, "dst": e.dst, "field": e.src_field, "param": e.dst_param}
                                for e in graph.edges()]},
        "state": {"tables": {t: len(r) for t, r in sorted(rows.items())},
                  "foreign_keys": [list(k) for k in keys]},
    }
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    print(f"{source.ref}: MCP server, {len(specs)} tools (domain {source.name!r})")
    for tool in report["tools"]:
        renamed = f" (named {tool['original']!r})" if tool["original"] not in (None, tool["name"]) else ""
        effect = "writes" if tool["mutates"] else "reads"
        how = " (from its name: no annotations)" if tool["mutates_from"] == "name" else ""
        required = set(tool["required"])
        args_text = ", ".join(a + ("" if a in required else "?") for a in tool["arguments"]) or "no arguments"
        print(f"  + {tool['name']}{renamed}: {effect}{how}; {args_text}"
              f"{'; returns a schema' if tool['returns'] else ''}")
    g = report["graph"]
    print(f"tool graph: {g['nodes']} nodes, {g['edges']} edges ({g['bindings']} bindings), longest chain "
          f"{g['longest_chain']} calls")
    for e in g["edge_list"]:
        print(f"  {e['src']}.{e['field']} → {e['dst']}({e['param']})")
    tables = report["state"]["tables"]
    print(f"state: {len(tables)} table(s)" + (": " + ", ".join(f"{t} ({n} rows)" for t, n in tables.items())
                                               if tables else " (an empty working copy: give --mcp-state DIR)"))
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



def command_of(argv: list[str]) -> str | None:
    """The subcommand of a command line (the top-level parser has no options that take a value)."""
    return next((a for a in argv if not a.startswith("-")), None)


# --- the command line: one small builder per command, in the order `synthloop --help` lists them -----------------

MCP_OPTION_HELP = (
    ("--mcp-state", "DIR", "folder copied as the server's initial working copy ({workdir})"),
    ("--mcp-env", "NAME=VALUE", "an environment variable of the server, {workdir} standing for its "
     "working copy (MEMORY_FILE_PATH={workdir}/memory.jsonl); repeatable"),
    ("--mcp-value", "PARAM=VALUE", "a candidate value for a tool parameter no state supplies, by name or "
     "tool.param (query='SELECT count(*) FROM orders'; a JSON array or object is parsed); repeatable"),
    ("--mcp-program", "PROGRAM", "a program the server runs per call (git); it may then start processes, "
     "bounded by a pids cgroup; repeatable"),
    ("--mcp-http", "URL", "the server speaks Streamable HTTP on this URL inside its sandbox "
     "(http://127.0.0.1:3001/mcp) instead of stdio"))
"""The options that follow an ``--mcp`` server (``MCP_OPTIONS``), with their help for ``synthesize``."""


def _config_options(p: _Parser, name: str, command: str | None) -> None:
    """A stage's config options, generated from its model, only where ``name`` is the command being run (so only
    that command imports its model); the others are never parsed and take ``--config`` alone."""
    if name == command:
        add_model_options(p, config_model(name), stage_of(name).shortcuts)
    else:
        p.add_argument("--config")


def _endpoint_args(p: _Parser, roles: str) -> None:
    p.add_argument("--base-url", dest="base_url", help=f"an OpenAI-compatible endpoint for {roles}, e.g. "
                   "http://127.0.0.1:8000/v1 (default: the embedded local model)")
    p.add_argument("--model", help="model name at --base-url")
    p.add_argument("--structured-output", dest="structured_output", choices=STRUCTURED_OUTPUT,
                   help="how --base-url takes JSON-schema output (vLLM/OpenAI: json_schema; llama.cpp: "
                        "json_object_schema; none: native tool calls)")


def _source_args(p: _Parser) -> None:
    """One flag per source kind (``generators.sources.SOURCE_KINDS``); imported only for the command run."""
    from generators.sources import SOURCE_KINDS

    searched = []
    for kind in sorted(SOURCE_KINDS):
        flag = SOURCE_KINDS[kind].flag
        if flag.ordered:
            p.add_argument(flag.option, action=_MCPOption, metavar=flag.metavar, help=flag.help)
            for option, metavar, text in MCP_OPTION_HELP:
                p.add_argument(option, dest="mcp", action=_MCPOption, metavar=metavar, help=text)
        else:
            p.add_argument(flag.option, action="append", dest=flag_dest(flag.option), metavar=flag.metavar,
                           help=flag.help)
        searched += [flag.option] if flag.search_path else []
    if searched:
        p.add_argument("--env-path", dest="env_path", metavar="DIR",
                       help=f"folder to find {'/'.join(searched)} packages in before the Python path, e.g. "
                            "examples/bookshop")


def _synthesize_args(p: _Parser, name: str, command: str | None) -> None:
    _config_options(p, name, command)
    if name == command:  # not run: its options are never parsed
        _source_args(p)
    _endpoint_args(p, "every LLM role")
    p.add_argument("--max-concurrency", dest="max_concurrency", type=int, help="requests in flight to --base-url")


def _run_args(p: _Parser, corpus: str = DEFAULT_CORPUS, what: str = "") -> None:
    p.add_argument("--corpus", default=corpus, help=what or None)
    p.add_argument("--port", type=int, default=4200, help="port of the local Prefect server started if none is set")


def _stage_command(sub: Any, name: str, command: str | None) -> None:
    """A stage's command from its spec: its config's options, --base-url where it takes one, the corpus."""
    spec = STAGES[name]
    p = sub.add_parser(name, help=spec.help)
    _config_options(p, name, command)
    if spec.endpoint_roles:
        _endpoint_args(p, spec.endpoint_roles)
    _run_args(p, spec.corpus, f"the {name}'s own corpus (default: {spec.corpus})" if spec.corpus != DEFAULT_CORPUS
              else "")
    p.set_defaults(fn=cmd_stage)


def _add_synthesize(sub: Any, command: str | None) -> None:
    p = sub.add_parser("synthesize", help="run the synthesize flow (resumes a run with the same config)")
    _synthesize_args(p, "synthesize", command)
    _run_args(p)
    p.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 4),
                   help="processes running batches at once (default: the CPU count, at most 4)")
    p.add_argument("--ray", metavar="ADDRESS",
                   help="run the batches as Ray tasks on the cluster at ADDRESS (host:port, or auto for the one "
                        "started on this machine); needs `pip install -e '.[ray]'`")
    p.set_defaults(fn=cmd_synthesize)


def _add_view(sub: Any, command: str | None) -> None:
    p = sub.add_parser("view", help="browse the corpus in a web browser: runs, tasks with filters, each task's "
                                    "conversations and verdicts, plots (docs/viewer.md)")
    p.add_argument("--corpus", default=DEFAULT_CORPUS)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    p.add_argument("--port", type=int, default=8765)
    p.set_defaults(fn=cmd_view)


def _add_query(sub: Any, command: str | None) -> None:
    p = sub.add_parser("query", help="run SQL over the corpus (views: tasks, trajectories, verdicts, ...)")
    p.add_argument("sql")
    p.add_argument("--corpus", default=DEFAULT_CORPUS)
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.add_argument("--max-rows", dest="max_rows", type=int, default=50)
    p.set_defaults(fn=cmd_query)


def _add_bfcl(sub: Any, command: str | None) -> None:
    p = sub.add_parser("bfcl", help="BFCL accuracy per category of a policy (local) or a model (OpenAI-compatible "
                                    "endpoint) on ../shared/benchmarks/bfcl")
    p.add_argument("--policy", help="a policy folder (trained by synthloop, or any transformers folder); "
                                    "default: the embedded SmolLM2-135M base policy")
    p.add_argument("--base-url", dest="base_url", help="an OpenAI-compatible endpoint instead of a local policy, "
                                                       "e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", help="model name at --base-url")
    p.add_argument("--embedded", action="store_true", help="the embedded model (Qwen2.5-Coder-0.5B under llama.cpp, "
                                                           "started for this run) instead of a local policy")
    p.add_argument("--n-ctx", dest="n_ctx", type=int, default=16384,
                   help="context window of the --embedded server (multi-turn entries carry every function doc)")
    if command == "bfcl":  # --categories, --per-category, --seed, --max-new-tokens (imported only to run it)
        add_model_options(p, resolve(BFCL_SETTINGS))
    p.add_argument("--max-concurrency", dest="max_concurrency", type=int, default=4,
                   help="requests in flight to --base-url")
    p.add_argument("--root", help="the BFCL folder (default: ../shared/benchmarks/bfcl)")
    p.add_argument("--json", action="store_true", help="print the whole result (per item too) as JSON")
    p.set_defaults(fn=cmd_bfcl)


def _add_export(sub: Any, command: str | None) -> None:
    p = sub.add_parser("export", help="export accepted conversations for TRL (messages + tools), or a named split")
    p.add_argument("format", choices=list(EXPORTS),
                   help="verl: one RL row per task (prompt, reward_model, extra_info.tools_kwargs); docs/openenv.md")
    p.add_argument("--out", required=True)
    p.add_argument("--run-id", dest="run_id")
    p.add_argument("--corpus", default=DEFAULT_CORPUS)
    p.add_argument("--split", help="verl: the tasks of this split (e.g. rl_v1); default every accepted task")
    p.add_argument("--query", help="verl: the tasks of a SQL query returning run_id, task_id")
    p.set_defaults(fn=cmd_export)


def _add_openenv(sub: Any, command: str | None) -> None:
    p = sub.add_parser("openenv", help="serve stored tasks as an OpenEnv environment (reset/step/state over "
                                       "WebSocket; reward from the task's verifier at the end); docs/openenv.md")
    p.add_argument("--corpus", default=DEFAULT_CORPUS)
    p.add_argument("--split", help="serve the tasks of this split (e.g. rl_v1); default every accepted task")
    p.add_argument("--query", help="serve the tasks of a SQL query returning run_id, task_id")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--sessions", type=int, default=8, help="concurrent sessions (one episode each)")
    p.add_argument("--max-steps", dest="max_steps", type=int, default=64,
                   help="actions per episode before it is ended and judged")
    p.add_argument("--allow-task-choice", dest="allow_task_choice", action="store_true",
                   help="a client's reset may pick its task (task_id/run_id, index, seed); by default the server "
                        "assigns them in order and refuses those arguments")
    p.set_defaults(fn=cmd_openenv)


def _add_serve(sub: Any, command: str | None) -> None:
    p = sub.add_parser("serve", help="start a local Prefect server if needed and serve every flow as a deployment")
    _synthesize_args(p, "serve", command)
    p.add_argument("--cron", help="optional schedule, e.g. '0 3 * * *'")
    _run_args(p)
    p.add_argument("--pool", metavar="NAME", help="deploy to this Prefect process work pool (created if missing) "
                   "for `prefect worker start --pool NAME` processes to run, instead of serving from here")
    p.add_argument("--ray", metavar="ADDRESS", help="synthesize deployments run their batches on this Ray cluster")
    p.set_defaults(fn=cmd_serve)


def _add_audit(sub: Any, command: str | None) -> None:
    p = sub.add_parser("audit", help="re-verify a sample of accepted tasks from disk and mutation-test their verifiers")
    p.add_argument("--sample", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-id", dest="run_id")
    p.add_argument("--corpus", default=DEFAULT_CORPUS)
    p.set_defaults(fn=cmd_audit)


def _add_catalog(sub: Any, command: str | None) -> None:
    p = sub.add_parser("catalog", help="tool catalogs: `catalog inspect FILE` says what a file imports and skips; "
                                       "`catalog inspect --mcp COMMAND` what an MCP server offers")
    catalog = p.add_subparsers(dest="catalog_command", required=True, parser_class=_Parser)
    c = catalog.add_parser("inspect", help="what a catalog file (OpenAPI, OpenAI tools, MCP tools/list, BFCL) "
                                           "imports, what it skips and why, and the size of its tool graph")
    c.add_argument("file", nargs="?", help="the catalog file (JSON, JSON lines or YAML)")
    c.add_argument("--mcp", action=_MCPOption, metavar="COMMAND",
                   help="inspect an MCP server instead, started as `synthesize --mcp` starts it (inside the "
                        "sandbox): its tools, the tool graph, its state's tables")
    for option, metavar, _ in MCP_OPTION_HELP:
        c.add_argument(option, dest="mcp", action=_MCPOption, metavar=metavar, help=f"as for synthesize {option}")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.add_argument("--strict", action="store_true", help="fail (exit 1) if any tool cannot be imported")
    from generators.catalog import format_names  # the registry: every catalog format registered
    c.add_argument("--format", default="auto", choices=format_names())
    c.set_defaults(fn=cmd_catalog)


def _add_mcp(sub: Any, command: str | None) -> None:
    p = sub.add_parser("mcp", help="serve stored tasks to any agent as an MCP server (stdio or Streamable HTTP): one "
                                   "episode per session, graded out of the agent's reach (docs/mcp.md)")
    p.add_argument("--corpus", default=DEFAULT_CORPUS)
    pick = p.add_mutually_exclusive_group()
    pick.add_argument("--split", help="serve a split's tasks (rl_v1, sft_v1); default: every accepted task")
    pick.add_argument("--query", help="serve the tasks a SQL query returns (columns run_id, task_id)")
    pick.add_argument("--task", metavar="TASK_ID", help="serve this one task")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP: address to listen on")
    p.add_argument("--port", type=int, default=8765, help="HTTP: port to listen on")
    p.add_argument("--out", metavar="FILE", help="append each ended play's judgement and transcript here (JSON lines)")
    p.add_argument("--token-file", dest="token_file", metavar="FILE",
                   help="HTTP: where the grader token is written, mode 0600 (default: a new private temp file)")
    p.add_argument("--repeat", action="store_true",
                   help="reset restarts a session's task instead of moving it to the next one (only the first "
                        "ended play of a task counts either way)")
    p.set_defaults(fn=cmd_mcp)


def _add_corpus_care(sub: Any, command: str | None) -> None:
    """schemas, doctor, compact, repair: what is written and whether it is sound."""
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


def _stage(name: str) -> Any:
    return lambda sub, command: _stage_command(sub, name, command)


COMMANDS = (_add_synthesize, _add_view, _add_query, _stage("curate"), _stage("train"), _add_bfcl, _stage("loop"),
            _add_export, _add_openenv, _add_serve, _add_audit, _add_catalog, _add_mcp, _add_corpus_care)
"""Every command's builder, in the order ``synthloop --help`` lists them; a stage's command comes from its spec
(``flows.registry.STAGES``)."""


def build_parser(command: str | None = None) -> _Parser:
    """The ``synthloop`` parser; the config options of ``command`` (the one being run) are generated from its
    model, so only that command imports its model."""
    parser = _Parser(prog="synthloop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    parser.commands = sub.choices
    for add in COMMANDS:
        add(sub, command)
    return parser


UNWIND_ON_SIGTERM = frozenset({*STAGES, "bfcl"})
"""Commands that may start the embedded model server. Serving commands (view, mcp, openenv, serve) are left to
their servers' own signal handling: unwinding an event loop that waits on stdin would hang instead of exiting."""


def stop_on_sigterm() -> None:
    """Make SIGTERM unwind the stack like Ctrl-C does: ``with``/``finally`` blocks run, so a server the command
    started (the embedded model, a sandboxed worker) stops with it instead of being left behind. Python's default
    for SIGTERM is to die at once, skipping them."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_signal)


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    apply_offline_env()
    argv = sys.argv[1:] if argv is None else list(argv)
    command = command_of(argv)
    if command in UNWIND_ON_SIGTERM:
        stop_on_sigterm()
    args = None
    try:
        parser = build_parser(command)
        args, extra = parser.parse_known_args(argv)
        if extra:
            raise UsageError("\n".join(unknown_options(parser.commands[args.command], extra)))
        refuse_object_store(args)
        return args.fn(args)
    except Exception as exc:
        status = exit_status(exc, command or "", getattr(args, "config", None))
        if status is None:
            raise
        return status


def exit_status(exc: Exception, command: str, config_file: str | None = None) -> int | None:
    """The one place a failure becomes lines on stderr and an exit status; None for an error nobody expected
    (it ends in Python's own traceback).

    2: a mistake in what was given (an option, a config, a folder, data the run cannot use); 3: something the
    run talks to stopped answering (the Prefect API, an endpoint, a Ray cluster): what finished is kept and
    the same command resumes; 4: the filesystem refused (full, read-only, not ours)."""
    import duckdb
    from pydantic import ValidationError

    from flows.server import PrefectUnreachable
    from generators.embedded import EmbeddedModelError
    from generators.llm import EndpointUnavailable, EndpointUnreachable, LLMError
    from generators.sources import SourceError
    from generators.strict import describe
    from sandbox import SandboxUnavailable
    from storage.external import BFCLDataError
    from training.policy import PolicyError

    stopped = (EndpointUnreachable, EndpointUnavailable, LLMError, EmbeddedModelError, ConnectionError)
    # what a command's run raises about its inputs (a damaged corpus is a ValueError: CorpusDamaged)
    stage = stage_of(command)
    failed = stage.error_types() if stage else {
        "export": (ValueError,), "mcp": (ValueError,), "openenv": (ValueError,),
        # a user's catalog file or --mcp server that cannot be opened: the message names the source and the fix
        "catalog": (SourceError,),
        "bfcl": (PolicyError, ValueError, FileNotFoundError, SandboxUnavailable, BFCLDataError)}.get(command, ())
    name = f"synthloop {command}"
    if isinstance(exc, UsageError):
        lines = str(exc).split("\n")
        status, lines = 2, [line if line.startswith("synthloop") else f"{name}: {line}" for line in lines]
    elif isinstance(exc, ValidationError):  # a bad knob: which key, why, and the nearest valid name
        status, lines = 2, [f"{name}: {line}" for line in describe(exc, config_file)]
    elif isinstance(exc, PrefectUnreachable):
        status, lines = 3, [] if getattr(exc, "said", False) else [f"{name}: {exc}"]
    elif isinstance(exc, stopped):
        status, lines = 3, [f"{name} stopped: {exc}"]
    elif isinstance(exc, failed):
        status, lines = 2, [f"{name} failed: {exc}"]
    elif isinstance(exc, duckdb.Error):  # a query on a corpus that lacks what it reads: its first line, not a trace
        status, lines = 2, [f"{name} failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"]
    elif isinstance(exc, OSError):  # a full disk, a read-only or foreign folder: name the path, not a traceback
        status, lines = 4, [f"{name}: {os_error_line(exc)}"]
    else:
        return None
    if lines:
        print("\n".join(lines), file=sys.stderr)
    return status


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

