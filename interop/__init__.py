"""synthloop's environments and verifiers for the field's own agents and trainers.

``episode`` is the one unit (a stored task played on a private copy of its initial state, judged by its own
verifier out of the agent's reach); the adapters serve it over MCP, to TRL's ``environment_factory``, as an
OpenEnv environment and as verl rows.
"""

from interop.episode import ASK_USER, Episode, Judgement, TaskLibrary, judge_messages

__all__ = ["ASK_USER", "Episode", "Judgement", "TaskLibrary", "judge_messages"]
