"""The built-in domains: derived schemas, seeded generators, state handling and execution of every tool."""

from __future__ import annotations

import itertools
import json
import random
import re
import sqlite3
import string
from typing import Any

import jsonschema
import pytest

from envs import DOMAINS, Domain, Environment, ToolSpec
from envs.base import connect_database
from schemas import TABLES

DOMAIN_LIST = list(DOMAINS.values())
ALL_TOOLS = [(d, name) for d in DOMAIN_LIST for name in sorted(d.tools())]
SEED = 0


def domain_params(**kw: Any) -> Any:
    return pytest.mark.parametrize("domain", DOMAIN_LIST, ids=[d.name for d in DOMAIN_LIST], **kw)


@pytest.fixture(scope="module")
def envs() -> dict[str, Environment]:
    """One generated environment per domain; tests fork it (cheap) instead of regenerating."""
    return {d.name: Environment(d, SEED) for d in DOMAIN_LIST}


def fresh(envs: dict[str, Environment], domain: type[Domain]) -> Environment:
    return envs[domain.name].fork()


# --- helpers ----------------------------------------------------------------------------------------------

_FALLBACK = {"integer": [1, 2, 5, 10], "number": [1.0, 25.5, 100.0], "boolean": [True, False]}


def values_for(env: Environment, tool: str, param: str, schema: dict[str, Any]) -> list[Any]:
    """Values to try for one parameter: the tool-specific source, the generic source, enum or small numbers."""
    values = env.candidates(f"{tool}.{param}") or env.candidates(param)
    if values:
        return values
    if "enum" in schema:
        return list(schema["enum"])
    kind = schema["type"][0] if isinstance(schema["type"], list) else schema["type"]
    if kind in _FALLBACK:
        return _FALLBACK[kind]
    raise AssertionError(f"{env.domain_cls.name}.{tool}: no values for parameter {param!r}")


def candidate_args(env: Environment, spec: ToolSpec, limit: int = 400) -> list[dict[str, Any]]:
    """Argument sets built from the current state's candidates (required parameters only), in seeded order."""
    params = spec.record.parameters
    required = params["required"]
    pools = [values_for(env, spec.name, p, params["properties"][p]) for p in required]
    combos = list(itertools.islice(itertools.product(*pools), 20000))
    random.Random(spec.name).shuffle(combos)
    return [dict(zip(required, combo)) for combo in combos[:limit]]


def first_success(env: Environment, spec: ToolSpec) -> tuple[dict[str, Any], Any, list[str]]:
    """Try candidate arguments until a call succeeds; the state is restored after each try."""
    errors = []
    for args in candidate_args(env, spec):
        snap = env.snapshot()
        result, error = env.execute(spec.name, args)
        if error is None:
            return args, result, errors
        errors.append(error)
        env.restore(snap)
    raise AssertionError(f"no candidate call of {spec.name} succeeded; errors: {sorted(set(errors))[:8]}")


def placeholders(phrase: str) -> set[str]:
    return {field for _, field, _, _ in string.Formatter().parse(phrase) if field}


def returns_list(spec: ToolSpec) -> bool:
    return (spec.record.returns or {}).get("type") == "array"


def first_row(env: Environment, sql: str, *params: Any) -> dict[str, Any]:
    row = env.db.execute(sql, params).fetchone()
    assert row is not None, sql
    return dict(row)


# --- schema derivation ------------------------------------------------------------------------------------


@domain_params()
def test_tool_schemas_are_complete(domain: type[Domain]) -> None:
    specs = domain.tools()
    assert 10 <= len(specs) <= 12
    assert sum(s.mutates for s in specs.values()) >= 4
    assert sum(not s.mutates for s in specs.values()) >= 4
    for name, spec in specs.items():
        record = spec.record
        assert record.name == name and record.domain == domain.name
        assert record.description and record.description[0].isupper()
        params = record.parameters
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert set(params["required"]) <= set(params["properties"])
        for pname, prop in params["properties"].items():
            assert prop.get("description"), f"{name}.{pname} has no description"
            assert "type" in prop
            if pname not in params["required"]:
                assert "default" in prop, f"{name}.{pname} is optional without a default"
        assert record.returns is not None, f"{name} returns nothing"
        assert record.returns["type"] in ("object", "array")
        if record.returns["type"] == "array":
            assert record.returns["items"]["type"] == "object"
        assert record.implementation.endswith(f"{domain.__name__}.{name}")
        assert record.source == f"env:{domain.name}"


def test_tool_counts_across_domains() -> None:
    assert [d.name for d in DOMAIN_LIST] == ["retail", "calendar", "banking", "files"]
    assert sum(len(d.tools()) for d in DOMAIN_LIST) >= 40
    assert len({d.name for d in DOMAIN_LIST}) == len(DOMAIN_LIST)


@domain_params()
def test_tool_rows_validate(domain: type[Domain]) -> None:
    for spec in domain.tools().values():
        row = spec.record.to_row()
        TABLES["tools"].validate(row)
        json.dumps(row)  # serialisable as is
        assert row["mutates"] is spec.mutates
        # the name the corpus's tools rows have always carried, wherever the domain's module now sits
        assert row["implementation"] == f"envs.{domain.name}:{domain.__name__}.{spec.method}"


@domain_params()
def test_phrases_and_answers(domain: type[Domain]) -> None:
    for name, spec in domain.tools().items():
        params = spec.record.parameters
        names = placeholders(spec.phrase)
        assert names <= set(params["properties"]), f"{name}: phrase names unknown parameters"
        assert set(params["required"]) <= names, f"{name}: phrase misses required parameters"
        assert spec.answer is not None, f"{name} has no answer field"
        if returns_list(spec):
            assert spec.answer == "#", name
        else:
            assert spec.answer in spec.record.returns["properties"], f"{name}: answer {spec.answer!r} not a field"


@domain_params()
def test_outputs_feed_inputs(domain: type[Domain]) -> None:
    """Every id-like parameter is produced as a result field by some tool, so the tool graph can chain calls."""
    fields: set[str] = set()
    for spec in domain.tools().values():
        schema = spec.record.returns
        props = schema["items"]["properties"] if schema["type"] == "array" else schema["properties"]
        fields |= set(props)
    for name, spec in domain.tools().items():
        for pname in spec.record.parameters["properties"]:
            if pname.endswith("_id"):
                assert pname in fields, f"{name}.{pname} is produced by no tool"


# --- arg sources ------------------------------------------------------------------------------------------


@domain_params()
def test_arg_sources_name_real_parameters(domain: type[Domain]) -> None:
    specs = domain.tools()
    all_params = {p for s in specs.values() for p in s.record.parameters["properties"]}
    for key in domain.arg_sources:
        if "." in key:
            tool_name, param = key.split(".", 1)
            assert tool_name in specs, key
            assert param in specs[tool_name].record.parameters["properties"], key
        elif key in specs:  # a row source: its columns must be parameters of that tool
            env = Environment(domain, 0)
            rows = env.candidate_rows(key)
            assert rows, f"row source {key} is empty"
            assert set(rows[0]) <= set(specs[key].record.parameters["properties"]), key
        else:
            assert key in all_params, key


@domain_params()
@pytest.mark.parametrize("seed", range(5))
def test_row_sources_give_working_arguments(domain: type[Domain], seed: int) -> None:
    """Each row of a row source, completed with candidates for missing required parameters, is a valid call.

    Every row source must yield at least one successful call, and (the point of a row source) most rows must.
    """
    env = Environment(domain, seed)
    row_tools = [key for key in domain.arg_sources if key in env.specs]
    for tool_name in row_tools:
        params = env.specs[tool_name].record.parameters
        rows = env.candidate_rows(tool_name)
        assert rows, f"{domain.name} seed {seed}: row source {tool_name} is empty"
        ok, errors = 0, set()
        for row in rows:
            missing = [p for p in params["required"] if p not in row]
            pools = [values_for(env, tool_name, p, params["properties"][p]) for p in missing]
            for combo in itertools.islice(itertools.product(*pools), 10):
                snap = env.snapshot()
                _, error = env.execute(tool_name, {**row, **dict(zip(missing, combo))})
                env.restore(snap)
                if error is None:
                    ok += 1
                    break
                errors.add(error)
        assert ok, f"{domain.name} seed {seed}: no row of {tool_name} works: {sorted(errors)[:5]}"
        assert ok >= len(rows) / 2, f"{domain.name} seed {seed}: {tool_name} {ok}/{len(rows)}: {sorted(errors)[:5]}"


@domain_params()
def test_string_parameters_have_sources(domain: type[Domain]) -> None:
    """Id-like and free-text parameters must come from the state (or a fixed list), never be invented."""
    for name, spec in domain.tools().items():
        for pname, prop in spec.record.parameters["properties"].items():
            types = prop["type"] if isinstance(prop["type"], list) else [prop["type"]]
            if "string" in types and "enum" not in prop:
                assert f"{name}.{pname}" in domain.arg_sources or pname in domain.arg_sources, f"{name}.{pname}"


@domain_params()
@pytest.mark.parametrize("seed", range(5))
def test_arg_sources_are_nonempty(domain: type[Domain], seed: int) -> None:
    env = Environment(domain, seed)
    for key in domain.arg_sources:
        values = env.candidates(key)
        assert values, f"{domain.name} seed {seed}: source {key!r} is empty"
        assert None not in values, key


# --- generator and state ----------------------------------------------------------------------------------


@domain_params()
def test_seeded_generator(domain: type[Domain]) -> None:
    a, b, c = Environment(domain, 11), Environment(domain, 11), Environment(domain, 12)
    assert a.state_hash() == b.state_hash()
    assert a.rows() == b.rows()
    assert a.state_hash() != c.state_hash()
    assert a.db.execute("PRAGMA foreign_key_check").fetchall() == []
    counts = a.row_counts()
    assert all(n > 0 for t, n in counts.items() if t != "returns"), counts
    assert sum(counts.values()) < 400


@domain_params()
def test_schema_has_keys(domain: type[Domain], envs: dict[str, Environment]) -> None:
    env = fresh(envs, domain)
    for table in env.tables():
        assert env._primary_key(table), f"{table} has no primary key"
    fks = [env.db.execute(f"PRAGMA foreign_key_list({t})").fetchall() for t in env.tables()]
    assert sum(map(len, fks)) >= 3


def do_one_write(env: Environment) -> str:
    """Make one successful state-changing call; return the tool's name."""
    spec = next(s for _, s in sorted(env.specs.items()) if s.mutates)
    first_success(env, spec)
    return spec.name


@domain_params()
def test_fork_gives_initial_state(domain: type[Domain], envs: dict[str, Environment]) -> None:
    env = fresh(envs, domain)
    initial = env.state_hash()
    do_one_write(env)
    assert env.state_hash() != initial
    assert env.fork().state_hash() == initial
    assert env.state_hash() != initial  # forking does not touch the original


@domain_params()
def test_snapshot_restore_round_trips(domain: type[Domain], envs: dict[str, Environment]) -> None:
    env = fresh(envs, domain)
    snap, initial = env.snapshot(), env.state_hash()
    do_one_write(env)
    changed = env.state_hash()
    assert changed != initial
    env.restore(snap)
    assert env.state_hash() == initial
    assert env.db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    do_one_write(env)  # the restored environment still executes, deterministically
    assert env.state_hash() == changed


@domain_params()
def test_state_hash_ignores_insertion_order(domain: type[Domain], envs: dict[str, Environment]) -> None:
    env = fresh(envs, domain)
    db = connect_database()
    db.executescript(domain.schema_sql)
    db.execute("PRAGMA foreign_keys = OFF")
    db.execute("BEGIN")
    for table, rows in reversed(list(env.rows().items())):
        for row in reversed(list(rows.values())):
            cols = ", ".join(row)
            db.execute(f"INSERT INTO {table} ({cols}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))
    db.execute("COMMIT")
    assert db.execute("PRAGMA foreign_key_check").fetchall() == []
    rebuilt = Environment(domain, SEED, _initial=db.serialize())
    assert rebuilt.state_hash() == env.state_hash()


INVERSE_PAIRS = {
    "calendar": ("invite_attendee", "remove_attendee"),
    "banking": ("freeze_card", "unfreeze_card"),
    "files": ("share_file", "unshare_file"),
}


@pytest.mark.parametrize("domain_name", sorted(INVERSE_PAIRS))
def test_write_then_inverse_restores_hash(domain_name: str, envs: dict[str, Environment]) -> None:
    env = envs[domain_name].fork()
    initial = env.state_hash()
    do, undo = INVERSE_PAIRS[domain_name]
    args, _, _ = first_success(env, env.specs[do])
    assert env.state_hash() != initial
    undo_params = env.specs[undo].record.parameters["required"]
    result, error = env.execute(undo, {p: args[p] for p in undo_params})
    assert error is None, error
    assert env.state_hash() == initial


# --- execution --------------------------------------------------------------------------------------------


def a_string_param_tool(domain: type[Domain]) -> tuple[str, str, list[str]]:
    for name, spec in sorted(domain.tools().items()):
        params = spec.record.parameters
        for pname in params["required"]:
            if params["properties"][pname]["type"] == "string" and "enum" not in params["properties"][pname]:
                return name, pname, params["required"]
    raise AssertionError("no tool with a required string parameter")


@domain_params()
def test_argument_validation_errors(domain: type[Domain], envs: dict[str, Environment]) -> None:
    env = fresh(envs, domain)
    before = env.state_hash()
    name, pname, required = a_string_param_tool(domain)
    spec = env.specs[name]
    good = {p: values_for(env, name, p, spec.record.parameters["properties"][p])[0] for p in required}

    result, error = env.execute(name, {**good, pname: 12345})
    assert result is None and pname in error and "string" in error

    missing = {k: v for k, v in good.items() if k != pname}
    result, error = env.execute(name, missing)
    assert result is None and f"'{pname}'" in error and "required" in error

    result, error = env.execute(name, {**good, "bogus_arg": 1})
    assert result is None and "bogus_arg" in error

    result, error = env.execute(name, [good[p] for p in required])
    assert result is None and "JSON object" in error

    for spec in env.specs.values():  # every mutating tool rejects a wrong type before touching the state
        if spec.mutates:
            props = spec.record.parameters["properties"]
            bad = {p: {"nested": True} for p in spec.record.parameters["required"]}
            result, error = env.execute(spec.name, bad)
            assert result is None and any(p in error for p in props)
    assert env.state_hash() == before


@domain_params()
def test_unknown_ids_raise_tool_errors(domain: type[Domain], envs: dict[str, Environment]) -> None:
    env = fresh(envs, domain)
    before = env.state_hash()
    checked = 0
    for name, spec in sorted(env.specs.items()):
        params = spec.record.parameters
        for pname in params["required"]:
            if not pname.endswith("_id"):
                continue
            for args in candidate_args(env, spec, limit=1):
                result, error = env.execute(name, {**args, pname: "NOPE-404"})
                assert result is None, f"{name} accepted {pname}='NOPE-404'"
                assert "not found" in error.lower() or "different" in error.lower() or "not" in error.lower(), error
                assert not error.startswith("Rejected by the database"), f"{name}.{pname}: {error}"
                checked += 1
    assert checked >= 5
    assert env.state_hash() == before


def test_unknown_tool_lists_available_tools(envs: dict[str, Environment]) -> None:
    for env in envs.values():
        result, error = env.execute("launch_rocket", {})
        assert result is None
        assert "launch_rocket" in error
        for name in env.specs:
            assert name in error


@pytest.mark.parametrize("domain,tool_name", ALL_TOOLS, ids=[f"{d.name}.{t}" for d, t in ALL_TOOLS])
def test_every_tool_runs_on_candidates(domain: type[Domain], tool_name: str, envs: dict[str, Environment]) -> None:
    env = fresh(envs, domain)
    spec = env.specs[tool_name]
    before = env.state_hash()
    args, result, _ = first_success(env, spec)
    after = env.state_hash()
    if spec.mutates:
        assert after != before, f"{tool_name}{args} succeeded without changing the state"
    else:
        assert after == before, f"read-only {tool_name} changed the state"
    assert env.db.execute("PRAGMA foreign_key_check").fetchall() == []
    # the result matches the declared return schema
    jsonschema.validate(result, spec.record.returns)
    if spec.answer == "#":
        assert isinstance(result, list)
    else:
        assert spec.answer in result
    # the same call on a fork gives the same state (deterministic ids and clock)
    twin = fresh(envs, domain)
    assert twin.execute(tool_name, args)[1] is None
    assert twin.state_hash() == after


@pytest.mark.parametrize("domain,tool_name", [(d, t) for d, t in ALL_TOOLS if d.tools()[t].mutates],
                         ids=[f"{d.name}.{t}" for d, t in ALL_TOOLS if d.tools()[t].mutates])
def test_repeating_a_write_is_not_a_silent_noop(domain: type[Domain], tool_name: str,
                                                envs: dict[str, Environment]) -> None:
    """Calling a write again with the same arguments either changes the state again or fails."""
    env = fresh(envs, domain)
    args, _, _ = first_success(env, env.specs[tool_name])
    before = env.state_hash()
    result, error = env.execute(tool_name, args)
    if error is None:
        assert env.state_hash() != before
    else:
        assert env.state_hash() == before


# --- diffs ------------------------------------------------------------------------------------------------


def _updated(table: str, key: str, changes: dict[str, list[Any]]) -> dict[str, Any]:
    return {table: {"inserted": [], "deleted": [], "updated": {key: changes}}}


def test_diff_retail(envs: dict[str, Environment]) -> None:
    env = envs["retail"].fork()
    customer = first_row(env, "SELECT * FROM customers WHERE city != 'Oslo' ORDER BY customer_id")
    before = env.rows()
    _, error = env.execute("update_customer_city", {"customer_id": customer["customer_id"], "city": "Oslo"})
    assert error is None
    assert env.diff(before) == _updated("customers", customer["customer_id"], {"city": [customer["city"], "Oslo"]})


def test_diff_calendar(envs: dict[str, Environment]) -> None:
    env = envs["calendar"].fork()
    event = first_row(env, f"SELECT * FROM events WHERE status = 'scheduled' AND date >= '{env.domain_cls.today}'")
    before = env.rows()
    result, error = env.execute("cancel_event", {"event_id": event["event_id"]})
    assert error is None and result["status"] == "cancelled"
    assert env.diff(before) == _updated("events", event["event_id"], {"status": ["scheduled", "cancelled"]})


def test_diff_banking(envs: dict[str, Environment]) -> None:
    env = envs["banking"].fork()
    src = first_row(env, "SELECT * FROM accounts WHERE balance >= 100 ORDER BY account_id")
    dst = first_row(env, "SELECT * FROM accounts WHERE account_id != ? ORDER BY account_id", src["account_id"])
    before = env.rows()
    result, error = env.execute(
        "transfer_funds", {"from_account_id": src["account_id"], "to_account_id": dst["account_id"], "amount": 40.556}
    )
    assert error is None
    assert result["amount"] == 40.56 and result["balance"] == round(src["balance"] - 40.56, 2)
    today = env.domain_cls.today
    tx = [
        {"account_id": src["account_id"], "date": today, "amount": -40.56,
         "description": f"Transfer to {dst['account_id']}"},
        {"account_id": dst["account_id"], "date": today, "amount": 40.56,
         "description": f"Transfer from {src['account_id']}"},
    ]
    # new keys are numbered in the order of the rows' other contents
    for i, row in enumerate(sorted(tx, key=lambda r: json.dumps(r, sort_keys=True)), 1):
        row["transaction_id"] = f"<new transactions #{i}>"
    assert env.diff(before) == {
        "accounts": {
            "inserted": [],
            "deleted": [],
            "updated": {
                src["account_id"]: {"balance": [src["balance"], round(src["balance"] - 40.56, 2)]},
                dst["account_id"]: {"balance": [dst["balance"], round(dst["balance"] + 40.56, 2)]},
            },
        },
        "transactions": {
            "inserted": sorted(json.dumps(t, sort_keys=True) for t in tx),
            "deleted": [],
            "updated": {},
        },
    }


def test_diff_files(envs: dict[str, Environment]) -> None:
    env = envs["files"].fork()
    file_id = first_row(env, "SELECT file_id FROM shares GROUP BY file_id ORDER BY COUNT(*) DESC, file_id")["file_id"]
    users = [r[0] for r in env.db.execute("SELECT user_id FROM shares WHERE file_id = ? ORDER BY user_id", (file_id,))]
    before = env.rows()
    result, error = env.execute("delete_file", {"file_id": file_id})
    assert error is None and result["shares_removed"] == len(users)
    assert env.diff(before) == {
        "files": {"inserted": [], "deleted": [file_id], "updated": {}},
        "shares": {"inserted": [], "deleted": sorted(f"{file_id}|{u}" for u in users), "updated": {}},
    }
    assert env.db.execute("PRAGMA foreign_key_check").fetchall() == []


# --- domain behaviour -------------------------------------------------------------------------------------


def test_banking_insufficient_funds(envs: dict[str, Environment]) -> None:
    env = envs["banking"].fork()
    src = first_row(env, "SELECT * FROM accounts ORDER BY balance LIMIT 1")
    dst = first_row(env, "SELECT * FROM accounts WHERE account_id != ? LIMIT 1", src["account_id"])
    before = env.state_hash()
    result, error = env.execute("transfer_funds", {"from_account_id": src["account_id"],
                                                   "to_account_id": dst["account_id"], "amount": src["balance"] + 1})
    assert result is None and error == f"Insufficient funds: balance is {src['balance']:.2f}"
    result, error = env.execute("transfer_funds", {"from_account_id": src["account_id"],
                                                   "to_account_id": src["account_id"], "amount": 1})
    assert result is None and "different" in error
    assert env.state_hash() == before


def test_banking_payee_must_belong_to_account_owner(envs: dict[str, Environment]) -> None:
    env = envs["banking"].fork()
    pair = first_row(
        env,
        "SELECT a.account_id, p.payee_id FROM accounts a JOIN payees p ON p.customer_id != a.customer_id "
        "WHERE a.type = 'checking' AND a.balance >= 100 ORDER BY a.account_id, p.payee_id",
    )
    result, error = env.execute("pay_payee", {**pair, "amount": 10})
    assert result is None and "not saved" in error
    customer = first_row(env, "SELECT customer_id FROM customers ORDER BY customer_id")["customer_id"]
    added, error = env.execute("add_payee", {"customer_id": customer, "name": "City Water",
                                             "iban": "de89 3704 0044 0532 0130 00"})
    assert error is None and added["iban"] == "DE89370400440532013000"
    _, error = env.execute("add_payee", {"customer_id": customer, "name": "Water again",
                                         "iban": "DE89370400440532013000"})
    assert error is not None and "already" in error


def test_calendar_room_double_booking_is_refused(envs: dict[str, Environment]) -> None:
    env = envs["calendar"].fork()
    today = env.domain_cls.today
    user = first_row(env, "SELECT user_id FROM users ORDER BY user_id")["user_id"]
    room = first_row(env, "SELECT room_id FROM rooms ORDER BY capacity DESC, room_id")["room_id"]
    slot = {"date": "2026-01-30", "start_time": "18:00"}
    free = env.execute("find_free_rooms", {**slot, "capacity": 1})[0]
    assert room in [r["room_id"] for r in free]
    first, error = env.execute("create_event", {"user_id": user, "title": "Retro", **slot, "room_id": room})
    assert error is None and first["room_id"] == room and first["attendee_count"] == 1
    free = env.execute("find_free_rooms", {**slot, "capacity": 1, "duration_min": 30})[0]
    assert room not in [r["room_id"] for r in free]
    before = env.state_hash()
    _, error = env.execute("create_event", {"user_id": user, "title": "Clash", "date": "2026-01-30",
                                            "start_time": "18:30", "room_id": room})
    assert error == f"Room {room} is already booked by event {first['event_id']} at that time"
    _, error = env.execute("create_event", {"user_id": user, "title": "Old", "date": "2026-01-02",
                                            "start_time": "10:00"})
    assert error is not None and "past" in error and today in error
    assert env.state_hash() == before
    # after cancelling, the room is free again
    assert env.execute("cancel_event", {"event_id": first["event_id"]})[1] is None
    free = env.execute("find_free_rooms", {**slot, "capacity": 1})[0]
    assert room in [r["room_id"] for r in free]


def test_calendar_organiser_cannot_be_removed(envs: dict[str, Environment]) -> None:
    env = envs["calendar"].fork()
    event = first_row(env, f"SELECT * FROM events WHERE status = 'scheduled' AND date >= '{env.domain_cls.today}'")
    _, error = env.execute("remove_attendee", {"event_id": event["event_id"], "user_id": event["organiser_id"]})
    assert error is not None and "organiser" in error


def test_files_storage_usage_and_moves(envs: dict[str, Environment]) -> None:
    env = envs["files"].fork()
    user = first_row(env, "SELECT d.owner_id AS user_id FROM files f JOIN folders d USING (folder_id) "
                          "ORDER BY d.owner_id")["user_id"]
    expected = env.db.execute(
        "SELECT SUM(size_kb) FROM files JOIN folders USING (folder_id) WHERE owner_id = ?", (user,)
    ).fetchone()[0]
    usage, error = env.execute("get_storage_usage", {"user_id": user})
    assert error is None and usage["total_kb"] == expected and usage["free_kb"] == usage["quota_kb"] - expected
    file = first_row(env, "SELECT f.* FROM files f JOIN folders d USING (folder_id) WHERE d.owner_id = ?", user)
    folder, error = env.execute("create_folder", {"user_id": user, "name": "Archive"})
    assert error is None and folder["parent_id"] is None and folder["owner_id"] == user
    moved, error = env.execute("move_file", {"file_id": file["file_id"], "folder_id": folder["folder_id"]})
    assert error is None and moved["folder_id"] == folder["folder_id"]
    assert [f["file_id"] for f in env.execute("list_folder", {"folder_id": folder["folder_id"]})[0]] == [
        file["file_id"]
    ]
    other = first_row(env, "SELECT folder_id FROM folders WHERE owner_id != ?", user)["folder_id"]
    _, error = env.execute("move_file", {"file_id": file["file_id"], "folder_id": other})
    assert error is not None and "another user" in error
    _, error = env.execute("rename_file", {"file_id": file["file_id"], "new_name": file["name"]})
    assert error is not None and "already named" in error
    hits, _ = env.execute("search_files", {"user_id": user, "name_contains": file["name"].split("_")[0].upper()})
    assert file["file_id"] in [h["file_id"] for h in hits]
    assert env.execute("get_storage_usage", {"user_id": user})[0]["total_kb"] == expected


def test_dependency_chain_runs_end_to_end(envs: dict[str, Environment]) -> None:
    """email -> id -> list -> id -> write, as a task plan would chain them, in each new domain."""
    env = envs["banking"].fork()
    email = env.candidates("email")[0]
    customer, _ = env.execute("find_customer_by_email", {"email": email.upper()})
    accounts, _ = env.execute("list_accounts", {"customer_id": customer["customer_id"]})
    cards, _ = env.execute("list_cards", {"account_id": accounts[0]["account_id"]})
    assert accounts and cards is not None

    env = envs["calendar"].fork()
    for email in env.candidates("email"):
        user, _ = env.execute("find_user_by_email", {"email": email})
        events, _ = env.execute("list_events", {"user_id": user["user_id"]})
        upcoming = [e for e in events if e["date"] >= env.domain_cls.today]
        if upcoming:
            event, error = env.execute("cancel_event", {"event_id": upcoming[0]["event_id"]})
            assert error is None and event["status"] == "cancelled"
            break
    else:
        raise AssertionError("no user with an upcoming event")

    env = envs["files"].fork()
    user, _ = env.execute("find_user_by_email", {"email": env.candidates("email")[0]})
    folders, _ = env.execute("list_folders", {"user_id": user["user_id"]})
    assert folders and all(f["owner_id"] == user["user_id"] for f in folders)
    assert sum(f["parent_id"] is None for f in folders) == 1


def test_domains_use_no_real_clock() -> None:
    for domain in DOMAIN_LIST:
        source = __import__(domain.__module__, fromlist=["_"]).__file__
        text = open(source).read()
        assert not re.search(r"\b(date\.today|datetime\.now|time\.time)\(", text), domain.name


def test_sqlite_supports_upserts() -> None:
    assert sqlite3.sqlite_version_info >= (3, 24)  # ON CONFLICT ... DO UPDATE (files.share_file)
