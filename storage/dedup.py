"""Duplicate detection and benchmark decontamination over task text.

Synthetic tasks share templates ("Please make no changes other than the ones I asked for"), so comparing raw
text would call two different tasks near-duplicates because of their scaffolding. Words that occur in a large
share of the corpus (the templates) are stripped before near-duplicate detection; what is left (values,
entities, the verbs that differ) is shingled and compared with MinHash-LSH (``datasketch``). Exact duplicates
are found by hashing the normalised full text. Near duplicates must also share their values (ids, numbers,
emails): the same template filled with another order id is a different task.

Decontamination is n-gram overlap with benchmark test items (e.g. the BFCL questions in ``../shared``): a text
is contaminated if it shares any word n-gram with an item, or contains the whole item when the item is
shorter than n words.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from datasketch import MinHash, MinHashLSH

_WORD = re.compile(r"[a-z0-9]+(?:[.\-@][a-z0-9]+)*")
_VALUE = re.compile(r"[0-9@]")  # ids, amounts, emails: what tells two instances of one template apart


def words(text: str) -> list[str]:
    """Lowercased word tokens; ids, decimals and emails stay whole (``p0008``, ``30.0``, ``ana@example.com``)."""
    return _WORD.findall(text.lower())


def content_hash(text: str) -> str:
    """Hash of the normalised text: case, punctuation and spacing do not matter."""
    return hashlib.sha256(" ".join(words(text)).encode()).hexdigest()[:16]


def template_words(texts: Iterable[str], share: float = 0.2, min_docs: int = 20) -> frozenset[str]:
    """Words that occur in at least ``share`` of the texts: the scaffolding of the templates. With fewer than
    ``min_docs`` texts no word is treated as template (too little evidence)."""
    docs = [set(words(t)) for t in texts]
    if len(docs) < min_docs:
        return frozenset()
    df = Counter(w for d in docs for w in d)
    return frozenset(w for w, n in df.items() if n >= share * len(docs))


def _shingles(tokens: list[str], k: int) -> set[str]:
    if len(tokens) < k:
        return {" ".join(tokens)} if tokens else set()
    return {" ".join(tokens[i:i + k]) for i in range(len(tokens) - k + 1)}


@dataclass
class Duplicate:
    key: str
    content_hash: str
    exact_of: str | None  # the first key with the same normalised text
    near_of: str | None  # the first earlier key whose stripped content is near-identical
    cluster: str  # the first key of the group this one belongs to (itself if unique)


def _values(tokens: list[str]) -> Counter:
    return Counter(t for t in tokens if _VALUE.search(t))


def _multiset_jaccard(a: Counter, b: Counter) -> float:
    union = sum((a | b).values())
    return sum((a & b).values()) / union if union else 1.0


def find_duplicates(items: list[tuple[str, str]], *, threshold: float = 0.7, value_threshold: float = 1.0,
                    num_perm: int = 128, shingle: int = 2, template_share: float = 0.2, seed: int = 1) -> list[Duplicate]:
    """Exact and near-duplicate detection over ``(key, text)`` items, in their order (the first one wins).

    Two items are near duplicates when the Jaccard similarity of their shingle sets, template words
    stripped, reaches ``threshold`` *and* their values (ids, numbers, emails) mostly coincide: a template
    instantiated with another order id is a distinct task, a reworded request with the same values is not.

    Args:
        items: Keys (task ids) and their text (e.g. the task's requests and private values joined).
        threshold: Jaccard similarity of the stripped shingle sets at or above which two items are near
            duplicates (LSH proposes candidates at a looser threshold; the exact Jaccard decides).
        value_threshold: Multiset Jaccard similarity of the value tokens required as well (1.0: the same
            values, reworded).
        num_perm: MinHash permutations (accuracy vs. time).
        shingle: Words per shingle.
        template_share: A word in at least this share of the items is template and stripped.
        seed: MinHash seed; the same seed gives the same clusters.
    """
    template = template_words([t for _, t in items], share=template_share)
    lsh = MinHashLSH(threshold=max(0.1, threshold - 0.15), num_perm=num_perm)
    values: dict[str, Counter] = {}
    first_exact: dict[str, str] = {}
    cluster_of: dict[str, str] = {}
    order: dict[str, int] = {}
    sets: dict[str, set[str]] = {}
    out = []
    for key, text in items:
        digest = content_hash(text)
        exact = first_exact.get(digest)
        near = None
        if exact is None:
            first_exact[digest] = key
            tokens = words(text)
            kept = _shingles([w for w in tokens if w not in template], shingle)
            values[key] = _values(tokens)
            minhash = MinHash(num_perm=num_perm, seed=seed)
            for s in sorted(kept):
                minhash.update(s.encode())
            # LSH only proposes candidates (some below the threshold); the exact Jaccard of the stripped
            # shingle sets decides, so two tasks sharing a long constraint sentence are not merged
            candidates = [k for k in lsh.query(minhash) if _jaccard(kept, sets[k]) >= threshold
                          and _multiset_jaccard(values[key], values[k]) >= value_threshold] if kept else []
            near = min(candidates, key=lambda k: order[k]) if candidates else None
            lsh.insert(key, minhash)
            sets[key] = kept
        order.setdefault(key, len(order))
        head = exact or near
        cluster_of[key] = cluster_of[head] if head else key
        out.append(Duplicate(key, digest, exact, near, cluster_of[key]))
    return out


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def ngrams(tokens: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


class Contamination:
    """Benchmark items indexed by word n-gram; ``match`` names the items a text overlaps."""

    def __init__(self, items: Iterable[tuple[str, str]], n: int = 8):
        self.n = n
        self.index: dict[tuple[str, ...], set[str]] = {}
        self.short: dict[str, tuple[str, ...]] = {}
        for item_id, text in items:
            tokens = words(text)
            if len(tokens) < n:
                self.short[item_id] = tuple(tokens)
            for gram in ngrams(tokens, n):
                self.index.setdefault(gram, set()).add(item_id)

    def __len__(self) -> int:
        return len({i for ids in self.index.values() for i in ids} | set(self.short))

    def match(self, text: str) -> list[str]:
        tokens = words(text)
        hits = {i for gram in ngrams(tokens, self.n) for i in self.index.get(gram, ())}
        if self.short:
            joined = " " + " ".join(tokens) + " "
            hits |= {i for i, t in self.short.items() if t and f" {' '.join(t)} " in joined}
        return sorted(hits)


def bfcl_questions(root) -> list[tuple[str, str]]:
    """``(id, user text)`` of every BFCL test item under ``root`` (all user turns of all categories)."""
    import json
    from pathlib import Path

    out = []
    for path in sorted(Path(root).glob("BFCL_*.json")):
        with open(path) as fh:
            for line in fh:
                if not line.strip():
                    continue
                item = json.loads(line)
                turns = [m.get("content") or "" for turn in item.get("question", []) for m in turn
                         if isinstance(m, dict) and m.get("role") == "user"]
                out.append((item["id"], " ".join(turns)))
    return out
