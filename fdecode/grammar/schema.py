"""A JSON schema as a regex, through outlines-core (docs/design.md, "Structured output").

`outlines_core.json_schema.build_regex_from_schema(json_text, whitespace_pattern)` writes the regex of
every JSON document the schema admits, properties in the schema's order (so the text is kept in that
order, never key-sorted). A dict and the string of the same JSON are one schema: both become the same
compact JSON text, which is also the grammar's cache key.
"""

from __future__ import annotations

import json

from fdecode.grammar.automaton import import_outlines
from fdecode.grammar.syntax import excerpt


def schema_text(schema: str | dict) -> str:
    """`schema` as compact JSON text in its own key order; ValueError naming it if it is no JSON object."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"JSON schema {excerpt(schema)} is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"JSON schema {excerpt(repr(schema))}: a schema is a JSON object (a dict)")
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


def schema_regex(text: str, *, whitespace_pattern: str | None = None) -> str:
    """The regex of the documents the schema `text` (from `schema_text`) admits; ValueError naming it
    where outlines-core does not support the schema."""
    build_regex_from_schema = import_outlines().json_schema.build_regex_from_schema
    try:
        return build_regex_from_schema(text, whitespace_pattern)
    except (ValueError, TypeError, RuntimeError) as e:
        raise ValueError(f"JSON schema {excerpt(text)} is not supported: {e}") from None
