"""Duplicate detection and decontamination on real synthesized tasks with planted duplicates and BFCL items."""

from __future__ import annotations

import random

import pytest

from generators.config import SynthesizeConfig
from stages.synthesize import run_batch
from storage.dedup import Contamination, bfcl_questions, content_hash, find_duplicates, template_words, words
from storage.external import default_bfcl_root
from tests.helpers import SCRIPTED


@pytest.fixture(scope="module")
def texts() -> list[tuple[str, str]]:
    """Distinct templated tasks: the requests of one real batch, one per distinct normalised text."""
    rows = run_batch(SynthesizeConfig(n_tasks=160, batch_size=160, agents=SCRIPTED), 0).tables["tasks"]
    seen, out = set(), []
    for row in rows:
        text = " ".join(row["requests"])
        if content_hash(text) not in seen:
            seen.add(content_hash(text))
            out.append((row["task_id"], text))
    assert len(out) > 120
    return out


def _exact_variant(text: str, rng: random.Random) -> str:
    return rng.choice([text.upper(), "  " + text.replace(" ", "   ") + " ", text.rstrip(".") + "!"])


def _near_variant(text: str, rng: random.Random) -> str:
    """An edit that keeps the task: a filler word added, or one template word dropped."""
    tokens = text.split(" ")
    if rng.random() < 0.5:
        tokens.insert(rng.randrange(len(tokens) + 1), rng.choice(["please", "kindly", "now"]))
    else:
        template = [i for i, t in enumerate(tokens) if t.lower() in ("the", "me", "and", "of", "to", "my", "a")]
        if template:
            del tokens[rng.choice(template)]
        else:
            tokens.append("thanks")
    return " ".join(tokens)


def test_template_words_are_the_scaffolding_not_the_values(texts):
    template = template_words([t for _, t in texts])
    assert {"the", "please"} & template
    ids = {w for _, t in texts for w in words(t) if w[0] in "cpoa" and any(ch.isdigit() for ch in w)}
    assert ids and not ids & template  # customer/product/order/account ids are what tells tasks apart


def test_planted_duplicates_are_found_and_distinct_templated_tasks_kept(texts):
    rng = random.Random(0)
    originals = texts[:120]
    planted = {}
    items = list(originals)
    for i, (key, text) in enumerate(rng.sample(originals, 40)):
        kind = "exact" if i % 2 == 0 else "near"
        variant = _exact_variant(text, rng) if kind == "exact" else _near_variant(text, rng)
        items.append((f"{kind}-{i}", variant))
        planted[f"{kind}-{i}"] = key
    rng.shuffle(items[120:])  # duplicates arrive after their originals, in any order
    found = {d.key: d for d in find_duplicates(items)}
    flagged = {k for k, d in found.items() if d.exact_of or d.near_of}
    true_positive = {k for k in flagged & set(planted) if found[k].cluster == found[planted[k]].cluster}
    precision = len(true_positive) / len(flagged)
    recall = len(true_positive) / len(planted)
    exact_recall = sum(1 for k in true_positive if k.startswith("exact")) / 20
    print(f"dedup: precision {precision:.3f}, recall {recall:.3f} (exact {exact_recall:.2f}); "
          f"{len(flagged - set(planted))} of {len(originals)} distinct tasks flagged")
    assert exact_recall == 1.0 and all(found[k].exact_of for k in planted if k.startswith("exact"))
    assert recall >= 0.9 and precision >= 0.95
    assert len(flagged - set(planted)) <= 2  # templated but distinct tasks are kept


def test_planted_bfcl_questions_are_all_found_and_tasks_are_clean(texts):
    questions = bfcl_questions(default_bfcl_root())
    assert len(questions) > 1000
    index = Contamination(questions)
    rng = random.Random(1)
    planted = rng.sample(questions, 50)
    framed = [f"Hi! I need some help. {q} Thanks." for _, q in planted]
    assert all(qid in index.match(text) for (qid, _), text in zip(planted, framed))
    assert not [k for k, t in texts if index.match(t)]  # our synthetic tasks overlap no benchmark item


def test_the_same_template_with_other_values_is_a_distinct_task(texts):
    """What over-merges templated data: two instances of one template that differ only in an id or amount."""
    import re

    value = re.compile(r"\b([A-Z])(\d{4})\b")
    variants = []
    for key, text in texts:
        if value.search(text):  # another entity of the same kind: the same words, a different task
            variants.append((f"other-{key}", value.sub(lambda m: f"{m.group(1)}{(int(m.group(2)) + 37) % 10000:04d}",
                                                        text, count=1)))
    assert len(variants) > 60
    found = {d.key: d for d in find_duplicates(texts + variants)}
    merged = [k for k in found if k.startswith("other-") and found[k].cluster == found[k.removeprefix("other-")].cluster]
    assert merged == []
