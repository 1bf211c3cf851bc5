"""Built-in executable environments, one module per domain."""

from envs.base import Domain, Environment, ToolError, ToolSpec, diff_states, observation, parse_call, tool
from envs.registry import DOMAINS, get_domain

__all__ = [
    "DOMAINS", "Domain", "Environment", "ToolError", "ToolSpec", "diff_states", "get_domain", "observation",
    "parse_call", "tool",
]
