"""Where text that is not ours meets DuckDB: split names, users' queries, and what a corpus connection may open.

Three rules, each enforced here and nowhere else:

* A split name reaches SQL only as the view of a declared selection (``split_sft_v1``): it is looked up in
  :data:`storage.selections.SELECTIONS`, never formatted in, so ``sft_v1; COPY ... TO '/x'`` is an unknown split.
* A user's query (``--query``) runs only as one ``SELECT`` statement, bound as a relation rather than pasted into
  ours, so it cannot end our statement and start another.
* Every corpus connection, once its views exist, can open the corpus's own shards and no other file: DuckDB's
  ``allowed_paths`` lists them, ``enable_external_access`` is off (no other file read or written, no extension
  installed or loaded, no database attached) and the configuration is locked, so no later statement can undo it.
  ``COPY ... TO`` a shard itself is still possible, which is why user text never gets a statement of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import duckdb
from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError

from storage.selections import SELECTIONS

# Tables a curate run writes; until one has rows, every split that needs a probe's label is empty.
CURATE_TABLES = ("necessity", "difficulty", "dedup")


def split_view(key: str) -> str:
    """The view of the named split, for a ``FROM`` clause; ``ValueError`` naming the known splits otherwise."""
    if not isinstance(key, str) or key not in SELECTIONS:
        raise ValueError(f"unknown split {key!r}; known: {', '.join(SELECTIONS)}")
    return f"split_{key}"


def _check_split(key: Any) -> Any:
    """A config's split name, refused with the known ones (a ``mode="before"`` validator: this message, not
    pydantic's), so a name from a ``--config`` file or a Prefect flow parameter never reaches a connection."""
    if isinstance(key, str) and key in SELECTIONS:
        return key
    # the message goes in the context, last: a template would expand braces in the name
    raise PydanticCustomError("split", "{message}", {"key": str(key), "message": (
        f"unknown split {key!r}; known: {', '.join(SELECTIONS)}")})


# The type of every config field naming a split: the choices are in the JSON schema (the Prefect UI form).
SplitName = Annotated[str, Field(json_schema_extra={"enum": list(SELECTIONS)}), BeforeValidator(_check_split)]


def require_split(con: duckdb.DuckDBPyConnection, key: str, root: str | Path) -> str:
    """:func:`split_view`, checked to exist on ``con`` (the splits exist once a synthesize run has tasks)."""
    view = split_view(key)
    if not con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = ?", [view]).fetchone()[0]:
        raise ValueError(f"no synthesized tasks in {root}, so no split {key}: run `synthloop synthesize` first")
    return view


def curated(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether any curate run's rows are in the corpus (before one, the curate tables are empty views)."""
    return any(con.execute(f"SELECT EXISTS (SELECT 1 FROM {t})").fetchone()[0] for t in CURATE_TABLES)


def empty_split(con: duckdb.DuckDBPyConnection, key: str, root: str | Path) -> ValueError | None:
    """The error for a split with no rows on a corpus that was never curated (``None`` once it was: an empty
    split of a curated corpus is an answer, e.g. no task at the boundary)."""
    if curated(con):
        return None
    return ValueError(f"split {key} of {root} is empty: the corpus has not been curated; run "
                      f"`synthloop curate --corpus {root}` first")


def user_query(con: duckdb.DuckDBPyConnection, query: str) -> duckdb.DuckDBPyRelation:
    """A user's query as a relation on ``con``, refused (``ValueError``, one line) unless it is one ``SELECT``."""
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise ValueError(f"query {query!r} does not parse: {first_line(exc)}") from None
    kinds = [s.type.name for s in statements]
    if kinds != ["SELECT"]:
        raise ValueError(f"query {query!r} must be one SELECT statement (got {', '.join(kinds) or 'none'})")
    try:
        return con.sql(statements[0].query)
    except duckdb.Error as exc:
        raise ValueError(f"query {query!r} failed: {first_line(exc)}") from None


def confine(con: duckdb.DuckDBPyConnection, files: list[Path]) -> None:
    """Let ``con`` open ``files`` (the shards its views read) and nothing else, for the rest of its life."""
    con.execute("SET allowed_paths = ?", [[str(Path(f).resolve()) for f in files] + [str(f) for f in files]])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def first_line(exc: BaseException) -> str:
    """DuckDB's message without its multi-line caret diagram."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
