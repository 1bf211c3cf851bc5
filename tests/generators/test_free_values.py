"""Free-form argument values (a search string, a message) that no state supplies are proposed and kept only
if the call they complete succeeds (execute-first)."""

from __future__ import annotations

import random
import sqlite3
from typing import TypedDict

from envs import Environment
from envs.base import Domain, ToolError, tool
from generators.agents import OracleAssistant, ScriptedUser, run_episode
from generators.config import SamplingConfig
from generators.graph import ToolGraph
from generators.tasks import PlanSampler, sample_tasks
from verifiers.checks import verify

WORDS = ("harbour", "lantern", "orchid", "granite", "meadow", "comet")


class Note(TypedDict):
    note_id: str
    text: str


class Notes(Domain):
    """A note book: notes are found by words in them and can be archived."""

    name = "notes"
    description = "A note book"
    schema_sql = """
    CREATE TABLE notes (note_id TEXT PRIMARY KEY, text TEXT NOT NULL, archived INTEGER NOT NULL DEFAULT 0);
    """
    arg_sources = {"note_id": "SELECT note_id FROM notes WHERE archived = 0"}

    @classmethod
    def populate(cls, db: sqlite3.Connection, rng: random.Random) -> None:
        for i, word in enumerate(rng.sample(WORDS, 4), 1):
            db.execute("INSERT INTO notes VALUES (?, ?, 0)", (f"N{i:04d}", f"a note about the {word}"))

    @tool(mutates=False, phrase="find my notes mentioning {query}", answer="#")
    def search_notes(self, query: str) -> list[Note]:
        """Find notes containing a word.

        Args:
            query: A word the note contains, e.g. "orchid".
        """
        found = self.all("SELECT note_id, text FROM notes WHERE archived = 0 AND instr(text, ?) > 0", query)
        if not found:
            raise ToolError(f"No note mentions '{query}'")
        return found

    @tool(mutates=True, phrase="archive note {note_id}")
    def archive_note(self, note_id: str) -> Note:
        """Archive a note.

        Args:
            note_id: The note, e.g. "N0001".
        """
        note = self.one("SELECT note_id, text FROM notes WHERE note_id = ? AND archived = 0", note_id,
                        missing=f"Note {note_id} not found")
        self.db.execute("UPDATE notes SET archived = 1 WHERE note_id = ?", (note_id,))
        return note


def test_without_a_proposer_a_free_text_argument_cannot_be_bound():
    env = Environment(Notes, 1)
    sampler = PlanSampler(env, ToolGraph.build([s.record for s in env.specs.values()], env.foreign_keys()),
                          SamplingConfig(depth_max=1))
    plans = [sampler.sample(random.Random(i)) for i in range(12)]
    tools = {s.tool for plan in plans if plan for s in plan[1]}
    assert tools == {"archive_note"}


def test_proposed_values_are_kept_only_when_the_call_succeeds():
    env = Environment(Notes, 1)
    asked = []

    def propose(tool, param, arguments, work, variant):
        asked.append((tool, param, variant))
        # the first guess is a word no note has (the call fails: not kept), later ones read the state
        if variant == 0:
            return "volcano"
        texts = [r["text"] for r in work.rows()["notes"].values()]
        return texts[variant % len(texts)].split()[-1]

    tasks = [t for t, _ in sample_tasks(env, 20, propose=propose)]
    searches = [s for t in tasks for s in t.reference_plan if s.tool == "search_notes"]
    assert asked and all(tool == "search_notes" and param == "query" for tool, param, _ in asked)
    assert searches, "a proposed value that makes the call succeed yields tasks"
    assert all(s.args["query"] != "volcano" for s in searches)  # a failing call is never part of a plan
    task = next(t for t in tasks if any(s.tool == "search_notes" for s in t.reference_plan))
    assert any(task.reference_plan[0].args["query"] in r for r in task.requests)  # the user states the value
    reference = run_episode(task, ScriptedUser(task), OracleAssistant(task), env.fork(), role="reference",
                            trajectory_id="r")
    assert verify(task, reference, env, expected_pass=True).passed


def test_a_proposer_that_knows_nothing_leaves_the_tool_unbound():
    env = Environment(Notes, 1)
    tasks = [t for t, _ in sample_tasks(env, 10, propose=lambda *a: None)]
    assert not any(s.tool == "search_notes" for t in tasks for s in t.reference_plan)
