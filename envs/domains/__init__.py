"""The built-in domains, one module each: a ``Domain`` subclass with its tables, seeded generator and ``@tool`` methods.

These are this repository's own, trusted code, run in-process; ``envs.registry.DOMAINS`` lists them by name. The
modules beside this package in ``envs/`` are the source adapters (OpenAPI, plugins, Python objects, MCP servers,
model-played tools), which present other sources behind the same ``ToolEnvironment`` surface.
"""
