"""BFCL-style accuracy of a policy: a local transformers model or any model behind an OpenAI-compatible
endpoint, on the single-turn categories of ``../shared/benchmarks/bfcl``, and on BFCL v4's four multi-turn
categories (``multi_turn_base``, ...: played turn by turn and scored by BFCL's own checker in the sandbox, see
:mod:`training.bfcl_multiturn`; the pinned bfcl-eval wheel is fetched on first use).

Per category a seeded, deterministic sample of questions is asked once, greedily, with the question's own
functions as tools. The reply's calls are judged by :func:`verifiers.bfcl.match_calls` against BFCL's possible
answer (right functions, arguments among the allowed values, parallel calls in any order); on ``irrelevance``
(no offered function fits) a reply is correct iff it makes no call. A reply with a call that cannot be read is
counted as ``malformed`` and is never correct, whatever the other calls are.

Two agents, one protocol (``label``, ``kind``, ``version``, ``reply``):

* :class:`LocalAgent`: the policy as :class:`training.evaluate.LocalPolicy` runs it at evaluation (the
  policy's chat template with the tools in the system turn, greedy, ``<|im_end|>``, bf16 autocast where
  fast), its turn read back with :func:`training.policy.parse_assistant`.
* :class:`EndpointAgent`: the project's call layer (:class:`generators.llm.LLMClient`, retries and all) with
  the tools passed natively, the reply read with the lenient extractor (native ``tool_calls`` → tags →
  fences → bare JSON). Function names are sent with characters OpenAI refuses (BFCL's dots) replaced by
  ``_``, as BFCL does for function-calling models, and mapped back before matching. An endpoint that keeps
  failing raises (:class:`generators.llm.EndpointUnavailable`, :class:`generators.llm.LLMError`) naming the
  item: an outage is never reported as accuracy 0.

Example:
    >>> result = bfcl_accuracy(LocalAgent.embedded(), per_category=20)
    >>> result["categories"]["simple_python"]["accuracy"], result["overall"]["accuracy"]
    >>> rows = bfcl_rows(result, train_run_id="t-1", train_stage="base")   # the bfcl_evals table
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import Field, field_validator

from generators.strict import StrictModel
from schemas import SCHEMA_VERSION
from storage.external import MULTI_TURN_CATEGORIES, bfcl_file, default_bfcl_root
from training.bfcl_replies import Reply, endpoint_tools, read_reply, wilson
from verifiers.bfcl import CATEGORIES as CALL_CATEGORIES
from verifiers.bfcl import match_calls, read_jsonl

IRRELEVANCE = "irrelevance"
CATEGORIES = (*CALL_CATEGORIES, IRRELEVANCE)
ALL_CATEGORIES = (*CATEGORIES, *MULTI_TURN_CATEGORIES)


def known_categories(categories: Sequence[str]) -> list[str]:
    """``categories``, or a ``ValueError`` naming those that are not BFCL categories."""
    unknown = [c for c in categories if c not in ALL_CATEGORIES]
    if unknown:
        raise ValueError(f"BFCL categories {unknown} are not among {', '.join(ALL_CATEGORIES)}")
    return list(categories)


class BfclSettings(StrictModel):
    """Which BFCL questions a policy is asked, and how long it may answer: declared once, here, for ``synthloop
    bfcl`` (its options are generated from this model) and for the train flow's ``bfcl`` (each evaluated policy
    is asked the same questions, so the stages compare)."""

    categories: list[str] = Field(default_factory=lambda: list(CATEGORIES), min_length=1,
                                  description=f"BFCL categories asked: the single-turn ones, and BFCL v4 multi-turn: "
                                              f"{', '.join(MULTI_TURN_CATEGORIES)} (played in BFCL's classes and "
                                              f"scored by BFCL's checker, in the sandbox).")
    per_category: int = Field(20, ge=0, le=2000, description="Questions (multi-turn: entries) per category, a seeded "
                                                             "sample (0 = all).")
    seed: int = Field(0, description="Seeds the sample: the same seed asks every policy the same questions.")
    max_new_tokens: int | None = Field(None, ge=16, le=2048, description="Longest reply (default: 256 for a local "
                                                                         "policy, 512 for an endpoint).")

    @field_validator("categories")
    @classmethod
    def _known(cls, categories: list[str]) -> list[str]:
        return known_categories(categories)


DEFAULTS = BfclSettings()


@dataclass
class Question:
    """One BFCL item as an agent sees it: the conversation so far and the functions on offer."""

    id: str
    category: str
    messages: list[dict[str, Any]]
    functions: list[dict[str, Any]]  # BFCL's own function docs (its type names), as the matcher reads them
    tools: list[dict[str, Any]]  # the same functions as OpenAI tools with JSON-schema parameters
    ground_truth: list[dict[str, Any]] | None  # None on irrelevance: no call is correct


class Agent(Protocol):
    label: str  # who answers, as a person names it ("base", "sft", the endpoint's model)
    kind: str  # "local" or "endpoint"
    version: str  # a local policy's weights digest, an endpoint's model name

    def reply(self, questions: Sequence[Question]) -> list[Reply]: ...


# --- the agents --------------------------------------------------------------------------------------------------


@dataclass
class LocalAgent:
    """A transformers causal LM with its tokenizer (the policy's chat template), run as at evaluation."""

    model: Any
    tokenizer: Any
    label: str = "policy"
    version: str = ""  # the weights digest; computed from the model when left empty
    max_new_tokens: int = 256
    kind: str = "local"

    def __post_init__(self) -> None:
        if not self.version:
            from training.policy import weights_digest

            self.version = weights_digest(self.model)

    @classmethod
    def embedded(cls, **kwargs: Any) -> LocalAgent:
        """The embedded base policy (SmolLM2-135M-Instruct, converted once into the cache)."""
        return cls.from_path(None, **kwargs)

    @classmethod
    def from_path(cls, path: str | Path | None, **kwargs: Any) -> LocalAgent:
        """A policy this project trained (a folder with ``synthloop_policy.json``: its weights are checked
        against the manifest), any other transformers folder, or ``None`` for the embedded base policy."""
        from transformers import AutoModelForCausalLM

        from training.policy import load_policy, load_tokenizer, policy_path

        if path is not None and (Path(path) / "synthloop_policy.json").exists():
            model, tokenizer, manifest = load_policy(path)  # StaleWeights if not the weights training ended at
            kwargs.setdefault("label", manifest.get("stage") or Path(path).name)
            kwargs.setdefault("version", manifest["weights_digest"])
        else:
            folder = str(path) if path is not None else str(policy_path())
            model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), load_tokenizer(folder)
            model.eval()
            kwargs.setdefault("label", "base" if path is None else Path(folder).name)
        agent = cls(model, tokenizer, **kwargs)  # the digest is taken before the move, on CPU
        if _cuda():
            agent.model = model.to("cuda")
        return agent

    def reply(self, questions: Sequence[Question]) -> list[Reply]:
        from training.evaluate import LocalPolicy

        out = []
        for q in questions:
            policy = LocalPolicy(self.model, self.tokenizer, q.tools, label=self.label,
                                 max_new_tokens=self.max_new_tokens, temperature=0.0)
            message = policy.act(q.messages)
            malformed = policy.signals.get("malformed_calls", 0)
            calls = [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
                     for c in message.get("tool_calls") or []]  # parse_assistant wrote canonical JSON
            out.append(Reply(calls=calls,
                             malformed=[f"malformed tool call ({malformed})"] if malformed else [],
                             content=message.get("content") or ""))
        return out


@dataclass
class EndpointAgent:
    """A model behind an OpenAI-compatible endpoint (vLLM, OpenAI, llama.cpp, ...), through the call layer."""

    base_url: str
    model: str
    label: str = ""  # defaults to the model name
    max_tokens: int = 512
    max_concurrency: int = 4
    timeout_s: float = 180.0
    max_retries: int = 8
    backoff_s: float = 0.5
    api_key_env: str = "OPENAI_API_KEY"
    kind: str = "endpoint"
    usage: dict[str, float] = field(default_factory=dict)  # requests, retries by cause, tokens: summed over calls

    def __post_init__(self) -> None:
        self.label = self.label or self.model

    @property
    def version(self) -> str:
        return self.model

    def reply(self, questions: Sequence[Question]) -> list[Reply]:
        from generators.llm import EndpointConfig, EndpointUnavailable, LLMClient, LLMError, Sampling, check_reachable

        check_reachable("bfcl", self.base_url)  # nothing answering fails in seconds, not after every retry
        config = EndpointConfig(base_url=self.base_url, model=self.model, api_key_env=self.api_key_env,
                                structured_output="none", max_concurrency=self.max_concurrency,
                                timeout_s=self.timeout_s, max_retries=self.max_retries, backoff_s=self.backoff_s)
        sampling = Sampling(temperature=0.0, top_p=1.0, max_tokens=self.max_tokens)

        async def ask(client: LLMClient, q: Question) -> Reply:
            tools, names = endpoint_tools(q.tools)
            try:
                done = await client.chat(q.messages, phase="bfcl", role="assistant", sample=q.id,
                                         sampling=sampling, tools=tools)
            except (EndpointUnavailable, LLMError) as exc:
                raise type(exc)(f"BFCL {q.category} item {q.id}: {exc}") from exc
            return read_reply({"role": "assistant", "content": done.content, "tool_calls": done.tool_calls},
                               names)

        async def ask_all() -> list[Reply]:
            client = LLMClient("bfcl", config, self.base_url)  # no cache: an evaluation asks the model now
            try:
                return list(await asyncio.gather(*(ask(client, q) for q in questions)))
            finally:
                await client.aclose()
                for key, value in client.usage.totals().items():
                    self.usage[key] = self.usage.get(key, 0) + value

        return asyncio.run(ask_all())


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# --- the data ----------------------------------------------------------------------------------------------------


def load_questions(root: str | Path, category: str, per_category: int | None = None,
                   seed: int = 0) -> list[Question]:
    """A seeded sample of ``per_category`` questions of one category (all with ``None`` or 0), in file order."""
    from generators.catalog import bfcl_tools

    if category not in CATEGORIES:
        raise ValueError(f"BFCL category {category!r} is not one of {', '.join(CATEGORIES)}")
    path = bfcl_file(root, category)
    records = read_jsonl(path)
    answers = {} if category == IRRELEVANCE else {
        a["id"]: a["ground_truth"] for a in read_jsonl(bfcl_file(root, category, answers=True))}
    if per_category and per_category < len(records):
        picked = sorted(random.Random(f"bfcl:{seed}:{category}").sample(range(len(records)), per_category))
        records = [records[i] for i in picked]
    questions = []
    for r in records:
        if len(r["question"]) != 1:
            raise ValueError(f"{path.name}: question {r['id']} has {len(r['question'])} turns; only single-turn "
                             "categories are evaluated here")
        if category != IRRELEVANCE and r["id"] not in answers:
            raise ValueError(f"{path.name}: question {r['id']} has no possible answer in possible_answer/")
        # BFCL's type names ("dict", "float", "tuple", "any") become JSON Schema, as the catalog import does
        tools = [t.openai() for t in bfcl_tools([r], path.name, f"bfcl:{category}")]
        questions.append(Question(id=r["id"], category=category, messages=list(r["question"][0]),
                                  functions=r["function"], tools=tools, ground_truth=answers.get(r["id"])))
    return questions


def judge(question: Question, reply: Reply) -> tuple[bool, str]:
    """Whether a reply is correct, and if not why."""
    if reply.malformed:
        return False, "malformed call: " + "; ".join(reply.malformed)
    if question.ground_truth is None:
        return (not reply.calls), ("" if not reply.calls else f"called {reply.calls[0].get('name', '?')!r} "
                                   "although no offered function fits")
    result = match_calls(reply.calls, question.ground_truth, question.functions)
    return result.ok, result.reason


# --- the measurement ---------------------------------------------------------------------------------------------

def bfcl_accuracy(agent: Agent, root: str | Path | None = None, categories: Sequence[str] = DEFAULTS.categories,
                  per_category: int | None = DEFAULTS.per_category, seed: int = DEFAULTS.seed,
                  log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """BFCL accuracy of ``agent`` per category.

    Args:
        agent: A :class:`LocalAgent` or :class:`EndpointAgent` (anything with ``label``, ``kind``, ``version``
            and ``reply``).
        root: The BFCL folder (default ``../shared/benchmarks/bfcl``).
        categories: Which of :data:`ALL_CATEGORIES` (single-turn and multi-turn alike).
        per_category: Questions (entries) per category, a seeded sample; ``None`` or 0 = all.
        seed: Seeds the sample (the same seed asks the same questions of every agent).
        log: Called with one line per finished category.

    Returns:
        ``agent`` (label, kind, version), ``bfcl`` (the files' version, e.g. ``"BFCL_v4"``), ``seed``,
        ``per_category``, ``eval_key`` (a digest of the agent's version and the questions asked),
        ``categories`` (per category: ``items``, ``correct``, ``accuracy``, ``ci95`` = its 95% Wilson interval,
        ``malformed`` = replies (entries) with an unreadable call, ``seconds_per_item``; multi-turn ones also
        ``errors``, BFCL's error types counted), ``overall`` (``items``, ``correct``, ``malformed`` summed;
        ``accuracy`` = the mean of the categories' accuracies, as BFCL averages), ``per_item`` (id,
        category, correct, reason, calls, malformed), ``usage`` (an endpoint's requests, retries, tokens),
        ``seconds``.

    Raises:
        generators.llm.EndpointUnreachable, EndpointUnavailable, LLMError: The endpoint does not answer,
            keeps failing, or refuses the request; the message names the item.
    """
    root = Path(root) if root is not None else default_bfcl_root()
    per_category = per_category or None  # 0 and None both mean every question
    known_categories(categories)
    start = time.perf_counter()
    per_category_out: dict[str, dict[str, Any]] = {}
    per_item: list[dict[str, Any]] = []
    asked: list[str] = []
    multi = [c for c in categories if c in MULTI_TURN_CATEGORIES]
    if multi:
        from training.bfcl_multiturn import multi_turn_accuracy

        played = multi_turn_accuracy(agent, multi, per_category=per_category, seed=seed, log=log)
        for category, c in played.items():
            items = c.pop("per_item")
            per_item += items
            asked += [i["id"] for i in items]
            per_category_out[category] = c
    for category in (c for c in categories if c not in MULTI_TURN_CATEGORIES):
        questions = load_questions(root, category, per_category, seed)
        t0 = time.perf_counter()
        replies = agent.reply(questions)
        seconds = time.perf_counter() - t0
        correct = malformed = 0
        for q, r in zip(questions, replies, strict=True):
            ok, reason = judge(q, r)
            correct += ok
            malformed += bool(r.malformed)
            asked.append(q.id)
            per_item.append({"id": q.id, "category": category, "correct": ok, "reason": reason,
                             "calls": r.calls, "malformed": r.malformed})
        n = len(questions)
        low, high = wilson(correct, n)
        per_category_out[category] = {"items": n, "correct": correct, "accuracy": round(correct / n, 4) if n else 0.0,
                                      "ci95": [round(low, 4), round(high, 4)],
                                      "malformed": malformed, "seconds_per_item": round(seconds / max(n, 1), 3)}
        if log:
            c = per_category_out[category]
            log(f"bfcl {category}: {c['correct']}/{n} correct, {malformed} malformed, "
                f"{c['seconds_per_item']} s/item")
    per_category_out = {c: per_category_out[c] for c in categories}  # in the order asked
    accuracies = [c["accuracy"] for c in per_category_out.values()]
    # the multi-turn files are the wheel's BFCL_v4_multi_turn_*.json
    version = re.match(r"(BFCL_v\d+)_", bfcl_file(root, categories[0]).name if categories[0] in CATEGORIES
                       else f"BFCL_v4_{categories[0]}.json") if categories else None
    key = hashlib.sha256(json.dumps([agent.kind, agent.version, asked]).encode()).hexdigest()[:16]
    return {
        "agent": {"label": agent.label, "kind": agent.kind, "version": agent.version},
        "bfcl": version.group(1) if version else "",
        "seed": seed,
        "per_category": per_category,
        "eval_key": key,
        "categories": per_category_out,
        "overall": {"items": sum(c["items"] for c in per_category_out.values()),
                    "correct": sum(c["correct"] for c in per_category_out.values()),
                    "accuracy": round(sum(accuracies) / len(accuracies), 4) if accuracies else 0.0,
                    "malformed": sum(c["malformed"] for c in per_category_out.values())},
        "per_item": per_item,
        "usage": dict(getattr(agent, "usage", {}) or {}),
        "seconds": round(time.perf_counter() - start, 2),
    }


def bfcl_rows(result: dict[str, Any], *, train_run_id: str | None = None, train_stage: str | None = None,
              eval_id: str | None = None, measured_at: float | None = None) -> list[dict[str, Any]]:
    """Rows of the ``bfcl_evals`` table, one per category, from a :func:`bfcl_accuracy` result.

    Args:
        result: What :func:`bfcl_accuracy` returned.
        train_run_id: The train run the evaluation belongs to (``None`` for a standalone one).
        train_stage: Which policy of that run (``base``, ``sft``, ``grpo``).
        eval_id: Defaults to ``bfcl-<eval_key>``: the same agent asked the same questions gets the same id.
        measured_at: Unix time; defaults to now.
    """
    agent = result["agent"]
    eval_id = eval_id or f"bfcl-{result['eval_key']}"
    measured_at = time.time() if measured_at is None else measured_at
    return [{"eval_id": eval_id, "train_run_id": train_run_id, "train_stage": train_stage,
             "policy": agent["label"], "policy_kind": agent["kind"], "policy_version": agent["version"],
             "benchmark": result["bfcl"], "category": category, "seed": result["seed"],
             "per_category": result["per_category"], **{k: c[k] for k in (
                 "items", "correct", "accuracy", "malformed", "seconds_per_item")},
             "measured_at": measured_at, "schema_version": SCHEMA_VERSION}
            for category, c in result["categories"].items()]


def format_table(result: dict[str, Any]) -> str:
    """The per-category table a person reads."""
    agent = result["agent"]
    lines = [f"BFCL accuracy of {agent['label']} ({agent['kind']}, {agent['version']}), {result['bfcl']}, "
             f"{result['per_category'] or 'every question'} per category, seed {result['seed']}",
             f"{'category':<24}{'items':>7}{'correct':>9}{'accuracy':>10}{'95% CI':>14}{'malformed':>11}{'s/item':>9}"]
    for category, c in result["categories"].items():
        low, high = c.get("ci95") or wilson(c["correct"], c["items"])
        lines.append(f"{category:<24}{c['items']:>7}{c['correct']:>9}{c['accuracy']:>10.3f}"
                     f"{f'{low:.2f}-{high:.2f}':>14}{c['malformed']:>11}{c['seconds_per_item']:>9.2f}")
    o = result["overall"]
    lines.append(f"{'overall (mean)':<24}{o['items']:>7}{o['correct']:>9}{o['accuracy']:>10.3f}{'':>14}"
                 f"{o['malformed']:>11}{'':>9}")
    lines.append(f"wall time {result['seconds']:.1f} s")
    return "\n".join(lines)
