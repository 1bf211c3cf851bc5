"""Schema-driven values for seeded data: what a JSON schema (and a field's name) says a value looks like.

:func:`value_for` draws one value for a property from a ``random.Random``: ``example``/``examples`` first, then
``enum``, ``pattern`` (sampled from the regular expression), ``format`` (date-time, date, email, uri, uuid,
ipv4...), then what the field's name says it holds (``friendly_name``, ``email``, ``phone``, ``city``,
``date_created``), then the type with its ``minimum``/``maximum`` and length bounds. The same rng state gives
the same value, so a seeded generator gives the same database.
"""

from __future__ import annotations

import random
import re
import string
from typing import Any

try:  # Python 3.11+: the regular-expression parser the re module itself uses
    import re._constants as _sre_constants  # type: ignore[import-not-found]
    import re._parser as _sre_parse  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - older interpreters
    import sre_constants as _sre_constants  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

FIRST = ("Ana", "Ben", "Chloe", "Dev", "Eva", "Farid", "Gita", "Hugo", "Iris", "Jon", "Kemi", "Luca", "Mei", "Noor")
LAST = ("Silva", "Berg", "Moreau", "Patel", "Okafor", "Tanaka", "Novak", "Reyes", "Olsen", "Kaur")
CITIES = ("Lisbon", "Oslo", "Austin", "Osaka", "Nairobi", "Lima", "Perth", "Ghent")
PET_NAMES = ("Milo", "Luna", "Bella", "Rex", "Nala", "Otis", "Pepper", "Ziggy", "Maple", "Biscuit")
WORDS = ("support", "billing", "onboarding", "feedback", "sales", "alerts", "welcome", "orders", "returns",
         "shipping", "team", "project")
TAGS = ("dog", "cat", "bird", "fish", "rabbit")
BODIES = ("Hello, how can I help?", "Thanks for reaching out.", "Your order has shipped.",
          "See you tomorrow at 10.", "Could you send the invoice?", "All set, thank you!")
# Places and codes, so that a country is a country: (ISO 3166 code, name), with a city and a street of each.
COUNTRIES = (("US", "United States"), ("GB", "United Kingdom"), ("DE", "Germany"), ("FR", "France"),
             ("JP", "Japan"), ("BR", "Brazil"), ("IN", "India"), ("NG", "Nigeria"), ("CA", "Canada"),
             ("AU", "Australia"), ("ES", "Spain"), ("NO", "Norway"), ("PT", "Portugal"), ("KE", "Kenya"))
REGIONS = ("CA", "NY", "TX", "WA", "Ontario", "Bavaria", "Lisboa", "Oslo")
STREETS = ("12 Harbour Road", "221 Baker Street", "5 Rua Augusta", "88 Market Street", "3 Elm Avenue",
           "17 King Street", "40 Mill Lane")
LANGUAGES = ("en", "en-US", "fr", "de", "es", "pt-BR", "ja")
CURRENCIES = ("USD", "EUR", "GBP", "JPY", "BRL", "INR")
TIMEZONES = ("America/New_York", "Europe/Lisbon", "Asia/Tokyo", "Africa/Nairobi", "Australia/Perth", "UTC")
COLOURS = ("red", "green", "blue", "yellow", "purple", "orange")
# Field names (normalised: lower case, letters and digits) a server keeps for itself: when a row was last
# changed and its revision. A write whose only effect is on these changed nothing a user asked for.
BOOKKEEPING = re.compile(r"(date|time)?(updated|modified|changed|lastmodified|lastupdated|edited)(at|on|date|time|"
                         r"timestamp|by)?|(date|time)(updated|modified|changed)|lastmodified\w*|etag|version|"
                         r"revision|rev|lockversion|updatecount|modcount|modifiedby|updatedby|lastupdatedby")
BASE_URL = "https://api.example.com"
# A repetition without an upper bound (``+``, ``*``) is drawn up to this many extra times.
OPEN_REPEAT = 4


def schema_type(schema: dict[str, Any]) -> str | None:
    """The non-null JSON type a schema names (first of a list), or None when it names none."""
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    return t if isinstance(t, str) else None


def nullable(schema: dict[str, Any]) -> bool:
    t = schema.get("type")
    return schema.get("nullable") is True or (isinstance(t, list) and "null" in t) or t is None


# --- regular expressions -------------------------------------------------------------------------------------------

_CATEGORY_CHARS = {
    _sre_constants.CATEGORY_DIGIT: string.digits,
    _sre_constants.CATEGORY_WORD: string.ascii_letters + string.digits + "_",
    _sre_constants.CATEGORY_SPACE: " ",
    _sre_constants.CATEGORY_NOT_DIGIT: string.ascii_letters,
    _sre_constants.CATEGORY_NOT_WORD: "-.",
    _sre_constants.CATEGORY_NOT_SPACE: string.ascii_letters + string.digits,
}
_PRINTABLE = string.ascii_letters + string.digits + "-_."


def _charset(items: list[tuple[Any, Any]]) -> str:
    chars, negate = [], False
    for op, av in items:
        if op is _sre_constants.NEGATE:
            negate = True
        elif op is _sre_constants.LITERAL:
            chars.append(chr(av))
        elif op is _sre_constants.RANGE:
            chars.extend(chr(c) for c in range(av[0], av[1] + 1))
        elif op is _sre_constants.CATEGORY:
            chars.extend(_CATEGORY_CHARS.get(av, _PRINTABLE))
    if negate:
        return "".join(c for c in _PRINTABLE if c not in chars) or "x"
    # [0-9a-fA-F] means "either case is accepted", not "mix them": real ids are written in one case
    if any(c.isupper() for c in chars) and all(c.lower() in chars for c in chars if c.isupper()):
        chars = [c for c in chars if not c.isupper()]
    return "".join(dict.fromkeys(chars)) or "x"


def _emit(parsed: Any, rng: random.Random, groups: dict[int, str]) -> str:
    out = []
    for op, av in parsed:
        if op is _sre_constants.LITERAL:
            out.append(chr(av))
        elif op is _sre_constants.NOT_LITERAL:
            out.append(rng.choice([c for c in _PRINTABLE if c != chr(av)]))
        elif op is _sre_constants.ANY:
            out.append(rng.choice(string.ascii_letters + string.digits))
        elif op is _sre_constants.IN:
            out.append(rng.choice(_charset(av)))
        elif op in (_sre_constants.MAX_REPEAT, _sre_constants.MIN_REPEAT):
            low, high, sub = av
            high = low + OPEN_REPEAT if high is _sre_constants.MAXREPEAT else high
            out.extend(_emit(sub, rng, groups) for _ in range(rng.randint(low, max(low, high))))
        elif op is _sre_constants.SUBPATTERN:
            group, sub = av[0], av[-1]
            text = _emit(sub, rng, groups)
            if group is not None:
                groups[group] = text
            out.append(text)
        elif op is _sre_constants.BRANCH:
            out.append(_emit(rng.choice(av[1]), rng, groups))
        elif op is _sre_constants.GROUPREF:
            out.append(groups.get(av, ""))
        # AT (anchors), ASSERT and ASSERT_NOT add no characters
    return "".join(out)


def sample_pattern(pattern: str, rng: random.Random) -> str:
    """A string matching ``pattern`` (the common subset: literals, classes, repeats, groups, alternation).

    Raises:
        ValueError: The pattern does not parse, or the drawn string does not match it (lookarounds, say).
    """
    try:
        parsed = _sre_parse.parse(pattern)
    except re.error as exc:
        raise ValueError(f"pattern {pattern!r} does not parse: {exc}") from None
    for _ in range(8):
        text = _emit(parsed, rng, {})
        if re.search(pattern, text):
            return text
    raise ValueError(f"could not draw a string matching {pattern!r}")


# --- values ------------------------------------------------------------------------------------------------------


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def bookkeeping(name: str, schema: dict[str, Any] | None = None) -> bool:
    """Whether a field is one a server keeps for itself (``date_updated``, ``updatedAt``, ``etag``, ``version``),
    decided from its name, or a read-only date-time whose name says it changes (``modified_time``)."""
    n = _norm(name)
    if BOOKKEEPING.fullmatch(n):
        return True
    schema = schema if isinstance(schema, dict) else {}
    return bool(schema.get("readOnly")) and schema.get("format") == "date-time" and \
        any(w in n for w in ("updated", "modified", "changed"))


_PERSON_FIELDS = ("name", "fullname", "author", "owner", "contact", "customer", "person", "assignee", "sender",
                  "recipient", "username", "identity", "firstname", "lastname", "givenname", "surname",
                  "familyname", "displayname", "nickname", "user", "member", "attendee", "manager")


def implausible(name: str, value: Any, schema: dict[str, Any] | None = None) -> str | None:
    """Why ``value`` is not what a field named ``name`` holds (an email without ``@``, a country named after a
    person), or None where nothing says it is wrong. Judged from the schema's ``format`` and the field's name."""
    if not isinstance(value, str) or not value:
        return None
    schema = schema if isinstance(schema, dict) else {}
    if schema.get("enum") and value in schema["enum"]:
        return None
    n, fmt = _norm(name), schema.get("format")
    if fmt in ("email", "idn-email") or n in ("email", "emailaddress") or n.endswith("email"):
        return None if re.fullmatch(r"[^@\s]+@[^@\s]+\.[A-Za-z]{2,}", value) else "not an email address"
    if fmt in ("uri", "url", "iri") or n.endswith(("url", "uri")):
        return None if re.match(r"[a-z][a-z0-9+.-]*:", value) else "not a URL"
    if fmt == "date-time" or fmt == "date":
        return None if re.match(r"\d{4}-\d{2}-\d{2}", value) else f"not a {fmt}"
    if fmt == "uuid":
        return None if re.fullmatch(r"[0-9a-fA-F-]{36}", value) else "not a UUID"
    if "country" in n:
        codes = {c for c, _ in COUNTRIES}
        names = {c.lower() for _, c in COUNTRIES}
        ok = re.fullmatch(r"[A-Z]{2,3}", value) or value.lower() in names or value.upper() in codes
        return None if ok else "not a country"
    if "currency" in n:
        return None if re.fullmatch(r"[A-Za-z]{3}", value) else "not a currency code"
    people = {f"{a} {b}" for a in FIRST for b in LAST}
    if value in people and not any(w in n for w in _PERSON_FIELDS):
        return "a person's name in a field that holds no person"
    return None


def timestamp(rng: random.Random, *, year: int = 2025) -> str:
    return (f"{year}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z")


def _by_format(fmt: str, rng: random.Random, name: str) -> Any:
    if fmt == "date-time":
        return timestamp(rng)
    if fmt == "date":
        return timestamp(rng)[:10]
    if fmt == "time":
        return timestamp(rng)[11:19]
    if fmt in ("email", "idn-email"):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        return f"{first.lower()}.{last.lower()}{rng.randint(1, 99)}@example.com"
    if fmt in ("uri", "url", "iri", "uri-reference"):
        return f"{BASE_URL}/{_norm(name) or 'item'}/{rng.randint(1, 9999)}"
    if fmt == "uuid":
        return (f"{rng.getrandbits(32):08x}-{rng.getrandbits(16):04x}-4{rng.getrandbits(12):03x}-"
                f"{0x8000 | rng.getrandbits(14):04x}-{rng.getrandbits(48):012x}")
    if fmt == "ipv4":
        return ".".join(str(rng.randint(1, 254)) for _ in range(4))
    if fmt == "ipv6":
        return ":".join(f"{rng.getrandbits(16):x}" for _ in range(8))
    if fmt in ("hostname", "idn-hostname"):
        return f"{rng.choice(WORDS)}.example.com"
    if fmt in ("phone-number", "phone"):
        return f"+1555{rng.randint(1000000, 9999999)}"
    return None


def _by_name(name: str, rng: random.Random, hint: str) -> str | None:
    n = _norm(name)
    if n == "name" and "pet" in hint.lower():
        return rng.choice(PET_NAMES)
    if n in ("email", "emailaddress") or n.endswith("email"):
        return _by_format("email", rng, name)
    if "phone" in n or n in ("from", "to", "address", "mobile"):
        return f"+1555{rng.randint(1000000, 9999999)}"
    if "country" in n:  # IsoCountry, country_code: the code; country: its name
        code, country = rng.choice(COUNTRIES)
        return code if "iso" in n or "code" in n else country
    if n in ("city", "town", "locality"):
        return rng.choice(CITIES)
    if n in ("region", "province", "stateprovince", "county"):
        return rng.choice(REGIONS)
    if n in ("street", "streetaddress", "address1", "addressline1", "line1", "street1"):
        return rng.choice(STREETS)
    if n in ("postalcode", "zip", "zipcode", "postcode"):
        return f"{rng.randint(10000, 99999)}"
    if n in ("language", "locale", "lang", "languagecode"):
        return rng.choice(LANGUAGES)
    if "currency" in n:
        return rng.choice(CURRENCIES)
    if n in ("timezone", "tz", "timezoneid"):
        return rng.choice(TIMEZONES)
    if n in ("color", "colour"):
        return rng.choice(COLOURS)
    if n.startswith("date") or n.endswith("date") or n.endswith("at") and n[:-2] in ("created", "updated"):
        return timestamp(rng)
    if n.endswith("url") or n.endswith("uri"):
        return _by_format("uri", rng, name)
    if n in ("friendlyname", "displayname", "title", "label", "uniquename"):
        return f"{rng.choice(WORDS)}-{rng.randint(1, 99)}" if n == "uniquename" else \
            f"{rng.choice(WORDS).capitalize()} {rng.choice(('desk', 'chat', 'channel', 'room', 'line'))}"
    if n in ("name", "fullname", "username", "author", "identity", "owner", "customername", "contactname",
             "personname"):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        return f"{first.lower()}.{last.lower()}" if n in ("username", "identity") else f"{first} {last}"
    if n in ("firstname", "givenname"):
        return rng.choice(FIRST)
    if n in ("lastname", "surname", "familyname"):
        return rng.choice(LAST)
    if n in ("tag", "category", "kind", "species"):
        return rng.choice(TAGS)
    if n in ("body", "message", "text", "content"):
        return rng.choice(BODIES)
    if n in ("attributes", "metadata"):
        return "{}"
    if n in ("description", "note", "notes", "comment"):
        return f"{rng.choice(WORDS).capitalize()} {rng.choice(('notes', 'request', 'update', 'question'))}"
    return None


def _bounded_number(schema: dict[str, Any], rng: random.Random, integer: bool) -> int | float:
    low = schema.get("minimum", schema.get("exclusiveMinimum", 0 if integer else 0.0))
    high = schema.get("maximum", schema.get("exclusiveMaximum", low + (100 if integer else 100.0)))
    if isinstance(schema.get("exclusiveMinimum"), (int, float)) and "minimum" not in schema:
        low = low + (1 if integer else 0.01)
    if isinstance(schema.get("exclusiveMaximum"), (int, float)) and "maximum" not in schema:
        high = high - (1 if integer else 0.01)
    high = max(low, high)
    if integer:
        value = rng.randint(int(low), int(high))
        step = schema.get("multipleOf")
        return value - value % int(step) if isinstance(step, int) and step > 0 and value - value % step >= low else value
    return round(rng.uniform(float(low), float(high)), 2)


def value_for(
    schema: dict[str, Any] | bool | None, name: str, rng: random.Random, *, hint: str = "", depth: int = 0
) -> Any:
    """One value for the property ``name`` with ``schema``, drawn from ``rng``.

    Args:
        schema: The property's JSON schema (``True``/``None`` for "anything").
        name: The property's name, which says what a free string holds (``email``, ``friendly_name``).
        rng: Seeded randomness.
        hint: What the value belongs to (a table name such as ``pets``), for plausible names.
        depth: Nesting depth; objects and arrays below depth 2 come out empty.
    """
    schema = schema if isinstance(schema, dict) else {}
    if "const" in schema:
        return schema["const"]
    examples = schema.get("examples")
    if isinstance(examples, list) and examples:
        return rng.choice(examples)
    if "example" in schema and schema["example"] is not None:
        return schema["example"]
    enum = [e for e in schema.get("enum") or () if e is not None]
    if enum:
        return rng.choice(enum)
    for key in ("oneOf", "anyOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return value_for(schema[key][0], name, rng, hint=hint, depth=depth)
    t = schema_type(schema)
    if t is None and "properties" in schema:
        t = "object"
    if t == "boolean":
        return rng.random() < 0.5
    if t == "integer":
        return _bounded_number(schema, rng, True)
    if t == "number":
        return _bounded_number(schema, rng, False)
    if t == "array":
        if depth >= 2:
            return []
        low = int(schema.get("minItems", 0))
        count = max(low, min(int(schema.get("maxItems", 2)), rng.randint(low, low + 2)))
        return [value_for(schema.get("items"), name.rstrip("s"), rng, hint=hint, depth=depth + 1) for _ in range(count)]
    if t == "object":
        if depth >= 2 or schema.get("format") == "uri-map":
            return {}
        required = set(schema.get("required") or ())
        return {k: value_for(v, k, rng, hint=hint, depth=depth + 1) for k, v in (schema.get("properties") or {}).items()
                if k in required or rng.random() < 0.7}
    if t is None:
        return None
    # strings
    if isinstance(schema.get("pattern"), str):
        try:
            return sample_pattern(schema["pattern"], rng)
        except ValueError:
            pass
    text = _by_format(schema.get("format", ""), rng, name) if schema.get("format") else None
    if text is None:
        text = _by_name(name, rng, hint)
    if text is None:
        text = f"{rng.choice(WORDS)}-{rng.randint(1, 999)}"
    low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
    if len(text) < low:
        text = text + "x" * (low - len(text))
    if isinstance(high, int) and len(text) > high:
        text = text[:high]
    return text
