"""Compiling a ``GrammarSpec`` against one tokenizer's vocabulary, off the caller's thread: a grammar
can take seconds to compile (xgrammar releases the GIL while it does), and the scheduler loop must
go on meanwhile. Compiles are bounded in time and cached by source."""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from transformers import PreTrainedTokenizerBase

from minisgl.constrained.backend import error_message, xgrammar
from minisgl.constrained.matcher import GrammarMatcher
from minisgl.constrained.spec import GrammarSpec
from minisgl.priority import lower_thread_priority

if TYPE_CHECKING:
    import xgrammar as xgr

# A request waits at most this long for its grammar, counted from its submission. xgrammar cannot
# interrupt a compile: one still running then finishes in the background (and is cached, so the
# same grammar sent again is ready at once).
COMPILE_TIMEOUT_S = 30.0
# Grammars compiled at once, each on one thread: while the engine decodes, its forward passes keep
# every core of a small machine busy, and xgrammar's second thread made a compile only ~1.3x faster.
COMPILE_WORKERS = 2
COMPILE_THREADS = 1
# Added to the niceness of the compile threads (Linux keeps it per thread, and xgrammar's threads
# inherit it): beside two busy decoding threads a compile then gets about a quarter of a core (CFS
# weight 335 against 1024 each) and the forward passes the rest. +10 (a tenth of a core) would make
# a 3 s grammar miss its time limit on a busy 2-core machine.
COMPILE_NICENESS = 5
# Compiled grammars kept per compiler, by number and by size (a JSON schema's is typically tens of
# KiB; an enum of 20,000 strings against a 49k-token vocabulary, 64 MB).
MAX_CACHED_GRAMMARS = 256
MAX_CACHED_GRAMMAR_BYTES = 512 << 20


def compile_timeout_message(timeout_s: float) -> str:
    return f"the grammar did not compile within the limit of {timeout_s:g} s"


@dataclass(eq=False)
class _Compile:
    """One source's compile, shared by every request that asks for it."""

    future: Future[xgr.CompiledGrammar]
    waiters: int = 0  # requests waiting for it: one nobody waits for is dropped if not started yet

    @property
    def size(self) -> int:
        """Bytes of the compiled grammar (0 until compiled, or if it failed)."""
        if not self.future.done() or self.future.cancelled() or self.future.exception() is not None:
            return 0
        return int(self.future.result().memory_size_bytes)


class PendingGrammar:
    """One request's grammar while it compiles: ``done`` once compiled, failed, or out of time."""

    def __init__(self, compiler: GrammarCompiler, spec: GrammarSpec, job: _Compile) -> None:
        self._compiler, self.spec, self._job = compiler, spec, job
        self._deadline = time.monotonic() + compiler.compile_timeout_s
        self._released = False
        job.waiters += 1

    @property
    def future(self) -> Future[xgr.CompiledGrammar]:
        """To wait on several at once (``concurrent.futures.wait``)."""
        return self._job.future

    def done(self) -> bool:
        return self._job.future.done() or time.monotonic() >= self._deadline

    def matcher(self, block: bool = False) -> GrammarMatcher:
        """A fresh matcher for the request, once ``done`` (or after waiting, if ``block``); ``ValueError``
        naming the problem, or the time limit. Called once."""
        return GrammarMatcher(self.compiled(block))

    def compiled(self, block: bool = False) -> xgr.CompiledGrammar:
        timeout = max(0.0, self._deadline - time.monotonic()) if block else 0.0
        try:
            return self._job.future.result(timeout=timeout)
        except FutureTimeout:
            raise ValueError(compile_timeout_message(self._compiler.compile_timeout_s)) from None
        except ValueError as e:  # a fresh one: re-raising the cached exception would grow its traceback
            raise ValueError(str(e)) from None
        except Exception as e:  # noqa: BLE001 - whatever broke, it is this grammar's
            raise ValueError(f"the grammar failed to compile: {type(e).__name__}: {e}") from None
        finally:
            self.release()

    def release(self) -> None:
        """The request no longer waits (it has its matcher, failed, or was aborted). Idempotent."""
        if not self._released:
            self._released = True
            self._compiler._release(self.spec, self._job)


class GrammarCompiler:
    """One per tokenizer (the compiled masks are per vocabulary). ``submit`` starts a compile on a
    thread pool; compiles are cached by their spec, least recently used dropped first, so requests
    that repeat a schema compile it once (also when they arrive while it compiles). Not thread-safe:
    one thread (the scheduler loop) calls it; only the compiles run elsewhere."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        vocab_size: int,
        stop_token_ids: list[int],
        max_threads: int = COMPILE_THREADS,
        compile_timeout_s: float = COMPILE_TIMEOUT_S,
    ) -> None:
        self.tokenizer, self.vocab_size, self.stop_token_ids = tokenizer, vocab_size, sorted(stop_token_ids)
        self.max_threads, self.compile_timeout_s = max_threads, compile_timeout_s
        self._compiler: xgr.GrammarCompiler | None = None  # see ``prepare``
        self._pool = ThreadPoolExecutor(
            COMPILE_WORKERS, "minisgl-grammar-compile", initializer=partial(lower_thread_priority, COMPILE_NICENESS)
        )
        self._cache: OrderedDict[GrammarSpec, _Compile] = OrderedDict()
        self.hits = self.misses = 0

    def submit(self, spec: GrammarSpec) -> PendingGrammar:
        """Start compiling ``spec`` for one request, or find it compiled or compiling. The cheap checks
        (a schema's JSON, its unsupported features) run now and raise ``ValueError`` naming the problem."""
        job = self._cache.get(spec)
        if job is not None:
            self.hits += 1
            self._cache.move_to_end(spec)
            return PendingGrammar(self, spec, job)
        self.misses += 1
        source = json.dumps(_parse_schema(spec.source)) if spec.kind == "json_schema" else spec.source
        self.prepare()
        job = _Compile(self._pool.submit(self._compile, spec.kind, source))
        self._cache[spec] = job
        self._evict()
        return PendingGrammar(self, spec, job)

    def prepare(self) -> None:
        """Import xgrammar and read the vocabulary (about 0.4 s for 49k tokens), on the caller's thread;
        the first ``submit`` does it otherwise. It is Python work, which holds the GIL: on a thread of
        its own it made the scheduler loop win the GIL back after each of its torch calls (5 ms each,
        Python's switch interval) and stretched a forward pass to seconds. Only the compiles, which
        are xgrammar's C++ and release the GIL, run on the pool."""
        if self._compiler is None:
            xgr = xgrammar()
            info = xgr.TokenizerInfo.from_huggingface(
                self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
            )
            self._compiler = xgr.GrammarCompiler(info, max_threads=self.max_threads, cache_enabled=False)

    def matcher(self, spec: GrammarSpec) -> GrammarMatcher:
        """A fresh matcher, waiting for the compile; ``ValueError`` naming the problem."""
        return self.submit(spec).matcher(block=True)

    def compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        """The compiled grammar, waiting for it; ``ValueError`` naming the problem."""
        return self.submit(spec).compiled(block=True)

    def shutdown(self) -> None:
        """Drop compiles not started; one running finishes in the background (xgrammar cannot stop it)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _release(self, spec: GrammarSpec, job: _Compile) -> None:
        job.waiters -= 1
        if job.waiters == 0 and job.future.cancel() and self._cache.get(spec) is job:
            del self._cache[spec]

    def _evict(self) -> None:
        """Least recently used first while over either bound; compiles in flight stay."""
        size = sum(job.size for job in self._cache.values())
        for spec, job in list(self._cache.items()):
            if len(self._cache) <= MAX_CACHED_GRAMMARS and size <= MAX_CACHED_GRAMMAR_BYTES:
                break
            if job.future.done():
                size -= job.size
                del self._cache[spec]

    def _compile(self, kind: str, source: str) -> xgr.CompiledGrammar:
        """On a compile thread."""
        compiler = self._compiler
        assert compiler is not None, "submit prepares it first"
        try:
            if kind == "json_schema":
                # Fixed separators instead of any whitespace: a small model given the choice pads
                # with newlines, and fixed text is what jump-forward appends without sampling.
                return compiler.compile_json_schema(source, any_whitespace=False)
            if kind == "regex":
                return compiler.compile_regex(source)
            return compiler.compile_grammar(source)
        except RuntimeError as e:  # xgrammar reports every bad grammar this way
            raise ValueError(f"invalid {kind}: {error_message(e)}") from None


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
