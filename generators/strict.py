"""Config models that refuse what they do not know, and the names a user may give a run.

Every knob object of the project (synthesis, curation, training, the loop, endpoints, sampling) derives from
:class:`StrictModel`: a misspelt key is an error naming the nearest valid one, wherever the config comes from
(a ``--config`` file, the CLI, a Prefect flow parameter sent by the API or the UI form), because pydantic
runs the same validation in each case. Silently ignoring ``{"n_task": 30}`` would start the *default* run.
"""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, StringConstraints, ValidationError, model_validator
from pydantic_core import PydanticCustomError

# A run name becomes part of a run id, a folder name under the corpus and of Prefect artifact keys, which
# allow only lowercase letters, digits and dashes. Names outside this are refused, not rewritten: rewriting
# would merge distinct names (``a_b`` and ``a-b``, ``A`` and ``a``) into one run id, and a resumed run would
# then carry on another run's batches.
RUN_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,63}$"
RUN_NAME_RULE = "lowercase letters, digits and dashes, starting with a letter or digit, at most 64 characters"


def nearest(name: str, valid: list[str] | set[str]) -> str | None:
    """The valid name closest to ``name`` (a misspelling or a near miss), or None when none is close."""
    found = difflib.get_close_matches(name, sorted(valid), n=1, cutoff=0.6)
    return found[0] if found else None


def hint(key: str, valid: list[str] | set[str]) -> str:
    """What to say after "unknown key": the nearest valid name, else every valid one."""
    close = nearest(key, valid)
    return f"did you mean {close!r}?" if close else f"valid keys: {', '.join(sorted(valid))}"


class StrictModel(BaseModel):
    """A config object whose unknown keys are errors with a suggestion (``extra="forbid"`` also puts
    ``additionalProperties: false`` in the JSON schema, so the Prefect UI form refuses them too)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        valid = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
        unknown = [k for k in data if k not in valid]
        if unknown:
            key = str(unknown[0])
            # "message" last: pydantic fills the template one context key after another, so a brace in the
            # user's key must not meet a later key's placeholder
            raise PydanticCustomError("unknown_key", "{message}", {
                "key": key, "hint": hint(key, valid), "others": [str(k) for k in unknown[1:]],
                "message": f"unknown key {key!r}: {hint(key, valid)}"})
        return data


def check_run_name(name: Any) -> Any:
    """Refuse a run name Prefect and the corpus cannot take, with a name that would do (a ``mode="before"``
    field validator, so the message is this one and not the bare pattern)."""
    if isinstance(name, str) and not re.match(RUN_NAME_PATTERN, name):
        fixed = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", name.lower())).strip("-")[:64] or "run"
        # the message goes in the context, last (see StrictModel): a template would expand braces in the name
        raise PydanticCustomError("run_name", "{message}", {"name": name, "fixed": fixed, "message": (
            f"{name!r} is not allowed as a run name: use {RUN_NAME_RULE} (it names Prefect artifacts and corpus "
            f"folders), e.g. {fixed!r}")})
    return name


# The type of every ``run_name``: the pattern is in the JSON schema, so the Prefect UI form shows the rule;
# the before-validator gives the message a user can act on.
RunName = Annotated[str, StringConstraints(pattern=RUN_NAME_PATTERN), BeforeValidator(check_run_name)]
RUN_NAME_HELP = f"Allowed: {RUN_NAME_RULE}."


def describe(exc: ValidationError, source: str | None = None) -> list[str]:
    """One plain line per problem of a config, naming the key path; ``source`` (the config file) is named for
    unknown keys, which only a file can bring (the CLI refuses unknown options itself)."""
    where = f" in {source}" if source else ""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        ctx = err.get("ctx") or {}
        if err["type"] == "unknown_key":
            prefix = f"{loc}." if loc else ""
            lines.append(f"unknown key {prefix + ctx['key']!r}{where}: {ctx['hint']}")
            lines += [f"unknown key {prefix + k!r}{where}" for k in ctx.get("others", [])]
        elif err["type"] == "extra_forbidden":  # a model not derived from StrictModel still refuses the key
            lines.append(f"unknown key {loc!r}{where}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"invalid {loc}: {msg}" if loc else f"invalid configuration: {msg}")
    return lines
