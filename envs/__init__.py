"""Executable environments: the built-in domains (one module each), REST domains generated from OpenAPI
descriptions, and the sandboxed ones of users' plugins and MCP servers."""

from envs.base import (
    BaseEnvironment,
    Domain,
    Environment,
    ToolEnvironment,
    ToolError,
    ToolSpec,
    diff_states,
    observation,
    parse_call,
    tool,
)
from envs.openapi import OpenAPIDomainError, OpenAPIReport, domain_from_tools
from envs.registry import DOMAINS, get_domain

__all__ = [
    "DOMAINS", "BaseEnvironment", "Domain", "Environment", "OpenAPIDomainError", "OpenAPIReport", "ToolEnvironment", "ToolError", "ToolSpec",
    "diff_states", "domain_from_tools", "get_domain", "observation", "parse_call", "tool",
]
