"""Data model of synthloop: typed records, their JSON Schemas and their Arrow schemas. Imports nothing of ours."""

from schemas.records import (
    SCHEMA_VERSION,
    CheckResult,
    EnvironmentRecord,
    Lineage,
    Message,
    PlanStep,
    Signature,
    Task,
    Tool,
    ToolEdge,
    Trajectory,
    Verdict,
    offered_tools,
)
from schemas.tables import TABLES, Table
from schemas.verifier import COMPONENTS, Component, VerifierSpec

__all__ = [
    "SCHEMA_VERSION",
    "TABLES",
    "COMPONENTS",
    "CheckResult",
    "Component",
    "EnvironmentRecord",
    "Lineage",
    "Message",
    "PlanStep",
    "Signature",
    "Table",
    "Task",
    "Tool",
    "ToolEdge",
    "Trajectory",
    "Verdict",
    "VerifierSpec",
    "offered_tools",
]
