"""Curation views and the named, versioned selections that turn a curated corpus into training splits.

Every decision is a column: ``curation`` has one row per task with its latest necessity label, min_calls,
difficulty bucket, p̂ and priority, dedup cluster, contamination, and whether each split selects it. A split is
a SQL query with a name and a version (``sft_v1``); changing what a split means adds a version, never
edits one, so a dataset exported from ``sft_v1`` can be rebuilt from the same query (its digest is stored in
the export's metadata).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

# The latest measurement per task. A label measured on an older model stays visible (and says which model
# it was measured for) until a newer probe of the same task replaces it.
CURATION_VIEWS = {
    "necessity_latest": """
        SELECT * FROM necessity
        QUALIFY row_number() OVER (PARTITION BY run_id, task_id
                                   ORDER BY (label IS NOT NULL) DESC, measured_at DESC, curate_run_id DESC) = 1""",
    "difficulty_latest": """
        SELECT * FROM difficulty
        QUALIFY row_number() OVER (PARTITION BY run_id, task_id ORDER BY measured_at DESC, curate_run_id DESC) = 1""",
    "dedup_latest": """
        SELECT * FROM dedup
        QUALIFY row_number() OVER (PARTITION BY run_id, task_id ORDER BY measured_at DESC, curate_run_id DESC) = 1""",
    "curation_labels": """
        SELECT t.run_id, t.task_id, t.domain, t.signature, t.accepted, t.reject_reason,
               n.label AS necessity_label, n.no_tool_pass_rate, n.model_version AS necessity_model_version,
               n.ref_calls, n.min_calls, n.curate_run_id AS ablation_run_id,
               d.bucket, d.pass_rate, d.priority, d.k AS rollouts, d.policy_version,
               coalesce(x.duplicate, false) AS duplicate, x.cluster AS dedup_cluster,
               coalesce(x.contaminated, false) AS contaminated, x.contamination_items
        FROM tasks t
        LEFT JOIN necessity_latest n USING (run_id, task_id)
        LEFT JOIN difficulty_latest d USING (run_id, task_id)
        LEFT JOIN dedup_latest x USING (run_id, task_id)""",
}


@dataclass(frozen=True)
class Selection:
    name: str
    version: int
    description: str
    sql: str

    @property
    def key(self) -> str:
        return f"{self.name}_v{self.version}"

    @property
    def digest(self) -> str:
        return hashlib.sha256(" ".join(self.sql.split()).encode()).hexdigest()[:12]


SFT_V1 = Selection(
    "sft", 1,
    "Conversations to imitate: accepted, not a duplicate, not contaminated, not labelled unnecessary, difficulty "
    "easy / boundary / not probed; the minimum-call trajectory where the ablation found a shorter one, else the "
    "reference. Plus answer-directly examples (tasks labelled unnecessary, a passing no-tool attempt) up to 10% "
    "of the tool examples.",
    """
    WITH tool_examples AS (
        SELECT c.run_id, c.task_id, c.domain, 'tools' AS kind, tr.trajectory_id, tr.messages, tr.tools
        FROM curation_labels c
        JOIN trajectories tr ON tr.task_id = c.task_id AND tr.run_id = c.run_id
        WHERE c.accepted AND NOT c.duplicate AND NOT c.contaminated
          AND coalesce(c.necessity_label, 'necessary') = 'necessary'
          AND coalesce(c.bucket, 'not_probed') IN ('easy', 'boundary', 'not_probed')
          AND ((coalesce(c.min_calls >= c.ref_calls, true) AND tr.role = 'reference' AND tr.run = tr.run_id)
               OR (c.min_calls < c.ref_calls AND tr.role = 'minimal' AND tr.run = c.ablation_run_id))
    ),
    direct AS (
        SELECT c.run_id, c.task_id, c.domain, 'answer_directly' AS kind, tr.trajectory_id, tr.messages, tr.tools
        FROM curation_labels c
        JOIN trajectories tr ON tr.task_id = c.task_id AND tr.run_id = c.run_id AND tr.role = 'no_tool'
        JOIN verdicts v ON v.trajectory_id = tr.trajectory_id AND v.outcome_passed
        WHERE c.necessity_label = 'unnecessary' AND NOT c.duplicate AND NOT c.contaminated
        QUALIFY row_number() OVER (PARTITION BY c.run_id, c.task_id ORDER BY tr.trajectory_id) = 1
    ),
    capped AS (  -- a bounded share: answering directly is a skill, not the point of a tool-use corpus
        SELECT * FROM direct
        QUALIFY row_number() OVER (ORDER BY hash(task_id)) <= (SELECT ceil(0.1 * count(*)) FROM tool_examples)
    )
    SELECT * FROM tool_examples UNION ALL SELECT * FROM capped
    """,
)

RL_V1 = Selection(
    "rl", 1,
    "Tasks to learn from by reinforcement: accepted, not a duplicate, not contaminated, not labelled unnecessary, "
    "in the boundary or hard bucket of the latest difficulty probe; highest priority p̂(1−p̂) first.",
    """
    SELECT c.run_id, c.task_id, c.domain, c.signature, c.bucket, c.pass_rate, c.priority, c.min_calls,
           c.policy_version
    FROM curation_labels c
    WHERE c.accepted AND NOT c.duplicate AND NOT c.contaminated
      AND coalesce(c.necessity_label, 'necessary') = 'necessary'
      AND c.bucket IN ('boundary', 'hard')
    ORDER BY c.priority DESC, c.run_id, c.task_id
    """,
)

SELECTIONS: dict[str, Selection] = {s.key: s for s in (SFT_V1, RL_V1)}


def selection_views() -> dict[str, str]:
    """``split_<key>`` per selection, then ``curation``: the labels plus one membership column per split."""
    views = {f"split_{s.key}": s.sql for s in SELECTIONS.values()}
    # Membership runs each split's own text (so it means exactly the split's rows), with ``curation_labels``
    # bound to one materialised copy: through the views, the labels' three latest-per-task windows were computed
    # once for the rows and again inside every split. Each split is evaluated once, as a set of keys, then
    # semi-joined; only the keys are kept, so the trajectories' messages and tools are never read.
    members = "".join(
        f",\n    members_{s.key} AS (SELECT run_id, task_id FROM ({s.sql}))" for s in SELECTIONS.values())
    flags = ",\n".join(
        f"EXISTS (SELECT 1 FROM members_{s.key} m WHERE m.run_id = c.run_id AND m.task_id = c.task_id) AS in_{s.key}"
        for s in SELECTIONS.values())
    views["curation"] = (f"WITH curation_labels AS MATERIALIZED ({CURATION_VIEWS['curation_labels']}){members}\n"
                         f"SELECT c.*, {flags} FROM curation_labels c")
    return views
