"""Fresh tasks over BFCL's 8 multi-turn classes, and their overlap with BFCL's own entries.

``--objects bfcl`` (an ``objects`` environment whose ref is ``bfcl``) is :func:`bfcl_synthesis_source`: BFCL's
classes from the pinned bfcl-eval folder, all 8 in every environment, each loaded with a state of BFCL's
``initial_config`` shape drawn from the seed by ``envs/bfcl_states.py`` (its own vocabulary, never an entry's
config), their tools described by BFCL's function docs. It runs in the object worker's sandbox like any object
source, and the normal pipeline samples, verifies and phrases tasks on it. A result that is only ``{"error": ...}``
(how these classes refuse a call) counts as the call's error, so the execute-first sampler keeps only calls that
did what they were asked.

Decontamination (:class:`MultiTurnOverlap`): a task overlaps a BFCL multi-turn entry when its requests share a word
n-gram with the entry's user turns (``storage.dedup.Contamination``), when one request is nearly one of its turns
(rapidfuzz), or when most of its calls that take arguments are calls of the entry's ground truth, name and
arguments equal. Curation uses it for tasks of a
``bfcl`` source (``DedupConfig.multi_turn``); ``benchmarks/bfcl_synth.py`` reports it by category and threshold.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rapidfuzz import fuzz, process

import envs.bfcl_states as bfcl_states
from envs.objects import ObjectSource, bfcl_schema
from envs.plugin import PluginLocation
from generators.bfcl_import import BFCLCallError, bfcl_docs, parse_call, turn_text
from storage.dedup import Contamination, words
from storage.external import MULTI_TURN_CATEGORIES, bfcl_eval_root, bfcl_multi_turn

BFCL_REF = "bfcl"
"""The ``ref`` of the built-in object source over BFCL's classes (``--objects bfcl``)."""


def bfcl_synthesis_source(*, name: str = "bfcl", root: Path | None = None) -> ObjectSource:
    """The object source of fresh BFCL states: seed → the 8 classes loaded with ``bfcl_states.initial_configs(seed)``.

    Raises:
        storage.external.BFCLDataError: the pinned bfcl-eval wheel cannot be fetched.
    """
    root = Path(root or bfcl_eval_root())
    module = Path(bfcl_states.__file__).resolve()
    location = PluginLocation(ref=f"objects:{BFCL_REF}", module=module.stem, qualname="make_instances",
                              root=str(module.parent), top=str(module))
    docs = {}
    for name, doc in bfcl_docs(root).items():
        # BFCL opens every description with its class's blurb; a request is phrased from the first sentence
        text = re.sub(r"^This tool belongs to .*?\. Tool description: ", "", doc["description"], flags=re.S)
        docs[name] = {"description": text, "parameters": with_enums(doc["parameters"]),
                      "returns": bfcl_schema(doc["response"]) if isinstance(doc["response"], dict) else None}
    config = {"kind": "factory", "factory": f"{module.stem}:make_instances", "docs": docs,
              "values": bfcl_states.VALUES, "aliases": bfcl_states.ALIASES, "error_results": True}
    return ObjectSource(location, config, name=name,
                        description="BFCL v4's multi-turn APIs with fresh states: a file system, a trading bot, travel "
                                    "booking, vehicle control, messaging, posting, tickets and math",
                        read_only=(str(module), os.path.realpath(root)), paths=(str(module.parent), str(root)))


def with_enums(schema: dict[str, Any]) -> dict[str, Any]:
    """BFCL states a closed list in a property's description (``[Enum]: ["on", "off", "auto"]``); as ``enum`` the
    sampler draws from it and the schema check holds an agent to it."""
    props = {}
    for name, prop in (schema.get("properties") or {}).items():
        m = re.search(r"\[Enum\]:\s*(\[[^\]]*\])", str(prop.get("description", "")))
        values = None
        if m:
            try:
                values = json.loads(m.group(1))
            except ValueError:
                values = None
        if isinstance(values, list) and values and all(isinstance(v, str) for v in values) and \
                prop.get("type", "string") == "string":
            prop = {**prop, "enum": values}
        props[name] = prop
    return {**schema, "properties": props}


def tool_classes(root: Path | None = None) -> dict[str, str]:
    """``{tool: BFCL class}`` for every multi-turn function."""
    return {n: d["class"] for n, d in bfcl_docs(root).items()}


# --- overlap with BFCL's multi-turn entries ------------------------------------------------------------------------

def call_key(name: str, args: dict[str, Any]) -> str:
    """A call as comparable text: 5 and 5.0 are one number, argument order does not matter."""
    def norm(v: Any) -> Any:
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return v
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, (list, tuple)):
            return [norm(x) for x in v]
        if isinstance(v, dict):
            return {str(k): norm(x) for k, x in v.items()}
        return str(v)
    return f"{name}:{json.dumps(norm(args), sort_keys=True)}"


def task_calls(task: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The calls a stored task asks for, with concrete arguments (its ``required_calls`` check), else its plan's."""
    verifier = task.get("verifier")
    spec = json.loads(verifier) if isinstance(verifier, str) else verifier or {}
    for check in spec.get("checks", []) if isinstance(spec, dict) else []:
        if check.get("name") == "required_calls" or check.get("kind") == "required_calls":
            calls = check.get("calls") or []
            return [(c["tool"], c.get("args") or {}) for c in calls if isinstance(c, dict) and "tool" in c]
    return [(s["tool"], s.get("args") or {}) for s in task.get("reference_plan") or []]


@dataclass
class Overlap:
    """What one task shares with BFCL: the entries whose text it overlaps, and the best call overlap."""

    text: list[str]  # entry ids sharing a word n-gram with the task's requests
    calls: list[str]  # entry ids whose ground truth holds at least ``threshold`` of the task's argument calls
    best_call_share: float  # the largest share of the task's argument calls found in one entry
    best_entry: str | None
    fuzzy: list[str] = field(default_factory=list)  # entry ids with a user turn this similar to one request
    best_ratio: float = 0.0  # the highest similarity (rapidfuzz ratio, 0-100) of a request to any user turn

    @property
    def items(self) -> list[str]:
        return sorted(set(self.text) | set(self.calls) | set(self.fuzzy))


class MultiTurnOverlap:
    """BFCL's multi-turn entries (every category given) indexed by user text (word n-grams) and by calls.

    Args:
        entries: ``{category: entries}`` as ``storage.external.bfcl_multi_turn`` returns them.
        n: Word n-gram length of the text match.
        threshold: Share of a task's calls that take arguments which must be calls of one entry's ground truth.
        min_shared: At least this many such calls must be shared (fewer if the task has fewer).
        ratio: A request at least this similar (rapidfuzz ``ratio`` of the word-normalised texts, 0-100) to one
            user turn overlaps that turn's entry: a reworded copy shares no 8-gram but most of its characters.
    """

    def __init__(self, entries: dict[str, list[dict[str, Any]]], *, n: int = 8, threshold: float = 0.5,
                 min_shared: int = 2, ratio: float = 90.0, order: dict[str, list[str]] | None = None):
        self.threshold, self.min_shared, self.ratio = threshold, min_shared, ratio
        self.turns: list[str] = []
        self.turn_entry: list[str] = []
        for es in entries.values():
            for e in es:
                for t in e["question"]:
                    text = " ".join(words(turn_text(t)))
                    if text:
                        self.turns.append(text)
                        self.turn_entry.append(e["id"])
        self.category = {e["id"]: c for c, es in entries.items() for e in es}
        self.text = Contamination(((e["id"], " ".join(turn_text(t) for t in e["question"]))
                                   for es in entries.values() for e in es), n=n)
        order = order or {}
        self.calls: dict[str, set[str]] = {}
        self.by_call: dict[str, set[str]] = {}
        for es in entries.values():
            for e in es:
                keys = set()
                for turn in e.get("ground_truth") or []:
                    for text in turn:
                        try:
                            name, args = parse_call(text, order)
                        except BFCLCallError:
                            continue
                        if args:
                            keys.add(call_key(name, args))
                self.calls[e["id"]] = keys
                for k in keys:
                    self.by_call.setdefault(k, set()).add(e["id"])

    @classmethod
    def load(cls, categories: Iterable[str] = MULTI_TURN_CATEGORIES, root: Path | None = None,
             **kwargs: Any) -> MultiTurnOverlap:
        """The index of the named categories (default all four), read from the pinned bfcl-eval folder."""
        root = root or bfcl_eval_root()
        # a positional argument takes the parameter named at its place in the function doc (their order is the
        # signature's); only the overlap is computed from it, nothing is run
        order = {n: list(d["parameters"].get("properties", {})) for n, d in bfcl_docs(root).items()}
        return cls({c: bfcl_multi_turn(c, root) for c in categories}, order=order, **kwargs)

    def __len__(self) -> int:
        return len(self.category)

    def match(self, requests: list[str], calls: list[tuple[str, dict[str, Any]]]) -> Overlap:
        text = self.text.match(" ".join(requests))
        fuzzy, best_ratio = set(), 0.0
        for request in requests:
            query = " ".join(words(request))
            if not query:
                continue
            for _, score, i in process.extract(query, self.turns, scorer=fuzz.ratio, score_cutoff=min(self.ratio, 50),
                                               limit=20):
                best_ratio = max(best_ratio, score)
                if score >= self.ratio:
                    fuzzy.add(self.turn_entry[i])
        keys = {call_key(n, a) for n, a in calls if a}
        shared: dict[str, int] = {}
        for k in keys:
            for entry in self.by_call.get(k, ()):
                shared[entry] = shared.get(entry, 0) + 1
        need = min(self.min_shared, len(keys))
        hits = sorted(e for e, s in shared.items() if keys and s >= need and s / len(keys) >= self.threshold)
        best = max(shared, key=lambda e: (shared[e], e), default=None)
        return Overlap(text=text, calls=hits, best_call_share=shared[best] / len(keys) if best else 0.0,
                       best_entry=best, fuzzy=sorted(fuzzy), best_ratio=round(best_ratio, 1))

    def report(self, overlaps: list[Overlap], thresholds: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0),
               ratios: tuple[float, ...] = (50, 70, 80, 90)) -> dict[str, Any]:
        """How many tasks matched, by kind (text, calls, fuzzy) and by BFCL category, and how many reach each
        call-share and similarity threshold."""
        by_category: dict[str, dict[str, int]] = {c: {"text": 0, "calls": 0, "fuzzy": 0, "either": 0}
                                                  for c in MULTI_TURN_CATEGORIES if c in self.category.values()}
        for o in overlaps:
            for kind, ids in (("text", o.text), ("calls", o.calls), ("fuzzy", o.fuzzy), ("either", o.items)):
                for c in {self.category[i] for i in ids}:
                    by_category[c][kind] += 1
        return {"tasks": len(overlaps), "entries": len(self), "ngram": self.text.n, "call_threshold": self.threshold,
                "text_matched": sum(bool(o.text) for o in overlaps),
                "calls_matched": sum(bool(o.calls) for o in overlaps), "ratio_threshold": self.ratio,
                "fuzzy_matched": sum(bool(o.fuzzy) for o in overlaps),
                "matched": sum(bool(o.items) for o in overlaps), "by_category": by_category,
                "best_call_share_at_least": {str(t): sum(o.best_call_share >= t for o in overlaps) for t in thresholds},
                "best_ratio_at_least": {str(r): sum(o.best_ratio >= r for o in overlaps) for r in ratios}}
