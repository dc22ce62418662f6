"""Compiling a ``GrammarSpec`` against one tokenizer's vocabulary, with compiled grammars cached."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from transformers import PreTrainedTokenizerBase

from minisgl.constrained.backend import error_message, xgrammar
from minisgl.constrained.matcher import GrammarMatcher
from minisgl.constrained.spec import GrammarSpec

if TYPE_CHECKING:
    import xgrammar as xgr

# Compiled grammars kept per compiler (a JSON schema's is typically tens of KiB).
MAX_CACHED_GRAMMARS = 256


class GrammarCompiler:
    """One per tokenizer (the compiled masks are per vocabulary). Compiled grammars are cached by
    their spec, least recently used dropped first, so requests that repeat a schema compile it once."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, stop_token_ids: list[int], max_threads: int = 2
    ) -> None:
        self.tokenizer, self.vocab_size, self.stop_token_ids = tokenizer, vocab_size, sorted(stop_token_ids)
        self.max_threads = max_threads
        self._compiler: xgr.GrammarCompiler | None = None  # built on the first grammar
        self._cache: OrderedDict[GrammarSpec, xgr.CompiledGrammar] = OrderedDict()
        self.hits = self.misses = 0

    def matcher(self, spec: GrammarSpec) -> GrammarMatcher:
        """A fresh matcher for one request; ``ValueError`` naming the problem if the spec does not compile."""
        return GrammarMatcher(self.compile(spec))

    def compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        compiled = self._cache.get(spec)
        if compiled is not None:
            self.hits += 1
            self._cache.move_to_end(spec)
            return compiled
        self.misses += 1
        compiled = self._compile(spec)
        self._cache[spec] = compiled
        if len(self._cache) > MAX_CACHED_GRAMMARS:
            self._cache.popitem(last=False)
        return compiled

    def _compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        compiler = self._xgr_compiler()
        try:
            if spec.kind == "json_schema":
                # Fixed separators instead of any whitespace: a small model given the choice pads
                # with newlines, and fixed text is what jump-forward appends without sampling.
                schema = json.dumps(_parse_schema(spec.source))
                return compiler.compile_json_schema(schema, any_whitespace=False)
            if spec.kind == "regex":
                return compiler.compile_regex(spec.source)
            return compiler.compile_grammar(spec.source)
        except RuntimeError as e:  # xgrammar reports every bad grammar this way
            raise ValueError(f"invalid {spec.kind}: {error_message(e)}") from None

    def _xgr_compiler(self) -> xgr.GrammarCompiler:
        if self._compiler is None:
            xgr = xgrammar()
            info = xgr.TokenizerInfo.from_huggingface(
                self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
            )
            self._compiler = xgr.GrammarCompiler(info, max_threads=self.max_threads, cache_enabled=False)
        return self._compiler


def _parse_schema(source: str) -> dict[str, Any] | bool:
    """The schema checked for being JSON and a schema-shaped value before xgrammar sees it."""
    try:
        schema = json.loads(source)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid json_schema: not valid JSON ({e})") from None
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"invalid json_schema: a schema is a JSON object, got {type(schema).__name__}")  # noqa: TRY004 (bad input is a ValueError)
    where = _unsupported_feature(schema, "$")
    if where is not None:
        raise ValueError(f"unsupported json_schema feature: {where}")
    return schema


# Keywords xgrammar would silently ignore, so the output could break them: refused instead.
_UNSUPPORTED = ("not", "if", "then", "else", "dependentSchemas", "dependentRequired", "contains", "uniqueItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMAS = ("items", "additionalProperties", "propertyNames")


def _unsupported_feature(schema: object, path: str) -> str | None:
    """Path and keyword of the first construct the grammar cannot enforce, or None."""
    if not isinstance(schema, dict):
        return None
    for key in _UNSUPPORTED:
        if key in schema and not (key == "uniqueItems" and schema[key] is False):
            return f"{path}.{key}"
    ref = schema.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        return f"{path}.$ref (only local references like #/$defs/name are supported, got {ref!r})"
    children: list[tuple[str, object]] = []
    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            children += [(f"{path}.{key}.{name}", sub) for name, sub in schema[key].items()]
    for key in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            children += [(f"{path}.{key}[{i}]", sub) for i, sub in enumerate(schema[key])]
    for key in _SUBSCHEMAS:
        sub = schema.get(key)
        subs = enumerate(sub) if isinstance(sub, list) else [(None, sub)]
        children += [(f"{path}.{key}" + ("" if i is None else f"[{i}]"), s) for i, s in subs]
    for child_path, child in children:
        found = _unsupported_feature(child, child_path)
        if found is not None:
            return found
    return None
