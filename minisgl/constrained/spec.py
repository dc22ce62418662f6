"""What a request asks its output to match, in a form that travels between processes (plain strings)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

GrammarKind = Literal["json_schema", "regex", "ebnf"]

# OpenAI's ``{"type": "json_object"}`` as a schema: any JSON object. Schemas compile strictly (undeclared
# properties forbidden unless allowed), so they are allowed explicitly.
JSON_OBJECT_SCHEMA = '{"type": "object", "additionalProperties": true}'

# A grammar's source (a schema's JSON text, a regex, an EBNF grammar), in UTF-8 bytes. Compile time and
# memory grow with it (an enum of 20,000 strings, 0.4 MB, compiles in about 3 s to 64 MB of masks).
MAX_GRAMMAR_BYTES = 512 * 1024


@dataclass(frozen=True)
class GrammarSpec:
    kind: GrammarKind
    source: str  # the schema as JSON text, the regex, or the EBNF grammar

    @classmethod
    def from_fields(cls, json_schema: str | None, regex: str | None, ebnf: str | None) -> GrammarSpec | None:
        """The one grammar given by SGLang's ``sampling_params`` fields; ``ValueError`` if several are set."""
        given = [(k, v) for k, v in (("json_schema", json_schema), ("regex", regex), ("ebnf", ebnf)) if v is not None]
        if len(given) > 1:
            raise ValueError(f"at most one of json_schema, regex and ebnf may be set, got {[k for k, _ in given]}")
        if not given:
            return None
        kind, source = given[0]
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"{kind} must be a non-empty string, got {source!r}")
        size = len(source.encode(errors="surrogatepass"))  # JSON text may carry lone surrogates
        if size > MAX_GRAMMAR_BYTES:
            raise ValueError(f"{kind} is {size} bytes, over the limit of {MAX_GRAMMAR_BYTES} bytes for a grammar")
        return cls(kind, source)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ThinkTags:
    """A thinking model's ``<think>`` and ``</think>`` tokens: its reasoning lies between them, and a grammar
    holds only after them (``GrammarAfterThought``)."""

    open_id: int
    close_id: int

    def opened_by(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the prompt leaves a reasoning block open: its last tag is ``<think>``."""
        for token in reversed(prompt_ids):
            if token == self.close_id:
                return False
            if token == self.open_id:
                return True
        return False


def schema_text(schema: str | dict[str, Any]) -> str:
    """A JSON schema as text (keys keep their order: it is the order properties are generated in)."""
    if isinstance(schema, str):
        return schema
    if isinstance(schema, dict):
        return json.dumps(schema)
    raise ValueError(f"json_schema must be a JSON object or its text, got {type(schema).__name__}")
