"""Tool-graph edges: build time, precision on hand-labelled bindings, recall of the domains' foreign keys.

    python benchmarks/graph_edges.py [--sizes 100 300 1000] [--repeat 3] [--baseline]
    python benchmarks/graph_edges.py --draw 12 8 --seed 11 > /tmp/to_label.jsonl
    python benchmarks/graph_edges.py --draw-patterns 20 --seed 12 > /tmp/to_label_2.jsonl
    python benchmarks/graph_edges.py --draw 10 5 --seed 13 --sources twilio_api_v2010.json ... > /tmp/to_label_3.jsonl
    python benchmarks/graph_edges.py --specs --github /tmp/gh/package/generated/api.github.com.json
    python benchmarks/graph_edges.py --draw-specs 20 --seed 21 --github ... > /tmp/to_label_specs.jsonl

Prints, for the current ``ToolGraph.build``:

* build seconds on synthetic catalogs of 100, 300 and 1,000 tools (resources of five operations each, shaped
  like Twilio's: ``/v1/Parents/{ParentSid}/Items/{Sid}``, results with ``sid``, ``parent_sid``, dates and urls)
  and on the real Twilio descriptions, with the ratio of the largest to the smallest time (linear cost gives
  about 10 for 100 → 1,000 tools, quadratic about 100); ``--baseline`` times the old matcher too;
* density (edges over ordered tool pairs) and the share of bindings between differently named fields and
  parameters, per catalog that imports, before (the old type + fuzzy-name matcher, kept below as
  ``baseline_build``) and after;
* precision on ``data/edge_labels.jsonl``: each labelled binding is looked up in the graph re-built now; one
  the code no longer produces counts for recall only;
* recall of the built-in domains' foreign-key edges (see ``foreign_key_truth`` for the derivation).

``--specs`` prints, per real description (``SPECS``; GitHub's REST description is not committed: ``--github``
names ``api.github.com.json`` of ``npm pack @octokit/openapi@23.0.2``), precision of the dependencies
(``ToolGraph.dependencies()``, echoes left out) on ``data/edge_labels_specs.jsonl``'s seeded draws of them, and
recall on the true edges listed there by reading the spec; ``data/edge_labels_specs.md`` has the judging rule.

``--draw PER_NEW PER_OLD`` writes a fresh sample to label: per source, seeded, up to PER_NEW bindings the
current code produces and PER_OLD that only the baseline produces, shuffled together with no mark of which is
which, so a label is given before one knows whether the new code keeps the edge.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rapidfuzz import fuzz  # noqa: E402

from envs import DOMAINS, Environment  # noqa: E402
from generators.catalog import CatalogError, load_catalog  # noqa: E402
from generators.graph import ToolGraph, normalise, output_fields  # noqa: E402
from schemas import Tool  # noqa: E402
from storage.external import shared_root  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CATALOGS = shared_root() / "catalogs" / "openapi"
LABELS = Path(__file__).resolve().parent / "data" / "edge_labels.jsonl"
SPEC_LABELS = Path(__file__).resolve().parent / "data" / "edge_labels_specs.jsonl"
# The real descriptions labelled per spec, by the name the labels use: a path under the catalogs' folder.
SPECS = {"twilio_api_v2010": "twilio/twilio_api_v2010.json",
         "twilio_conversations_v1": "twilio/twilio_conversations_v1.json",
         "asana": "asana/asana_oas.yaml", "slack": "slack/slack_web_openapi_v2.json"}
TWILIO = ("twilio_api_v2010.json", "twilio_conversations_v1.json", "twilio_messaging_v1.json")


# --- sources ----------------------------------------------------------------------------------------------------


def domain_source(name: str) -> tuple[list[Tool], list[tuple[str, str]], Environment]:
    env = Environment(DOMAINS[name], 0)
    return [s.record for s in env.specs.values()], env.foreign_keys(), env


def catalog_sources() -> dict[str, list[Tool]]:
    """Every OpenAPI description under ../shared/catalogs that imports with at least two tools."""
    found = {}
    for path in sorted(CATALOGS.glob("*/*")):
        if path.suffix not in (".json", ".yaml", ".yml"):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tools = load_catalog(path)
        except CatalogError:
            continue
        if len(tools) >= 2:
            found[path.name] = tools
    return found


def all_sources() -> dict[str, tuple[list[Tool], list[tuple[str, str]]]]:
    sources = {name: domain_source(name)[:2] for name in sorted(DOMAINS)}
    sources.update({name: (tools, []) for name, tools in catalog_sources().items()})
    return sources


# --- the old matcher, for the "before" figures and for drawing the sample ---------------------------------------


def _old_fields(schema: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str, str]]:
    if not isinstance(schema, dict):
        return []
    if schema.get("type") == "array":
        return _old_fields(schema.get("items"), prefix + ("*",))
    out = []
    for name, sub in (schema.get("properties") or {}).items():
        t = sub.get("type") if isinstance(sub, dict) else None
        t = next((x for x in t if x != "null"), None) if isinstance(t, list) else t
        if t in ("string", "integer", "number", "boolean"):
            out.append((prefix + (name,), name, t))
        elif isinstance(sub, dict) and sub.get("type") in ("object", "array"):
            out.extend(_old_fields(sub, prefix + (name,)))
    return out


def _old_similarity(a: str, b: str) -> float:
    a, b = a.lower(), b.lower()
    if a == b:
        return 100.0
    sa, sb = a.removesuffix("_id"), b.removesuffix("_id")
    if a.endswith("_id") != b.endswith("_id") or not sa or not sb or min(len(sa), len(sb)) < 3:
        return 0.0
    return float(fuzz.partial_ratio(sa, sb))


OLD_FREE_TEXT = {"name", "title", "description", "new_name", "name_contains", "reason", "note"}


def baseline_build(tools: list[Tool], foreign_keys: list[tuple[str, str]] = ()) -> dict[tuple[str, str], list[dict]]:
    """The matcher this module replaced: every ordered pair, type match plus ``rapidfuzz`` partial ratio >= 90."""
    fk = {(c, r) for c, r in foreign_keys if c != r}
    edges: dict[tuple[str, str], list[dict]] = {}
    for u in tools:
        fields = _old_fields(u.returns)
        for v in tools:
            if u is v:
                continue
            params = {}
            for p, s in ((v.parameters or {}).get("properties") or {}).items():
                t = s.get("type") if isinstance(s, dict) else None
                t = next((x for x in t if x != "null"), None) if isinstance(t, list) else t
                if t in ("string", "integer", "number", "boolean"):
                    params[p] = t
            found = []
            for path, name, t in fields:
                for p, pt in params.items():
                    if not (t == pt or {t, pt} == {"integer", "number"}):
                        continue
                    if t == "string" and (name in OLD_FREE_TEXT or p in OLD_FREE_TEXT):
                        continue
                    if (name, p) in fk:
                        found.append({"path": path, "param": p, "kind": "entity"})
                    elif _old_similarity(name, p) >= 90:
                        found.append({"path": path, "param": p, "kind": "name"})
            if found:
                edges[u.name, v.name] = found
    return edges


def _binding_set(edges: dict[tuple[str, str], list[dict]]) -> set[tuple[str, str, str, str]]:
    return {(u, v, ".".join(b["path"]), b["param"]) for (u, v), bs in edges.items() for b in bs}


def graph_bindings(graph: ToolGraph) -> set[tuple[str, str, str, str]]:
    return {(e.src, e.dst, e.src_field, e.dst_param) for e in graph.edges()}


def _shape(bindings: set[tuple[str, str, str, str]], n_tools: int) -> tuple[float, float, int]:
    pairs = {(u, v) for u, v, _, _ in bindings}
    different = sum(normalise(f.split(".")[-1]) != normalise(p) for _, _, f, p in bindings)
    density = len(pairs) / (n_tools * (n_tools - 1)) if n_tools > 1 else 0.0
    return density, different / len(bindings) if bindings else 0.0, len(bindings)


# --- synthetic catalogs for timing ------------------------------------------------------------------------------


def _resource_name(i: int) -> str:
    letters = ""
    i += 26 * 27  # three letters at least, so no two resources share a singular form by accident
    while i:
        i, r = divmod(i, 26)
        letters = "abcdefghijklmnopqrstuvwxyz"[r] + letters
    return "Res" + letters


def synthetic_tools(n: int, seed: int = 0) -> list[Tool]:
    """``n`` tools: resources of five operations (list, create, fetch, update, delete), each nested under an
    earlier resource, results shaped like Twilio's (``sid``, ``parent_sid``, a status, dates, a url). No key or
    filter is shared by every tool (Twilio's ``AccountSid`` is): that would make the output itself quadratic,
    and this measures the build, not the size of its answer."""
    rng = random.Random(seed)
    tools: list[Tool] = []
    for i in range(0, (n + 4) // 5):
        name = _resource_name(i)
        parent = _resource_name(rng.randrange(i)) if i else None
        plural = name + "s"
        item = {"type": "object", "title": name, "properties": {
            "sid": {"type": "string"}, "friendly_name": {"type": "string"}, "status": {"type": "string"},
            "date_created": {"type": "string"}, "url": {"type": "string"}, "size": {"type": "integer"},
            **({normalise(parent) + "_sid": {"type": "string"}} if parent else {})}}
        listing = {"type": "object", "properties": {normalise(plural): {"type": "array", "items": item},
                                                    "meta": {"type": "object", "properties": {
                                                        "page": {"type": "integer"}, "url": {"type": "string"}}}}}
        base = f"/v1/{parent}s/{{{parent}Sid}}/{plural}" if parent else f"/v1/{plural}"
        scope = {f"{parent}Sid": {"type": "string"}} if parent else {}
        ops = [
            ("List", "get", base, {**scope, "PageSize": {"type": "integer"}}, listing),
            ("Create", "post", base, {**scope, "FriendlyName": {"type": "string"}, "Size": {"type": "integer"}}, item),
            ("Fetch", "get", base + "/{Sid}", {**scope, "Sid": {"type": "string"}}, item),
            ("Update", "post", base + "/{Sid}", {**scope, "Sid": {"type": "string"}, "Status": {"type": "string"}}, item),
            ("Delete", "delete", base + "/{Sid}", {**scope, "Sid": {"type": "string"}}, None),
        ]
        for verb, method, route, params, returns in ops:
            tool = Tool(name=f"{verb}{name}", description=f"{verb} a {name}.", domain="synthetic",
                        parameters={"type": "object", "properties": params}, returns=returns,
                        mutates=method != "get")
            try:
                tool.origin = {"kind": "openapi", "method": method, "path": route}
            except AttributeError:  # a Tool without origin: the tool's name says the resource
                pass
            tools.append(tool)
    return tools[:n]


def _seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def timing(sizes: list[int], repeat: int, baseline: bool, twilio: dict[str, list[Tool]]) -> None:
    print("build time (min of", repeat, "runs)")
    rows = []
    for n in sizes:
        tools = synthetic_tools(n)
        new = _seconds(lambda tools=tools: ToolGraph.build(tools), repeat)
        old = _seconds(lambda tools=tools: baseline_build(tools), 1) if baseline and n <= 300 else None
        graph = ToolGraph.build(tools)
        rows.append((n, new))
        print(f"  synthetic {n:5d} tools: {new:7.3f} s" + (f"   (old matcher {old:7.2f} s)" if old else "")
              + f"   {graph.graph.number_of_edges()} edges, {len(graph.edges())} bindings")
    if len(rows) > 1:
        print(f"  ratio {rows[-1][0]}/{rows[0][0]} tools: {rows[-1][1] / rows[0][1]:.1f}x "
              f"(linear {rows[-1][0] / rows[0][0]:.0f}x, quadratic {(rows[-1][0] / rows[0][0]) ** 2:.0f}x)")
    merged = [t for name in TWILIO for t in twilio.get(name, [])]
    for label, tools in [*((n, twilio[n]) for n in TWILIO if n in twilio), ("all three Twilio", merged)]:
        if not tools:
            continue
        new = _seconds(lambda tools=tools: ToolGraph.build(tools), repeat)
        old = _seconds(lambda tools=tools: baseline_build(tools), 1) if baseline else None
        print(f"  {label}: {len(tools)} tools {new:7.3f} s" + (f"   (old matcher {old:7.2f} s)" if old else ""))


# --- foreign-key recall -----------------------------------------------------------------------------------------

_SIMPLE_SELECT = re.compile(r"^SELECT (?:DISTINCT )?(\w+) FROM (\w+)$", re.I)


def key_entities(env: Environment) -> dict[str, str]:
    """Which table's key a column or argument name holds.

    A single-column primary key ``k`` of table ``T`` holds a ``T`` key; a column ``c`` with ``REFERENCES R``
    holds an ``R`` key (``owner_id`` → users, ``parent_id`` → folders). A name that is no column but whose
    argument source is ``SELECT k FROM R`` of such a key (``from_account_id``) holds an ``R`` key too.
    """
    holds: dict[str, str] = {}
    pks = {}
    for table in env.tables():
        pk = [r["name"] for r in env.db.execute(f"PRAGMA table_info({table})").fetchall() if r["pk"]]
        pks[table] = pk
        if len(pk) == 1:
            holds.setdefault(pk[0], table)
    for table in env.tables():
        for fk in env.db.execute(f"PRAGMA foreign_key_list({table})").fetchall():
            holds.setdefault(fk["from"], fk["table"])
    for name, sql in env.domain_cls.arg_sources.items():
        m = _SIMPLE_SELECT.match(sql.strip())
        if "." not in name and name not in holds and m and m.group(2) in pks and pks[m.group(2)] == [m.group(1)]:
            holds[name] = m.group(2)
    return holds


def foreign_key_truth(tools: list[Tool], env: Environment) -> set[tuple[str, str, str]]:
    """``(u, v, param)``: a field of u's result holds a key of table R and v's parameter takes a key of R."""
    holds = key_entities(env)
    truth = set()
    for u in tools:
        fed = {holds[f.name] for f in output_fields(u.returns) if f.name in holds}
        for v in tools:
            if u is v:
                continue
            for param in (v.parameters.get("properties") or {}):
                if holds.get(param) in fed:
                    truth.add((u.name, v.name, param))
    return truth


def fk_recall() -> None:
    print("recall of the built-in domains' foreign-key edges")
    for name in sorted(DOMAINS):
        tools, fks, env = domain_source(name)
        truth = foreign_key_truth(tools, env)
        graph = ToolGraph.build(tools, fks)
        have = {(e.src, e.dst, e.dst_param) for e in graph.edges()}
        old = {(u, v, b["param"]) for (u, v), bs in baseline_build(tools, fks).items() for b in bs}
        missed = sorted(truth - have)
        print(f"  {name:8s} {len(truth & have)}/{len(truth)} = {len(truth & have) / len(truth):.3f}"
              f"   (old matcher {len(truth & old) / len(truth):.3f})" + (f"   missed e.g. {missed[:3]}" if missed else ""))


# --- labelled sample --------------------------------------------------------------------------------------------


def _describe(tool: Tool, param: str | None = None) -> str:
    origin = getattr(tool, "origin", None) or {}
    where = f"{origin.get('method', '').upper()} {origin.get('path', '')}".strip()
    text = f"{tool.name} [{where or 'no path'}] {'writes' if tool.mutates else 'reads'}: " + \
        tool.description.split("\n")[0][:90]
    if param is not None:
        schema = (tool.parameters.get("properties") or {}).get(param) or {}
        text += f" | {param}: {str(schema.get('description', ''))[:110]}"
    return text


def _labelled() -> set[tuple[str, str, str, str, str]]:
    if not LABELS.exists():
        return set()
    return {(r["domain"], r["src"], r["dst"], r["path"], r["param"])
            for r in map(json.loads, LABELS.read_text().splitlines())}


def draw(per_new: int, per_old: int, seed: int, sources: list[str] | None = None) -> None:
    """Per source: PER_NEW bindings of the current code and PER_OLD of the baseline's others, at random, none
    already labelled."""
    rng = random.Random(seed)
    done = _labelled()
    rows = []
    for source, (tools, fks) in all_sources().items():
        if sources and source not in sources:
            continue
        by_name = {t.name: t for t in tools}
        new = {b for b in graph_bindings(ToolGraph.build(tools, fks)) if (source, *b) not in done}
        old = {b for b in _binding_set(baseline_build(tools, fks)) if (source, *b) not in done} - new
        picked = rng.sample(sorted(new), min(per_new, len(new))) + rng.sample(sorted(old), min(per_old, len(old)))
        for u, v, path, param in picked:
            rows.append({"domain": source, "src": u, "dst": v, "path": path, "param": param, "draw": "per-source",
                         "src_tool": _describe(by_name[u]), "dst_tool": _describe(by_name[v], param)})
    rng.shuffle(rows)
    for row in rows:
        print(json.dumps(row))


def draw_patterns(per_source: int, seed: int, sources: list[str]) -> None:
    """Per source: PER_SOURCE distinct name patterns (field name → parameter name) of the union of both
    matchers' bindings, one binding each, none already labelled. A uniform draw over bindings mostly finds
    the commonest pattern (``account_sid`` → ``AccountSid`` is 85% of Twilio v2010's); this one finds the rest."""
    rng = random.Random(seed)
    done = _labelled()
    rows = []
    for source, (tools, fks) in all_sources().items():
        if source not in sources:
            continue
        by_name = {t.name: t for t in tools}
        union = graph_bindings(ToolGraph.build(tools, fks)) | _binding_set(baseline_build(tools, fks))
        patterns = defaultdict(list)
        for b in sorted(union):
            if (source, *b) not in done:
                patterns[normalise(b[2].split(".")[-1]), normalise(b[3])].append(b)
        for key in rng.sample(sorted(patterns), min(per_source, len(patterns))):
            u, v, path, param = rng.choice(patterns[key])
            rows.append({"domain": source, "src": u, "dst": v, "path": path, "param": param, "draw": "per-pattern",
                         "src_tool": _describe(by_name[u]), "dst_tool": _describe(by_name[v], param)})
    rng.shuffle(rows)
    for row in rows:
        print(json.dumps(row))


def precision() -> None:
    labels = [json.loads(line) for line in LABELS.read_text().splitlines() if line.strip()]
    graphs = {}
    sources = all_sources()
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # kept true, kept false, dropped true, dropped false
    for row in labels:
        if row["domain"] not in sources:
            continue
        if row["domain"] not in graphs:
            graphs[row["domain"]] = graph_bindings(ToolGraph.build(*sources[row["domain"]]))
        kept = (row["src"], row["dst"], row["path"], row["param"]) in graphs[row["domain"]]
        counts[row["domain"]][(0 if kept else 2) + (0 if row["label"] else 1)] += 1
    total = [sum(c[i] for c in counts.values()) for i in range(4)]
    print(f"labelled sample: {len(labels)} bindings from {len(counts)} sources ({LABELS.name})")
    for source, (kt, kf, dt, df) in sorted(counts.items()):
        p = f"{kt / (kt + kf):.2f}" if kt + kf else "  - "
        print(f"  {source:30s} kept {kt + kf:3d} (true {kt:3d}) precision {p}   dropped {dt + df:3d} (true {dt})")
    kt, kf, dt, df = total
    print(f"  precision {kt}/{kt + kf} = {kt / max(kt + kf, 1):.3f}; recall on the sample's true bindings "
          f"{kt}/{kt + dt} = {kt / max(kt + dt, 1):.3f}")
    for draw in ("per-source", "per-pattern"):
        rows = [r for r in labels if r.get("draw", "per-source") == draw and r["domain"] in graphs]
        kept = [r for r in rows if (r["src"], r["dst"], r["path"], r["param"]) in graphs[r["domain"]]]
        true_kept = sum(r["label"] for r in kept)
        print(f"    {draw} draw: {len(rows)} labelled, {len(kept)} kept, precision "
              f"{true_kept}/{len(kept)} = {true_kept / max(len(kept), 1):.3f}, "
              f"recall {true_kept}/{sum(r['label'] for r in rows)}")


def densities(sources: dict[str, tuple[list[Tool], list[tuple[str, str]]]]) -> None:
    print("density (edges / ordered tool pairs) and share of bindings between different names: before → after")
    for source, (tools, fks) in sources.items():
        before = _shape(_binding_set(baseline_build(tools, fks)), len(tools))
        after = _shape(graph_bindings(ToolGraph.build(tools, fks)), len(tools))
        print(f"  {source:30s} {len(tools):4d} tools  density {before[0]:.3f} → {after[0]:.3f}   "
              f"name-different {before[1]:.2f} → {after[1]:.2f}   bindings {before[2]} → {after[2]}")


# --- per-spec labels: precision of the dependencies, recall of true edges read from each spec ----------------


def spec_sources(github: str | None) -> dict[str, Path]:
    found = {name: CATALOGS / rel for name, rel in SPECS.items() if (CATALOGS / rel).exists()}
    if github:
        found["github"] = Path(github)
    return found


def _load_spec(path: Path) -> list[Tool] | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return load_catalog(path)
    except CatalogError as exc:
        print(f"  {path}: not imported ({exc})")
        return None


def dependency_bindings(graph: ToolGraph) -> set[tuple[str, str, str, str]]:
    return {(e.src, e.dst, e.src_field, e.dst_param) for e in graph.dependencies()}


def draw_specs(per_spec: int, seed: int, github: str | None) -> None:
    """Per spec: PER_SPEC dependencies of the current graph at random (seeded by spec and seed), none labelled."""
    labels = [json.loads(line) for line in SPEC_LABELS.read_text().splitlines() if line.strip()] \
        if SPEC_LABELS.exists() else []
    done = {(r["spec"], r["src"], r["dst"], r["path"], r["param"]) for r in labels}
    for spec, path in spec_sources(github).items():
        tools = _load_spec(path)
        if not tools:
            continue
        by_name = {t.name: t for t in tools}
        deps = sorted(b for b in dependency_bindings(ToolGraph.build(tools)) if (spec, *b) not in done)
        for u, v, field_path, param in random.Random(f"{spec}:{seed}").sample(deps, min(per_spec, len(deps))):
            print(json.dumps({"spec": spec, "src": u, "dst": v, "path": field_path, "param": param,
                              "set": "precision", "draw": f"seed {seed}",
                              "src_tool": _describe(by_name[u]), "dst_tool": _describe(by_name[v], param)}))


def spec_figures(github: str | None) -> None:
    labels = [json.loads(line) for line in SPEC_LABELS.read_text().splitlines() if line.strip()]
    print(f"per-spec labels ({SPEC_LABELS.name}): precision of dependencies on seeded draws, recall on true edges "
          "read from the spec")
    print(f"  {'spec':25s} {'tools':>5s} {'build s':>7s} {'deps':>6s} {'echoes':>6s}  precision (kept true/kept)"
          "   recall (found/true)   per draw")
    for spec, path in spec_sources(github).items():
        tools = _load_spec(path)
        if not tools:
            continue
        start = time.perf_counter()
        graph = ToolGraph.build(tools)
        seconds = time.perf_counter() - start
        deps, every = dependency_bindings(graph), graph_bindings(graph)
        rows = [r for r in labels if r["spec"] == spec]
        judged = [r for r in rows if r["set"] == "precision" and (r["src"], r["dst"], r["path"], r["param"]) in deps]
        true_kept = sum(r["label"] for r in judged)
        truth = [r for r in rows if r["set"] == "recall"]
        found = [r for r in truth if (r["src"], r["dst"], r["path"], r["param"]) in deps]
        draws = []
        for draw in sorted({r["draw"] for r in judged}):
            kept = [r for r in judged if r["draw"] == draw]
            draws.append(f"{draw}: {sum(r['label'] for r in kept)}/{len(kept)}")
        p = true_kept / len(judged) if judged else 0.0
        r_ = len(found) / len(truth) if truth else 0.0
        print(f"  {spec:25s} {len(tools):5d} {seconds:7.2f} {len(deps):6d} {len(every - deps):6d}  "
              f"{true_kept:3d}/{len(judged):3d} = {p:.2f}             {len(found):2d}/{len(truth):2d} = {r_:.2f}"
              f"        {'; '.join(draws)}")
        missed = [(r["src"], r["path"], r["dst"], r["param"]) for r in truth if r not in found]
        for m in missed:
            print(f"      missed: {m[0]}.{m[1]} -> {m[2]}.{m[3]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", action="store_true", help="time the old matcher too (slow)")
    parser.add_argument("--draw", type=int, nargs=2, metavar=("PER_NEW", "PER_OLD"))
    parser.add_argument("--draw-patterns", type=int, metavar="PER_SOURCE")
    parser.add_argument("--sources", nargs="+", help="draw from these sources only (default: all; "
                        "the Twilio descriptions for --draw-patterns)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--specs", action="store_true", help="precision and recall per real spec, on "
                        "data/edge_labels_specs.jsonl, then build times")
    parser.add_argument("--draw-specs", type=int, metavar="PER_SPEC", help="draw unlabelled dependencies per spec")
    parser.add_argument("--github", help="path to GitHub's api.github.com.json (npm pack @octokit/openapi@23.0.2)")
    args = parser.parse_args()
    if args.draw_specs:
        draw_specs(args.draw_specs, args.seed, args.github)
        return
    if args.specs:
        spec_figures(args.github)
        timing(args.sizes, args.repeat, False, {})
        return
    if args.draw:
        draw(*args.draw, args.seed, args.sources)
        return
    if args.draw_patterns:
        draw_patterns(args.draw_patterns, args.seed, args.sources or list(TWILIO))
        return
    sources = all_sources()
    timing(args.sizes, args.repeat, args.baseline, {n: t for n, (t, _) in sources.items() if n in TWILIO})
    densities(sources)
    fk_recall()
    if LABELS.exists():
        precision()


if __name__ == "__main__":
    main()
