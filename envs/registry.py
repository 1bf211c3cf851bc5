"""The built-in domains by name."""

from __future__ import annotations

from envs.banking import Banking
from envs.base import Domain
from envs.calendar import Calendar
from envs.files import Files
from envs.retail import Retail

DOMAINS: dict[str, type[Domain]] = {d.name: d for d in (Retail, Calendar, Banking, Files)}


def get_domain(name: str) -> type[Domain]:
    try:
        return DOMAINS[name]
    except KeyError:
        raise KeyError(f"unknown domain {name!r}; built-in domains: {', '.join(sorted(DOMAINS))}") from None
