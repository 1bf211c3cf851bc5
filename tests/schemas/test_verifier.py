"""The verifier spec and the component registry (``schemas.verifier``).

Specified here:
* ``VerifierSpec.from_json`` / ``to_json`` round-trip every spec the synthesis code writes exactly (code checks
  included), through Parquet too, and ``Task.verifier_spec`` reads them typed;
* the spec's JSON Schema is derived from the check classes: each entry's properties are its class's fields, and
  the tasks table accepts every real spec;
* a malformed spec is refused by both the reader and the table, naming the entry and the field; an unknown
  component is refused with its name;
* ``COMPONENTS`` declares each component once, with its kind; ``Verdict.outcome_passed`` reads the kinds, so
  declaring a new outcome component (or changing a kind) changes it;
* no module outside ``schemas/verifier.py`` holds a list of component names.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
from pathlib import Path

import pytest

from generators.config import SynthesizeConfig
from schemas import TABLES, CheckResult, Task, Verdict
from schemas.verifier import (
    COMPONENTS,
    OUTCOME,
    PROCESS,
    RULES,
    AnswerCheck,
    CodeCheck,
    Component,
    VerifierSpec,
    component,
    components,
    declare,
    is_outcome,
    record_schema,
)
from stages.synthesize import run_batch
from tests.helpers import SCRIPTED

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("flows", "training", "generators", "verifiers", "envs", "storage", "sandbox", "schemas")


@pytest.fixture(scope="module")
def tasks() -> list[dict]:
    """Task rows of two small real batches, one where every task also carries a code check."""
    rows = []
    for name, share in (("spec", 0.0), ("spec-code", 1.0)):
        cfg = SynthesizeConfig(run_name=name, n_tasks=16, batch_size=16, agents=SCRIPTED, code_check_share=share)
        rows += run_batch(cfg, 0).tables["tasks"]
    return rows


def test_every_real_spec_round_trips_exactly(tasks, tmp_path):
    assert any(any(c["name"] == "code" for c in r["verifier"]["checks"]) for r in tasks)
    for row in tasks:
        spec = VerifierSpec.from_json(row["verifier"])
        assert spec.to_json() == row["verifier"]
        assert Task.from_row(copy.deepcopy(row)).verifier_spec == spec
    # and as stored: JSON text in Parquet, read back
    table = TABLES["tasks"]
    import pyarrow.parquet as pq

    pq.write_table(table.to_arrow(tasks), tmp_path / "t.parquet")
    for row, back in zip(tasks, table.from_arrow(pq.read_table(tmp_path / "t.parquet"))):
        assert VerifierSpec.from_json(back["verifier"]).to_json() == row["verifier"]


def test_typed_entries_hold_what_the_json_holds(tasks):
    row = next(r for r in tasks if any(c["name"] == "code" for c in r["verifier"]["checks"]))
    spec = VerifierSpec.from_json(row["verifier"])
    answer = next(c for c in row["verifier"]["checks"] if c["name"] == "answer")
    assert spec.find(AnswerCheck).expected == answer["expected"]
    assert [(s.step, s.field) for s in spec.find(AnswerCheck).sources] == [(s["step"], s["field"])
                                                                           for s in answer["sources"]]
    assert spec.find(CodeCheck).entrypoint == "check"
    assert spec.entry("grounding") is None  # judged always, never asked for


def test_the_json_schema_is_the_classes_fields():
    for c in COMPONENTS.values():
        if c.spec is None:
            continue
        props = record_schema(c.spec)["properties"]
        assert set(props) == {"name"} | {f.name for f in dataclasses.fields(c.spec)}
        assert props["name"] == {"const": c.name}
    for kind, cls in RULES.items():
        props = record_schema(cls)["properties"]
        assert set(props) == {"kind"} | {f.name for f in dataclasses.fields(cls)} and props["kind"] == {"const": kind}


def _checks(row: dict) -> list[dict]:
    return row["verifier"]["checks"]


MALFORMED = [
    # (mutation of a task row, what the reader's message names, what the table's message names)
    (lambda r: _checks(r).append({"name": "telepathy"}), "'telepathy'", "verifier/checks"),
    (lambda r: _checks(r).append({"name": "code", "entrypoint": "check"}), "(code): missing field(s) ['source']",
     "verifier/checks"),
    (lambda r: next(c for c in _checks(r) if c["name"] == "constraints")["rules"].append(
        {"kind": "max_calls", "value": 0}), "field value: 0 is less than the minimum", "verifier/checks"),
    (lambda r: next(c for c in _checks(r) if c["name"] == "constraints")["rules"].append({"kind": "be_nice"}),
     "kind 'be_nice' is not one of", "verifier/checks"),
    (lambda r: next(c for c in _checks(r) if c["name"] == "answer").pop("sources"),
     "(answer): missing field(s) ['sources']", "verifier/checks"),
    (lambda r: next(c for c in _checks(r) if c["name"] == "state_diff").update(expected=[]),
     "(state_diff): field expected: list, expected an object", "verifier/checks"),
    (lambda r: next(c for c in _checks(r) if c["name"] == "required_calls")["calls"].append({"tool": "x"}),
     "missing field(s) ['args']", "verifier/checks"),
    (lambda r: r["verifier"].update(version=2), "field version", "verifier/version"),
    (lambda r: r["verifier"].update(checks=[]), "field checks", "verifier/checks"),
]


@pytest.mark.parametrize("mutate, reader_says, table_says", MALFORMED)
def test_a_malformed_spec_is_refused_naming_the_field(tasks, mutate, reader_says, table_says):
    row = copy.deepcopy(tasks[0])
    mutate(row)
    with pytest.raises(ValueError, match="verifier spec") as read:
        VerifierSpec.from_json(row["verifier"])
    assert reader_says in str(read.value)
    with pytest.raises(ValueError) as written:
        TABLES["tasks"].validate(row)
    assert f"field {table_says}" in str(written.value) and tasks[0]["task_id"] in str(written.value)


def test_a_component_asked_for_twice_is_refused(tasks):
    spec = copy.deepcopy(tasks[0]["verifier"])
    spec["checks"].append({"name": "format"})
    with pytest.raises(ValueError, match="'format' is asked for twice"):
        VerifierSpec.from_json(spec)


# --- the registry ----------------------------------------------------------------------------------------------------


def test_each_component_is_declared_once_with_its_kind():
    assert [c.name for c in components(kind=OUTCOME)] == ["state_diff", "answer", "constraints", "code"]
    assert [c.name for c in components(kind=PROCESS)] == ["format", "schema", "execution", "grounding",
                                                          "observations", "required_calls"]
    assert not is_outcome("environment") and not is_outcome("required_calls") and is_outcome("code")
    with pytest.raises(ValueError, match="already declared"):
        declare(Component("answer", OUTCOME, AnswerCheck))
    with pytest.raises(ValueError, match="unknown verifier component 'telepathy'"):
        component("telepathy")


def test_the_reward_roles_are_declared_with_the_components():
    assert [c.name for c in components(reward="gate")] == ["format", "schema"]
    # required_calls is a process component that the reward still credits, and says so here
    assert [(c.name, c.work) for c in components(reward="progress")] == [
        ("state_diff", "expected_diff"), ("required_calls", "reference_plan"), ("answer", "expected_answer")]
    assert [c.name for c in components(reward="completion")] == ["constraints"]


def _verdict(*results: tuple[str, bool]) -> Verdict:
    return Verdict("v", "t", "task", "run", 0, "reference", True, all(p for _, p in results),
                   [CheckResult(n, p, float(p)) for n, p in results])


def test_outcome_passed_reads_the_declared_kinds(monkeypatch):
    verdict = _verdict(("format", True), ("required_calls", False), ("state_diff", True), ("answer", True),
                       ("mood", False))
    assert verdict.outcome_passed  # required_calls is process; an undeclared name counts for nothing
    monkeypatch.setitem(COMPONENTS, "mood", Component("mood", OUTCOME))
    assert not verdict.outcome_passed
    monkeypatch.delitem(COMPONENTS, "mood")
    monkeypatch.setitem(COMPONENTS, "required_calls",
                        dataclasses.replace(COMPONENTS["required_calls"], kind=OUTCOME))
    assert not verdict.outcome_passed
    assert not _verdict(("format", True), ("grounding", True)).outcome_passed  # no outcome component at all


# --- no second list ----------------------------------------------------------------------------------------------------


def _name_lists(path: Path, names: set[str], root: Path = ROOT) -> list[str]:
    """Literal lists, tuples, sets and dict keys in ``path`` holding two or more component names."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        items = node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else (
            node.keys if isinstance(node, ast.Dict) else [])
        held = [e.value for e in items if isinstance(e, ast.Constant) and e.value in names]
        if len(held) >= 2:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {held}")
    return found


def test_no_module_but_the_registry_lists_component_names(tmp_path):
    names = set(COMPONENTS)
    files = [p for top in PACKAGES for p in sorted((ROOT / top).rglob("*.py"))
             if p != ROOT / "schemas" / "verifier.py"]
    assert len(files) > 50
    assert [hit for f in files for hit in _name_lists(f, names)] == []
    planted = tmp_path / "planted.py"
    planted.write_text('OUTCOME = ("state_diff", "answer")\n')
    assert len(_name_lists(planted.resolve(), names, root=tmp_path.resolve())) == 1
