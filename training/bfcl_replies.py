"""What an agent's reply to a BFCL item is, read from a chat message, and the interval an accuracy is reported
with: shared by the single-turn evaluation (``training.bfcl_eval``) and the multi-turn one
(``training.bfcl_multiturn``), which the single-turn one runs for multi-turn categories."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

# Extraction problems that are recoveries (the call was read), not unreadable calls.
_RECOVERED = ("(repaired)", "were given as a JSON string", "non-call item")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")


@dataclass
class Reply:
    """What an agent answered to one question: the calls it made (``{"name", "arguments"}``, names as the
    question spells them), and the calls it tried to make but that could not be read."""

    calls: list[dict[str, Any]]
    malformed: list[str] = field(default_factory=list)
    content: str = ""


def endpoint_tools(tools: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The tools with names OpenAI accepts (``^[A-Za-z0-9_-]{1,64}$``), and sent name → BFCL name."""
    out, back = [], {}
    for tool in tools:
        name = tool["function"]["name"]
        safe = _UNSAFE_NAME.sub("_", name)[:64]
        base, n = safe, 1
        while safe in back:  # "a.b" and "a_b" in one question stay two tools
            n += 1
            safe = f"{base[:60]}_{n}"
        back[safe] = name
        out.append({**tool, "function": {**tool["function"], "name": safe}})
    return out, back


def read_reply(message: dict[str, Any], names: dict[str, str]) -> Reply:
    from generators.extraction import extract_tool_calls

    extraction = extract_tool_calls(message)
    calls = [{"name": names.get(c.name, c.name), "arguments": c.arguments} for c in extraction.calls]
    malformed = [p for p in extraction.problems if not any(r in p for r in _RECOVERED)]
    return Reply(calls=calls, malformed=malformed, content=extraction.content)


def wilson(correct: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion (0, 0 for no items)."""
    if n == 0:
        return 0.0, 0.0
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
