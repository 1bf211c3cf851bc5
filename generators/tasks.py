"""Execute-first task generation.

A plan is grown on a working copy of the environment, one executed call at a time: a backbone chain of the
sampled depth along tool-graph edges, then extra branches (fork, merge or an independent parallel call).
Only calls that succeed are kept, so every plan is executable by construction. The executed trace then
yields the expected final-state diff and answer, and a templated goal that the trace entails, with key
argument values moved into the user's private information.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import networkx as nx

from envs import DOMAINS, Environment, ToolEnvironment, ToolSpec
from envs.datagen import bookkeeping, value_for
from generators.graph import ToolGraph, domain_graph
from generators.sampling import SamplingConfig
from schemas import Lineage, PlanStep, Signature, Task
from schemas.verifier import (
    AnswerCheck,
    AnswerSource,
    Check,
    CodeCheck,
    ConstraintsCheck,
    ExecutionCheck,
    ForbiddenTool,
    FormatCheck,
    MaxCalls,
    NoExtraWrites,
    RequiredCall,
    RequiredCallsCheck,
    Rule,
    SchemaCheck,
    StateDiffCheck,
    VerifierSpec,
    record_json,
)

MAX_TRIES = 6
ValueProposer = Callable[[str, str, dict[str, Any], "ToolEnvironment", int], Any]
"""``(tool, param, arguments so far, environment, variant) -> value or None`` for free-form arguments."""
SHARED_ENTITIES = frozenset({"room", "product", "payee"})
SAMPLE_ATTEMPTS = 16
# a placeholder of a phrase template: ``{order_id}``, or labelled ``{ConversationSid:conversation}`` (how the
# request names the value: "conversation CH…", "the conversation from step 2")
PLACEHOLDER = r"\{(\w+)(?::([^{}]*))?\}"
_HTTP_LINE = re.compile(r"(?i)\b(?:get|post|put|patch|delete|head|options)\s+/")

FAILURE_REASONS = {
    "no_first_call": "no tool could be called first: every one lacked a value for a required argument or failed",
    "chain_ended": "the plan could not be grown to the drawn depth: no next tool took a value from the last result",
    "write_undetectable": "leaving one write out reached the same final state: no verifier could tell it was done",
    "no_answer": "the plan wrote nothing and its last results have no scalar a user could ask for",
    "no_matching_variant": "no plan sampled matched the parent's signature (variants of a closed-loop run)",
}

_DIFFERS = re.compile(r"tool message for (\S+) differs from the real result")


def unstable_tools(verdict_detail: str, messages: list[dict[str, Any]]) -> set[str]:
    """The tools whose result differed when the reference's calls were run again (the detail of its failed
    ``observations`` check names the calls): their answers change from run to run."""
    ids = set(_DIFFERS.findall(verdict_detail))
    return {c["function"]["name"] for m in messages for c in (m.get("tool_calls") or []) if c.get("id") in ids}
"""Why a draw made no task, by the code recorded in ``sample_failures`` (each attempt has one)."""


@dataclass
class ExecutedStep:
    id: str
    tool: str
    args: dict[str, Any]  # literals or {"$ref", "path"}
    values: dict[str, Any]  # the concrete arguments it was executed with
    result: Any
    level: int
    parents: list[str] = field(default_factory=list)


def resolve(result: Any, path: list[Any]) -> Any:
    for key in path:
        result = result[key]
    return result


TEXT_PARAMS = frozenset({"content", "text", "body", "message", "note", "notes", "comment", "description", "title"})
"""Free-text parameters (normalised names) a user's tool gets a plausible value for without a model."""
_EXAMPLES = re.compile(r"\b(?:e\.\s?g\.|for example|such as|example:)[,:]?\s*((?:['\"`][^'\"`]{1,80}['\"`][\s,]*(?:or\s+|and\s+)?)+)",
                       re.IGNORECASE)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def suggested_values(schema: dict[str, Any]) -> list[Any]:
    """Values a parameter's own schema suggests: its ``examples``/``example``/``default``, the quoted examples
    of its description ("IANA timezone name (e.g., 'America/New_York', 'Europe/London')"), a time for one
    described as HH:MM."""
    found: list[Any] = []
    examples = schema.get("examples")
    found += [e for e in examples if isinstance(e, (str, int, float))] if isinstance(examples, list) else []
    found += [schema[k] for k in ("example", "default") if isinstance(schema.get(k), (str, int, float))
              and not isinstance(schema.get(k), bool)]
    text = schema.get("description") if isinstance(schema.get("description"), str) else ""
    for clause in _EXAMPLES.findall(text):
        found += re.findall(r"['\"`]([^'\"`]{1,80})['\"`]", clause)
    if not found and re.search(r"\bHH:MM\b", text):
        found = ["09:30", "14:00", "18:45"]
    return list(dict.fromkeys(found))


def noun(param: str) -> str:
    """How a request names a parameter: ``from_account_id`` → "account", ``new_city`` → "new city"."""
    if param.endswith("_id"):
        return param[:-3].split("_")[-1]
    return param.replace("_", " ")


def is_id(param: str) -> bool:
    return param.endswith("_id")


class PlanSampler:
    """Samples executable plans on one domain environment.

    Args:
        env: The environment in its initial state (it is forked, never changed).
        graph: The domain's tool graph.
        config: Sampling knobs.
        usage: Tool usage counts shared across samples; tools used less are favoured (diversity).
    """

    def __init__(self, env: ToolEnvironment, graph: ToolGraph, config: SamplingConfig, usage: Counter | None = None,
                 propose: ValueProposer | None = None, free_text: bool = False):
        self.base = env
        # a user's tools (no phrase templates, no seeded values for free arguments): values their schemas suggest
        self.free_text = free_text
        # tools whose answers differ between two runs of the same calls (a clock, a file's access time): no
        # verifier can check them, so once a reference shows it they are not sampled again
        self.unstable: set[str] = set()
        self.graph = graph
        self.config = config
        self.usage = usage if usage is not None else Counter()
        self.specs: dict[str, ToolSpec] = env.specs
        self.propose = propose
        self.failure: tuple[str, str] | None = None  # why the last sample() gave None: (reason code, detail)
        self._problem = ""  # the last call that could not be made, for the detail of a failure

    @cached_property
    def reachable_depth(self) -> int:
        return self.graph.longest_chain()

    # argument binding -----------------------------------------------------------------------------------
    def _literal(self, work: ToolEnvironment, tool: str, param: str, schema: dict[str, Any], rng: random.Random,
                 partial: dict[str, Any] | None = None) -> Any:
        candidates = work.candidates(param, tool)
        if candidates:
            return rng.choice(candidates)
        if "enum" in schema:
            return rng.choice(schema["enum"])
        t = schema.get("type")
        t = next((x for x in t if x != "null"), None) if isinstance(t, list) else t
        if t == "integer":
            return rng.randint(1, 3)
        if t == "number":
            return float(rng.randint(2, 20) * 5)
        if t == "boolean":
            return rng.random() < 0.5
        if self.propose is not None and t in ("string", "array", "object", None):
            # free text no state supplies (a query, a message): a model proposes it, execute-first keeps it
            return self.propose(tool, param, dict(partial or {}), work, rng.randrange(3))
        suggested = suggested_values(schema) if self.free_text else []
        if suggested:  # no model: the examples the tool's own schema gives
            return rng.choice(suggested)
        if self.free_text and t == "string" and _norm(param) in TEXT_PARAMS:
            return value_for(schema, param, rng)  # a note's text, a message: plausible words by the name
        return None  # free text with no source in the state: not bindable

    def _bind(
        self, work: Environment, tool: str, fixed: dict[str, Any], rng: random.Random
    ) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """Complete ``fixed`` (param → ref) with literal values; returns (args, concrete values) or None."""
        schema = self.specs[tool].record.parameters
        phrased = {m.group(1) for m in re.finditer(PLACEHOLDER, self.specs[tool].phrase)}
        args, values = {}, {}
        rows = [r for r in work.candidate_rows(tool) if all(r.get(p, v[1]) == v[1] for p, v in fixed.items())]
        row = rng.choice(rows) if rows else {}
        for param, pschema in schema["properties"].items():
            if param in fixed:
                args[param], values[param] = fixed[param]
                continue
            required = param in schema.get("required", [])
            # an optional argument the request could not state would make the goal underdetermined
            if not required and (param not in phrased or rng.random() >= self.config.optional_arg_share):
                continue
            value = row[param] if param in row else self._literal(work, tool, param, pschema, rng, values)
            if value is None:
                if required:
                    self._problem = f"{tool}: no value for its required argument {param!r}"
                    return None
                continue
            args[param] = values[param] = value
        return args, values

    def _weighted(self, tools: list[str], rng: random.Random) -> list[str]:
        """Tools in a random order that favours the less used ones (inverse-usage weights)."""
        k = self.config.diversity
        keyed = [(rng.random() ** (1.0 + k * self.usage[f"{self.graph.domain}.{t}"]), t) for t in tools
                 if t not in self.unstable]
        return [t for _, t in sorted(keyed, reverse=True)]

    def _try_step(
        self, work: Environment, steps: list[ExecutedStep], tool: str, refs: dict[str, tuple[ExecutedStep, tuple]], rng: random.Random
    ) -> ExecutedStep | None:
        """Bind ``tool`` (some params from earlier results via ``refs``), execute it, keep it if it succeeds."""
        for _ in range(MAX_TRIES):
            fixed = {}
            for param, (parent, path) in refs.items():
                concrete = []
                node = parent.result
                for key in path:
                    if key == "*":
                        if not isinstance(node, list) or not node:
                            return None
                        key = rng.randrange(len(node))
                    if not isinstance(node, (dict, list)) or (isinstance(node, dict) and key not in node) or (
                            isinstance(node, list) and not isinstance(key, int)):
                        return None  # an optional field this result left out (or a result unlike its schema)
                    concrete.append(key)
                    node = node[key]
                fixed[param] = ({"$ref": parent.id, "path": concrete}, node)
            bound = self._bind(work, tool, fixed, rng)
            if bound is None:
                return None
            args, values = bound
            if any(s.tool == tool and s.values == values for s in steps):
                continue  # the same call twice adds nothing
            result, error = work.execute(tool, values)
            if error is not None:
                self._problem = f"{tool} failed: {str(error)[:160]}"
            if error is None:
                parents = sorted({p.id for p, _ in refs.values()})
                level = 1 + max((s.level for s in steps if s.id in parents), default=-1)
                return ExecutedStep(f"s{len(steps)}", tool, args, values, result, level, parents)
        return None

    # plan growth --------------------------------------------------------------------------------------------
    def _extend(self, work: Environment, steps: list[ExecutedStep], parent: ExecutedStep, rng: random.Random, max_level: int) -> ExecutedStep | None:
        if parent.level + 1 > max_level:
            return None
        children = {s.tool for s in steps if parent.id in s.parents}
        options = [t for t in self.graph.successors(parent.tool) if t != parent.tool and t not in children]
        for tool in self._weighted(options, rng):
            bindings = self.graph.bindings(parent.tool, tool)
            by_param: dict[str, list[dict]] = {}
            for b in bindings:
                by_param.setdefault(b["param"], []).append(b)
            param = rng.choice(sorted(by_param))
            binding = rng.choice(by_param[param])
            step = self._try_step(work, steps, tool, {param: (parent, binding["path"])}, rng)
            if step is not None:
                return step
        return None

    def _merge(self, work: Environment, steps: list[ExecutedStep], rng: random.Random, max_level: int) -> ExecutedStep | None:
        """A call whose parameters come from two different earlier steps."""
        for tool in self._weighted(list(self.specs), rng):
            sources = []
            for s in steps:
                for b in self.graph.bindings(s.tool, tool):
                    sources.append((s, b))
            rng.shuffle(sources)
            for (s1, b1) in sources:
                for (s2, b2) in sources:
                    if s1.id != s2.id and b1["param"] != b2["param"] and max(s1.level, s2.level) + 1 <= max_level:
                        step = self._try_step(work, steps, tool, {b1["param"]: (s1, b1["path"]), b2["param"]: (s2, b2["path"])}, rng)
                        if step is not None:
                            return step
                        break
        return None

    def sample(self, rng: random.Random, depth: int | None = None) -> tuple[Environment, list[ExecutedStep], dict] | None:
        """Grow one executed plan of ``depth`` (default: drawn from the config); returns the working environment
        (in the final state), the steps and the initial state rows, or None if the shape could not be realised."""
        cfg = self.config
        # a depth the graph cannot reach would only fail; a user's catalog may have short chains only
        depth = depth or min(rng.randint(cfg.depth_min, cfg.depth_max), max(cfg.depth_min, self.reachable_depth))
        self.failure, self._problem = None, ""
        work = self.base.fork()
        initial = work.rows()
        steps: list[ExecutedStep] = []
        roots = list(self.specs)
        if depth > 1:  # a root whose results feed no other tool cannot start a chain (most tools of a wide catalog)
            roots = [t for t in roots if any(v != t for v in self.graph.successors(t))] or roots
        for root in self._weighted(roots, rng):
            step = self._try_step(work, steps, root, {}, rng)
            if step is not None:
                steps.append(step)
                break
        if not steps:
            self.failure = ("no_first_call", self._problem)
            return None
        while len(steps) < depth:
            self._problem = ""
            step = self._extend(work, steps, steps[-1], rng, depth - 1)
            if step is None:
                self.failure = ("chain_ended", f"after {' → '.join(s.tool for s in steps)} (depth {depth})"
                                + (f"; {self._problem}" if self._problem else
                                   f"; {steps[-1].tool} feeds no other tool in the graph"
                                   + (" whose answers stay the same from run to run"
                                      if {t for t in self.graph.successors(steps[-1].tool) if t != steps[-1].tool}
                                      else "")))
                return None
            steps.append(step)
        if cfg.max_width > 1 and rng.random() < cfg.nonlinear_share:
            for _ in range(rng.randint(1, cfg.max_width - 1)):
                kinds = ["fork", "merge", "parallel"] if depth > 1 else ["parallel"]
                kind = rng.choice(kinds)
                if kind == "fork":
                    parents = [s for s in steps if s.level < depth - 1]
                    step = self._extend(work, steps, rng.choice(parents), rng, depth - 1) if parents else None
                elif kind == "merge":
                    step = self._merge(work, steps, rng, depth - 1)
                else:
                    step = None
                    for tool in self._weighted(list(self.specs), rng):
                        step = self._try_step(work, steps, tool, {}, rng)
                        if step is not None:
                            break
                if step is not None:
                    steps.append(step)
        undetectable = self._undetectable_write(steps, work)
        if undetectable is not None:
            self.failure = ("write_undetectable", f"{undetectable.tool}({undetectable.values}) changes nothing "
                            f"the other calls do not, or only bookkeeping fields")
            return None
        for s in steps:
            self.usage[f"{self.graph.domain}.{s.tool}"] += 1
        return work, steps, initial

    @cached_property
    def _bookkeeping(self) -> bool:
        """Whether the state has fields a server keeps for itself (``date_updated``): see ``_undetectable_write``."""
        return any(bookkeeping(col) for rows in self.base.rows().values() for row in list(rows.values())[:1]
                   for col in row)

    def _undetectable_write(self, steps: list[ExecutedStep], work: Environment) -> ExecutedStep | None:
        """The write whose leaving out, the other calls unchanged, reaches the same final state (a limit set
        twice, share-then-unshare), or one that differs only in bookkeeping fields (an update to the values a
        row already had, which only moved its ``date_updated``): no verifier could tell whether it was done, and
        no user asked for it. None if every write matters."""
        final_hash = work.state_hash()
        final_rows = None
        for skipped in (s for s in steps if self.specs[s.tool].mutates):
            trial = self.base.fork()
            for s in steps:
                if s is not skipped:
                    trial.execute(s.tool, s.values)
            same = trial.state_hash() == final_hash
            if not same and self._bookkeeping:
                final_rows = final_rows if final_rows is not None else work.rows()
                same = only_bookkeeping(trial.diff(final_rows))
            trial.close()  # a process-backed environment (an MCP server) is a process per fork
            if same:
                return skipped
        return None


def only_bookkeeping(diff: dict[str, Any]) -> bool:
    """Whether a state diff changes nothing but bookkeeping fields (``envs.datagen.bookkeeping``) of rows that
    exist before and after; an empty diff is not one."""
    changed = False
    for change in diff.values():
        if change.get("inserted") or change.get("deleted"):
            return False
        for cols in (change.get("updated") or {}).values():
            if not all(bookkeeping(c) for c in cols):
                return False
            changed = changed or bool(cols)
    return changed


# --- from an executed plan to a task -------------------------------------------------------------------------


def signature(steps: list[ExecutedStep]) -> Signature:
    g = nx.DiGraph()
    g.add_nodes_from(s.id for s in steps)
    g.add_edges_from((p, s.id) for s in steps for p in s.parents)
    depth = nx.dag_longest_path_length(g) + 1 if steps else 0
    width = max(Counter(s.level for s in steps).values())
    n = len(steps)
    max_in = max((d for _, d in g.in_degree()), default=0)
    max_out = max((d for _, d in g.out_degree()), default=0)
    # Named by the richest structure present: a merge next to an independent call is still a merge.
    if n == 1:
        topology = "single"
    elif g.number_of_edges() == 0:
        topology = "parallel"
    elif max_in >= 2 and max_out >= 2:
        topology = "dag"
    elif max_in >= 2:
        topology = "merge"
    elif max_out >= 2:
        topology = "fork"
    elif nx.is_weakly_connected(g):
        topology = "chain"
    else:
        topology = "dag"  # chains side by side: independent calls next to a dependent sequence
    return Signature(topology, depth, width, n, sorted({s.tool for s in steps}))


def _render(template: str, rendered: dict[str, tuple[str, str]]) -> str:
    """Fill a phrase template; each value is (kind, text), and a noun already in the template is not repeated."""

    def sub(m: re.Match) -> str:
        word, quote, param, label = m.group(1), m.group(2), m.group(3), m.group(4)
        if param not in rendered:
            return m.group(0)
        kind, text = rendered[param]
        if label is not None:  # a labelled placeholder: the text says its noun itself ("conversation CH…")
            return (f"{word} " if word else "") + text
        if word and (word.lower() in noun(param).split() or (word.lower() == "the" and text.startswith(("the ", "my ")))):
            word = None  # "order {order_id}" -> "order O0001"; "the {category}" -> "the category from step 2"
        if kind != "literal":
            quote = ""  # a reference is not the literal text: "name 'the name from step 2'" would mislead
        return (f"{word} " if word else "") + quote + text + quote

    text = re.sub(r"(?:\b(\w+)\s+)?(['\"]?)" + PLACEHOLDER + r"\2", sub, template)
    # Optional parameters the plan left unbound: drop "(reason: {reason})", or "under {max_price}" with its word.
    text = re.sub(r"\s*\([^()]*" + PLACEHOLDER + r"[^()]*\)", "", text)
    return re.sub(r"\s+(?:\w+\s+)?['\"]?" + PLACEHOLDER + r"['\"]?", "", text)


def _labelled(label: str, kind: str, value: Any, text: str) -> str:
    """A labelled placeholder's words: ``conversation CH…``, ``friendly name "Support desk"``, ``the
    conversation from step 2``; a label ending in " to" keeps it ("set status to …", "… to the status from …")."""
    base = label[:-3] if label.endswith(" to") else label
    head = f"{label} " if base != label else ""
    if kind == "ref":
        return head + text.replace("the \0", f"the {base}", 1)
    if kind == "private":
        return head + text
    if isinstance(value, bool):
        said = str(value).lower()
    elif isinstance(value, list) and all(not isinstance(v, (dict, list)) for v in value):
        said = ", ".join(str(v) for v in value)
    elif isinstance(value, (dict, list)):
        said = json.dumps(value)
    elif isinstance(value, str) and re.search(r"\s", value):
        said = f'"{value}"'
    else:
        said = str(value)
    return f"{label} {said}"


def forbidden_action(spec: ToolSpec) -> str:
    """What a constraint forbids, in words ("cancel a pending order", "delete any message in any conversation"):
    a one-line description as written, else the tool's request phrase with its values left out."""
    desc = (spec.record.description or "").strip().rstrip(".")
    if desc and "\n" not in desc and not _HTTP_LINE.search(desc):
        return desc if desc[1:2].isupper() else f"{desc[0].lower()}{desc[1:]}"
    text = re.sub(r"\s*\([^()]*" + PLACEHOLDER + r"[^()]*\)", "", spec.phrase)
    text = re.sub(r"\{\w+:([^{}]*)\}", lambda m: "any " + m.group(1).removesuffix(" to"), text)
    text = _render(text, {}).strip().rstrip(".")
    text = re.sub(r"\s+(?:with|for|of|in|to)$", "", text) or spec.name.replace("_", " ")
    return text if text[1:2].isupper() else f"{text[0].lower()}{text[1:]}"


# what a user would ask about a result of a tool known only by its description (``ToolSpec.answer == "auto"``)
AUTO_ANSWER_FIELDS = ("status", "state", "count", "total", "balance", "name", "title", "friendly_name", "id", "sid")


def answer_field(spec: ToolSpec, result: Any) -> str | None:
    """The result field a sink's answer is: the spec's, or for ``"auto"`` the first telling scalar the result has."""
    if spec.answer != "auto":
        return spec.answer
    if isinstance(result, list):
        return "#"
    if not isinstance(result, dict):
        return None
    scalars = [k for k, v in result.items() if isinstance(v, (str, int, float)) and not isinstance(v, bool)
               and v != ""]
    lowered = {k.lower(): k for k in scalars}
    if scalars:
        return next((lowered[f] for f in AUTO_ANSWER_FIELDS if f in lowered), scalars[0])
    lists = [k for k, v in result.items() if isinstance(v, list)]
    return f"#{lists[0]}" if len(lists) == 1 else None  # {"conversations": [...], "meta": {...}}: how many


def answer_value(field: str | None, result: Any) -> Any:
    """The answer a result gives for an answer field: a field's value, ``"#"`` a list's length, ``"#key"`` the
    length of the list under ``key`` (a wrapped list result)."""
    if field == "#":
        return len(result) if isinstance(result, list) else None
    if field and field.startswith("#") and isinstance(result, dict):
        inner = result.get(field[1:])
        return len(inner) if isinstance(inner, list) else None
    if field and isinstance(result, dict):
        return result.get(field)
    return None


def answer_label(field: str) -> str:
    """How a request or a report names an answer field."""
    if field == "#":
        return "number of results"
    if field.startswith("#"):
        return f"number of {field[1:].replace('_', ' ')}"
    return field.replace("_", " ")


def build_task(
    *,
    env: Environment,
    work: Environment,
    steps: list[ExecutedStep],
    initial: dict,
    rng: random.Random,
    config: SamplingConfig,
    task_id: str,
    run_id: str,
    batch: int,
    sampler_seed: int,
    code_check: bool = False,
) -> Task | None:
    """Phrase an executed plan as a task with its expected outcome and per-instance verifier spec."""
    specs = env.specs
    private = _Private.of(steps, rng, config.private_share)
    requests_of = _requests_of(steps, specs)
    answers, sources = _answers(steps, specs)
    expected_diff = work.diff(initial)
    children = {p for s in steps for p in s.parents}
    prose = all(not isinstance(s.result, (dict, list)) for s in steps if s.id not in children)
    if not answers and not (prose and expected_diff):
        # A server that answers in prose (mcp-server-git: "Changes committed successfully …") has no answer
        # field: a plan of its that writes is checked by its state diff alone. Structured results without a
        # scalar to ask about make no task, as before.
        return None
    rules, closing = _rules(steps, specs, rng)
    requests = _requests(steps, specs, private, requests_of, sources, closing)
    checks = _checks(steps, expected_diff, answers, sources, rules, code_check)
    plan = [
        PlanStep(id=s.id, tool=s.tool, args=s.args, private=private.params[s.id], request=requests_of[s.id])
        for s in steps
    ]
    return Task(
        task_id=task_id,
        run_id=run_id,
        batch=batch,
        domain=env.domain_cls.name,
        env_seed=env.seed,
        goal=" ".join(requests),
        requests=requests,
        private_info=private.info,
        constraints=[record_json(r) for r in rules],
        reference_plan=plan,
        expected_diff=expected_diff,
        expected_answer=answers,
        signature=signature(steps),
        lineage=Lineage(generator="graph-sampler/execute-first", sampler_seed=sampler_seed),
        initial_state_hash=env.state_hash(),
        final_state_hash=work.state_hash(),
        verifier=VerifierSpec(checks).to_json(),
    )


@dataclass
class _Private:
    """Private information: identifying literals the user knows but does not say up front. Decided once per
    value: a value the user keeps private is never stated, whichever step uses it."""

    info: dict[str, Any]  # private_info key (the first parameter that held it) -> value
    key_of: dict[Any, str | None]  # value -> its private_info key, or None once decided public
    params: dict[str, list[str]]  # step id -> its parameters holding a private value

    @classmethod
    def of(cls, steps: list[ExecutedStep], rng: random.Random, share: float) -> _Private:
        out = cls({}, {}, {s.id: [] for s in steps})
        for s in steps:
            for param, value in s.args.items():
                # The user keeps their own identifiers to themselves; a new value (a city to move to) is the
                # request itself, and shared things (a room, a product, a payee) are not "mine".
                identifying = (is_id(param) and noun(param) not in SHARED_ENTITIES) or param == "email"
                if isinstance(value, dict) or not identifying or not isinstance(value, str):
                    continue
                if value not in out.key_of:
                    keep = param not in out.info and rng.random() < share
                    out.key_of[value] = param if keep else None
                    if keep:
                        out.info[param] = value
                if out.key_of[value] is not None:
                    out.params[s.id].append(param)
        return out


def _requests_of(steps: list[ExecutedStep], specs: dict[str, ToolSpec]) -> dict[str, int]:
    """Step id -> the request that asks for it: one request per state change, the user asks for one thing at a
    time (at most three requests, the last step in the last)."""
    requests_of: dict[str, int] = {}
    req = 0
    for s in steps:
        requests_of[s.id] = req
        if specs[s.tool].mutates and req < 2 and s is not steps[-1]:
            req += 1
    return requests_of


def _answers(steps: list[ExecutedStep], specs: dict[str, ToolSpec]) -> tuple[list[Any], list[AnswerSource]]:
    """The expected answer: a scalar of each result no later step reads, and where it comes from."""
    children = {p for s in steps for p in s.parents}
    answers, sources = [], []
    for s in steps:
        if s.id in children:
            continue
        field = answer_field(specs[s.tool], s.result)
        value = answer_value(field, s.result)
        if value is not None and not isinstance(value, (dict, list)):
            answers.append(value)
            sources.append(AnswerSource(step=s.id, field=field))
    return answers, sources


def _phrase(s: ExecutedStep, steps: list[ExecutedStep], specs: dict[str, ToolSpec], private: _Private) -> str:
    """One step's line of a request: its tool's phrase with each argument said as a reference to an earlier
    step's result, the user's own private value, or the literal."""
    index = {x.id: i for i, x in enumerate(steps)}
    rendered = {}
    labels = {m.group(1): m.group(2) for m in re.finditer(PLACEHOLDER, specs[s.tool].phrase) if m.group(2)}
    for param, value in s.args.items():
        if isinstance(value, dict):
            ref = steps[index[value["$ref"]]]
            k = index[ref.id] + 1
            path = value["path"]
            pos = next((i for i, p in enumerate(path) if isinstance(p, int)), None)
            if pos is None:
                where = f"step {k}"
            else:
                what = "result" if pos == 0 else noun(str(path[pos - 1])).rstrip("s")
                where = f"{what} #{path[pos] + 1} of step {k}"
            rendered[param] = ("ref", f"the {noun(param)} from {where}")
        elif param in private.params[s.id]:
            key = private.key_of[value]
            rendered[param] = ("private", f"my {noun(key)}{' id' if is_id(key) else ''}")
        elif is_id(param) or param in ("email",):
            rendered[param] = ("literal", f"{noun(param)} {value}")
        else:
            rendered[param] = ("literal", f"{value}")
        if param in labels:
            kind, said = rendered[param]
            ref = f"the \0 from {where}" if kind == "ref" else said
            rendered[param] = (kind, _labelled(labels[param], kind, value, ref))
    text = _render(specs[s.tool].phrase, rendered)
    if labels:  # optional values side by side: "(set state to closed, friendly name to …)"
        text = re.sub(r"\)\s+\((?:set |with |only those with )", ", ", text)
    return f"{index[s.id] + 1}) {text[0].upper()}{text[1:]}."


def _rules(steps: list[ExecutedStep], specs: dict[str, ToolSpec], rng: random.Random) -> tuple[list[Rule], list[str]]:
    """The constraints and how the last request states them: a state-changing tool the plan never needs is off
    limits, and the call budget is bounded."""
    used = {s.tool for s in steps}
    forbidden = sorted(t for t, sp in specs.items() if sp.mutates and t not in used)
    rules: list[Rule] = [NoExtraWrites()]
    closing = ["Please make no changes other than the ones I asked for."]
    if forbidden:
        tool = rng.choice(forbidden)
        rules.append(ForbiddenTool(tool))
        closing.append(f"Do not {forbidden_action(specs[tool])}.")
    rules.append(MaxCalls(2 * len(steps) + 4))
    return rules, closing


def _requests(steps: list[ExecutedStep], specs: dict[str, ToolSpec], private: _Private, requests_of: dict[str, int],
              sources: list[AnswerSource], closing: list[str]) -> list[str]:
    """The user's requests: each its steps' lines; the last also asks for the answer and states the rules."""
    index = {s.id: i for i, s in enumerate(steps)}
    lines: list[list[str]] = [[] for _ in range(max(requests_of.values()) + 1)]
    for s in steps:
        lines[requests_of[s.id]].append(_phrase(s, steps, specs, private))
    asks = [f"how many results step {index[src.step] + 1} returned" if src.field == "#" else
            f"the {answer_label(src.field)} from step {index[src.step] + 1}" for src in sources]
    requests = []
    for i, chunk in enumerate(lines):
        head = "Hi! I need some help. " if i == 0 else "Thanks. Next: "
        text = head + " ".join(chunk)
        if i == len(lines) - 1:
            text += (f" Then tell me {'; '.join(asks)}. " if asks else " ") + " ".join(closing)
        requests.append(text)
    return requests


def _checks(steps: list[ExecutedStep], expected_diff: dict[str, Any], answers: list[Any], sources: list[AnswerSource],
            rules: list[Rule], code_check: bool) -> list[Check]:
    """The task's verifier spec: every component it asks for, with what each needs."""
    checks: list[Check] = [
        FormatCheck(),
        SchemaCheck(),
        ExecutionCheck(),
        StateDiffCheck(expected_diff),
        # The calls the user asked for, with their concrete arguments: skipping a requested lookup is not
        # following the request, even when the lookup's result was not needed for the outcome.
        RequiredCallsCheck([RequiredCall(s.tool, s.values) for s in steps]),
        AnswerCheck(answers, sources),
        ConstraintsCheck(rules),
    ]
    if code_check:
        source = code_check_source(expected_diff, answers)
        if source:
            checks.append(CodeCheck(source, "check"))
    return checks


def code_check_source(expected_diff: dict[str, Any], answers: list[Any]) -> str | None:
    """A per-task check written as code (the form an LLM-written check takes), for the sandboxed path.

    It checks one updated column of the final state, or else the first expected answer, from the payload
    ``{"state": {table: {key: row}}, "answer": str}``.
    """
    for table, change in sorted(expected_diff.items()):
        for key, cols in sorted(change["updated"].items()):
            for col, (_, new) in sorted(cols.items()):
                if isinstance(new, str) and new.startswith("<new "):
                    continue
                return (
                    "def check(payload):\n"
                    f"    row = payload['state'].get({table!r}, {{}}).get({key!r})\n"
                    f"    ok = row is not None and row.get({col!r}) == {new!r}\n"
                    f"    return {{'passed': ok, 'detail': 'final {table}.{col} of {key}: %r' % (row or {{}}).get({col!r})}}\n"
                )
    return None


def sample_task(
    sampler: PlanSampler,
    rng: random.Random,
    *,
    task_id: str,
    run_id: str,
    batch: int,
    sampler_seed: int,
    code_check_share: float = 0.0,
    attempts: int = SAMPLE_ATTEMPTS,
    failures: Counter | None = None,
) -> tuple[Task | None, int]:
    """Sample plans until one becomes a task; returns the task (None after ``attempts``) and the retries used.

    The depth is drawn once and kept across retries: deep plans fail more often, and redrawing it would skew
    the corpus towards shallow tasks. A depth past the graph's longest chain is drawn as that chain's length:
    no plan could reach it (a server with a few tools has short chains only).

    Args:
        failures: Where each failed attempt's ``(reason code, detail)`` is counted (``FAILURE_REASONS``).
    """
    depth = rng.randint(sampler.config.depth_min, sampler.config.depth_max)
    # a depth the graph cannot reach would only fail (a catalog whose results feed few parameters)
    depth = min(depth, max(sampler.config.depth_min, sampler.reachable_depth))
    for attempt in range(attempts):
        sampled = sampler.sample(rng, depth)
        if sampled is None:
            if failures is not None:
                failures[sampler.failure or ("chain_ended", "")] += 1
            continue
        work, steps, initial = sampled
        task = build_task(
            env=sampler.base, work=work, steps=steps, initial=initial, rng=rng, config=sampler.config,
            task_id=task_id, run_id=run_id, batch=batch, sampler_seed=sampler_seed,
            code_check=rng.random() < code_check_share,
        )
        if task is not None:
            return task, attempt
        if failures is not None:
            failures[("no_answer", " → ".join(s.tool for s in steps))] += 1
    return None, attempts


def sample_tasks(
    env: ToolEnvironment, n: int, *, seed: int = 0, config: SamplingConfig | None = None, run_id: str = "adhoc",
    graph: ToolGraph | None = None, propose: ValueProposer | None = None,
) -> Iterator[tuple[Task, random.Random]]:
    """Up to ``n`` tasks on one environment, each with the rng that made it (for controls drawn after it).

    The quickest way to look at what the generator makes, outside a flow::

        for task, _ in sample_tasks(Environment(get_domain("retail"), 0), 5):
            print(task.goal)
    """
    if graph is None:
        name = env.domain_cls.name
        graph = (domain_graph(name) if name in DOMAINS else
                 ToolGraph.build([s.record for s in env.specs.values()], env.foreign_keys()))
    sampler = PlanSampler(env, graph, config or SamplingConfig(), propose=propose,
                          free_text=env.domain_cls.name not in DOMAINS)
    for i in range(n):
        rng = random.Random(f"{seed}/{i}")
        task, _ = sample_task(sampler, rng, task_id=f"{env.domain_cls.name}-{i}", run_id=run_id, batch=0,
                              sampler_seed=i)
        if task is not None:
            yield task, rng


def task_id_for(run_id: str, batch: int, index: int) -> str:
    return hashlib.sha256(f"{run_id}/{batch}/{index}".encode()).hexdigest()[:16]
