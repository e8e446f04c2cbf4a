"""Grammar compiler: spec -> ``CompiledGrammar``, cached, bounded, off the caller's thread.

Both steps, the spec -> regex translation (whose regex checks can take seconds on a large
pattern) and the token-FSM build (outlines-core ``Index``), run in a worker *process* whose
address space is capped with ``RLIMIT_AS`` and which is killed once the compile (both steps
together) has run ``timeout_s``: some real schemas take minutes or tens of GB, and that must
cost one request a ``GrammarCompileError`` (or the ``ValueError`` naming what is wrong with it),
never the scheduler a step. A grammar whose token index would be too large
(grammar_size.py) is refused before it is built, with a ``GrammarTooLarge`` naming the cap: a
regex at once, a JSON schema with too many optional properties before its translation, any
other grammar as soon as its regex is written. Results and failures are cached by spec in an
LRU bounded in bytes (``cache_bytes``: the specs, the indexes and the mask rows they grew),
so a repeated spec costs a dict lookup and a server fed many large grammars stays bounded. A
timeout (``GrammarCompileTimeout``) is the machine's load as much as the grammar's, so it is
no verdict: it is remembered only for ``TIMEOUT_MEMORY_S`` (a client repeating a spec that timed
out gets the error at once, instead of holding a worker for the whole limit each time), then
compiled again. The translation's own bounds, whose refusals are cached, count work instead.

Programs that create a ``GrammarCompiler`` must guard their entry point with
``if __name__ == "__main__":`` (the spawn start method re-imports ``__main__``).
"""

from __future__ import annotations

import json
import logging
import queue
import re
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from typing import Any

from treadle.constrained.compile.compile_worker import WorkerProcess
from treadle.constrained.compile.disk_cache import GrammarDiskCache, vocabulary_fingerprint
from treadle.constrained.compile.grammar import CompiledGrammar, GrammarSpec
from treadle.constrained.index.grammar_size import regex_size, schema_size
from treadle.constrained.schema.members import MembersTooLarge, expand_members, has_members, members_safe
from treadle.constrained.index.index_markers import MEMBER_CHARS, check_regex, marked
from treadle.constrained.index.json_any import JsonAnyGrammar, JsonPushdown, json_any_root
from treadle.constrained.ebnf.ebnf import call_boundaries
from treadle.constrained.index.json_holes import WRITTEN, Holes, hole_tables, regex_has_holes, schema_allows_holes
from treadle.constrained.decode.json_keys import schema_has_free_keys
from treadle.constrained.regex.regex_text import validate_regex
from treadle.constrained.ebnf.structural_tag import structural_tag_bounds
from treadle.constrained.index.lazy_index import (DEFAULT_MAX_NFA_STATES, LazyIndex, LazyNFA, LazyTooLarge,
                                             LazyUnsupported, nfa_of, parse_regex)
from treadle.constrained.index.vocabulary import build_vocabulary, lazy_tokens

__all__ = ["GrammarCompiler", "GrammarCompileError", "GrammarCompileTimeout", "GrammarTooLarge",
           "build_compiled_grammar"]

log = logging.getLogger("treadle")

# An EBNF grammar's calls are used when at most this many tokens can cross their boundaries
# other than by only starting a call.
MAX_CROSSING = 4096
# A spawned worker imports only this module's light dependencies; this bounds that start.
_STARTUP_TIMEOUT_S = 120.0
# How often a compile in progress looks whether it was cancelled.
_CANCEL_POLL_S = 0.05
# How long a spec whose compile timed out answers with that timeout before it is tried again.
TIMEOUT_MEMORY_S = 300.0


class _Cancelled(Exception):
    """The compile's future was cancelled while a worker built it (GrammarCompiler.cancel)."""


class GrammarCompileError(ValueError):
    """A grammar could not be compiled (rejected, timed out, or out of memory)."""


class GrammarCompileTimeout(GrammarCompileError):
    """A compile ran past ``timeout_s``: the last-resort safety net, a wall-clock bound that
    depends on the machine's load, so it is no verdict on the grammar: it is remembered only for
    TIMEOUT_MEMORY_S, then the spec is compiled again (the translation's own bounds are counted in
    work, fsm_crawl.limit, and their refusals are cached)."""


class GrammarTooLarge(GrammarCompileError):
    """A grammar's token index would exceed ``max_grammar_size`` (grammar_size.py); refused
    before it was built."""


# The default bound of a grammar's estimated size (grammar_size.regex_size): what builds in about
# 30 s on a busy 2-core box ([a-z]{0,1000}, 26,000, took 4 s; real schemas of 30,000-85,000 took
# 10-45 s there, bench_schema_corpus.py); 4,000 alternatives zz<i>[a-z]{0,5} (543,000) took a minute.
MAX_GRAMMAR_SIZE = 150_000
# The lazy index's automaton states per unit of max_grammar_size: its cost is linear in them
# (about 21 bytes each in the scheduler, and their build), not in the width of its classes; the
# default cap, 3 million states, is about 63 MB (a string of maxLength 256 is ~10,000 states).
LAZY_STATES_PER_SIZE = 20
# A regex longer than this many characters per state of the cap is refused before it is parsed:
# the translator's regexes spell about one state per character or fewer (0.4 to 1.2 across
# the corpus's large schemas), and the parse alone of a 100-million-character one takes
# minutes and more memory than a compile worker has.
LAZY_CHARS_PER_STATE = 16
# Bytes an index holds in memory per byte of its pickle (outlines-core's hash maps); measured
# ~1.5-2 on SmolLM2's vocabulary, so the cache's count errs on the large side.
_INDEX_MEMORY_FACTOR = 2


# Characters of standard regex text per unit of max_grammar_size that ordered members
# (members.py) may spell out to for outlines-core's index; the text is then judged by its size.
MEMBERS_CHARS_PER_SIZE = 8


def standard_regex(regex: str, max_size: int | None, what: str = "the grammar") -> str:
    """``regex`` as standard text for every reader but the lazy index: its ordered-members nodes
    spelt out (members.py). ``GrammarTooLarge`` naming max_grammar_size when that text would
    pass ``MEMBERS_CHARS_PER_SIZE`` characters a unit of ``max_size`` (None: the default cap)."""
    if not has_members(regex):
        return regex
    limit = MAX_GRAMMAR_SIZE if max_size is None else max_size
    cap = MEMBERS_CHARS_PER_SIZE * limit
    try:
        return expand_members(regex, cap)
    except MembersTooLarge:
        raise GrammarTooLarge(
            f"{what} (a regex of {len(regex):,} chars) is too large to compile with outlines-core's index: its "
            f"objects' optional properties spelt out (~N^2) pass {cap:,} characters ({MEMBERS_CHARS_PER_SIZE} a "
            f"unit), so its size exceeds max_grammar_size {limit:,}; use the lazy grammar index, simplify the "
            "schema or raise max_grammar_size") from None


def _members_ok(spec: GrammarSpec | None) -> bool:
    """Whether ``spec``'s regex may hold ordered-members nodes (a JSON schema that does not
    name their code points, members.members_safe, judged on its decoded text as the
    translator judges it: a JSON escape cannot hide ``10FFF`` from one and not the other)."""
    if spec is None or spec.kind != "json_schema":
        return False
    try:
        return members_safe(json.dumps(json.loads(spec.value), ensure_ascii=False))
    except (ValueError, RecursionError):
        return False


def too_large(what: str, size: int, cap: int) -> GrammarTooLarge:
    return GrammarTooLarge(
        f"{what} is too large to compile: its estimated size {size:,} exceeds max_grammar_size {cap:,} "
        "(a regex's automaton positions, a character class weighted by its width, a repetition {m,n} "
        "by n; an object's optional properties, squared where they are spelt out); simplify the grammar or raise max_grammar_size")


def build_compiled_grammar(
    regex: str,
    tokenizer: Any,
    eos_token_ids: list[int],
    *,
    vocab_size: int,
    spec: GrammarSpec | None = None,
    pda: JsonPushdown | None = None,
) -> CompiledGrammar:
    """Compile ``regex`` in this process, with no time or memory bound.

    For tests and offline tools only: a serving path must use ``GrammarCompiler``. A JSON
    schema ``spec`` whose regex has hole placeholders (``spec.to_regex(holes=True)``) gets
    its holes, run on ``pda`` (built for the vocabulary when None).
    Raises ``GrammarCompileError`` when outlines-core rejects the regex.
    """
    from outlines_core import Index

    _check_reserved(regex, spec is not None and _holes_apply(spec), _members_ok(spec))
    vocab, table = build_vocabulary(tokenizer, list(eos_token_ids))
    t0 = time.perf_counter()
    nfa = lazy_nfa(regex, None)
    tokens = lazy_tokens(table, eos_token_ids)
    if nfa is not None and tokens.covers(nfa):
        index = LazyIndex(nfa, tokens)
    else:
        try:
            index = Index(marked(standard_regex(regex, None)), vocab)
        except GrammarTooLarge:
            raise
        except ValueError as e:
            raise GrammarCompileError(f"compile of regex of {len(regex)} chars was rejected: {e}") from e
    num_tokens = min(len(table), int(vocab_size))
    eos = tuple(int(e) for e in eos_token_ids)
    holes = _holes_of(spec, regex, index, table,
                      lambda: pda or JsonPushdown(table, num_tokens, int(vocab_size), eos))
    return CompiledGrammar(
        index=index,
        regex=regex,
        vocab_size=int(vocab_size),
        num_tokens=num_tokens,
        eos_token_ids=eos,
        token_bytes=table,
        spec=spec,
        compile_time_s=time.perf_counter() - t0,
        holes=holes,
    )


def _check_reserved(regex: str, holes: bool, members: bool = False) -> None:
    """``ValueError`` when ``regex`` names the reserved code points (index_markers.py); a
    regex with holes may hold their placeholders, one of a schema that ``_members_ok`` the
    ordered-members markers."""
    allowed = WRITTEN if holes else frozenset()
    check_regex(regex, allowed | MEMBER_CHARS if members else allowed)


def spec_regex(spec: GrammarSpec, whitespace_pattern: str | None, mode: str, holes: bool, depth: int,
               max_size: int | None = None) -> str:
    """The regex of ``spec`` as the token index gets it (the compile worker's first step);
    ``ValueError`` naming what is wrong with the grammar, ``GrammarTooLarge`` when the regex's
    estimated size passes ``max_size``."""
    regex = spec.to_regex(whitespace_pattern, mode, holes=holes, max_recursion_depth=depth)
    if spec.kind == "regex":
        validate_regex(spec.value)
    if max_size is not None:
        size = regex_size(regex)
        if size > max_size:
            raise too_large(f"the {spec.kind} grammar (a regex of {len(regex):,} chars)", size, max_size)
    _check_reserved(regex, holes)
    return regex


# Narrowing (a JSON schema's strict mode): when the exact automaton passes the cap, it is built
# again with each bounded repetition (maxItems, maxLength, a pattern's counts) limited to these
# shares of the cap, the largest that fits (lazy_index.build_nfa's ``narrow_to``).
NARROW_SHARES = (8, 64, 512)


def lazy_nfa(regex: str, max_size: int | None, what: str = "the grammar", narrow: bool = False) -> LazyNFA | None:
    """The byte NFA of the lazy token index (lazy_index.py) for ``regex``; None when that index
    does not read the regex (outlines-core's index is built instead). ``GrammarTooLarge`` when
    its automaton passes ``max_size`` (in ``LAZY_STATES_PER_SIZE`` states per unit of size).

    ``narrow``: before refusing, build it again with its bounded repetitions lowered until it
    fits (``NARROW_SHARES``): a subset of the regex's language, so every output still matches
    (the NFA's ``narrowed`` counts the repetitions lowered). For grammars that already promise
    a subset (a JSON schema's strict mode), never for a user's own regex."""
    cap = DEFAULT_MAX_NFA_STATES if max_size is None else LAZY_STATES_PER_SIZE * max_size
    if len(regex) > LAZY_CHARS_PER_STATE * cap and max_size is not None:
        raise GrammarTooLarge(
            f"{what} is too large to compile: its regex of {len(regex):,} chars passes the "
            f"{LAZY_CHARS_PER_STATE * cap:,} that max_grammar_size {max_size:,} allows ({LAZY_CHARS_PER_STATE} a state of its "
            f"{cap:,}-state automaton cap); simplify the grammar (fewer alternatives, fewer or smaller definitions) or "
            "raise max_grammar_size")
    try:
        ast = parse_regex(marked(regex))  # once: every try builds from it
        least = cap // NARROW_SHARES[-1]
        try:
            return nfa_of(ast, len(regex), cap, watch=least)
        except LazyTooLarge as e:
            if not narrow or not e.would_narrow:
                raise  # narrowing would have changed nothing before the cap: no try can fit
        # the narrowest try first: the automaton only grows with narrow_to (each share is at
        # least twice the next), so when that one passes the cap every other does, and the
        # grammar is refused after two builds instead of four
        narrowest = nfa_of(ast, len(regex), cap, least)
        for share in NARROW_SHARES[:-1]:
            try:
                return nfa_of(ast, len(regex), cap, cap // share)
            except LazyTooLarge:
                pass
        return narrowest
    except LazyTooLarge:
        limit = max_size if max_size is not None else cap // LAZY_STATES_PER_SIZE
        lowered = " even with its bounded repetitions lowered" if narrow else ""
        raise GrammarTooLarge(
            f"{what} (a regex of {len(regex):,} chars) is too large to compile: its byte automaton passes "
            f"{cap:,} states ({LAZY_STATES_PER_SIZE} a unit){lowered}, so its size exceeds max_grammar_size {limit:,}; "
            "simplify the grammar (fewer or shorter maxLength strings, smaller counted repetitions, fewer "
            "alternatives) or raise max_grammar_size") from None
    except LazyUnsupported:
        return None


def spec_automaton(spec: GrammarSpec, whitespace_pattern: str | None, mode: str, holes: bool, depth: int,
                   max_size: int | None = None, lazy: bool = True) -> tuple[str, LazyNFA | None]:
    """The compile worker's first step: the regex of ``spec`` and, when ``lazy`` and the lazy
    index reads it, its byte NFA (then nothing is left to build but the ``LazyIndex``). The size
    cap is judged on what will be built: the NFA's states, or outlines-core's estimate
    (grammar_size.py)."""
    members = _members_ok(spec)
    regex = spec.to_regex(whitespace_pattern, mode, holes=holes, max_recursion_depth=depth, members=members)
    _check_reserved(regex, holes, members)
    narrow = spec.kind in ("json_schema", "structural_tag") and mode == "strict"
    nfa = lazy_nfa(regex, max_size, f"the {spec.kind} grammar", narrow) if lazy else None
    if nfa is None and spec.kind == "regex":  # outlines-core's index: the regex as interegular reads it
        validate_regex(spec.value)
    if nfa is None:  # outlines-core's index: standard text (ordered members spelt out)
        regex = standard_regex(regex, max_size, f"the {spec.kind} grammar")
    if nfa is None and max_size is not None:
        size = regex_size(regex)
        if size > max_size:
            raise too_large(f"the {spec.kind} grammar (a regex of {len(regex):,} chars)", size, max_size)
    return regex, nfa


_COUNT = re.compile(r"\{[0-9]+(?:,[0-9]*)?\}")
_COUNTED_CHARS = 2_000


def precheck(spec: GrammarSpec, max_size: int) -> None:
    """``GrammarTooLarge`` when ``spec`` is too large to compile, judged before any work
    (milliseconds): a regex by its estimated size, a JSON schema by its optional properties
    (grammar_size.py). Other grammars are judged by their regex, in the worker."""
    if spec.kind == "regex":
        size = regex_size(spec.value)
        # a short regex whose size is its counted repetitions ('[^"]{1,5000}'): the worker judges it
        # on its lazy automaton's states (spec_automaton; a count builds in linear time, a
        # count past the state cap is refused at once), as a schema's maxLength is
        if size > max_size and not (len(spec.value) <= _COUNTED_CHARS and _COUNT.search(spec.value)):
            raise too_large(f"the regex ({len(spec.value):,} chars)", size, max_size)
    elif spec.kind == "json_schema":
        try:
            schema = json.loads(spec.value)
        except RecursionError as e:  # a ValueError (a 400), not an error of the caller's thread
            raise ValueError("json_schema nests too deeply to compile") from e
        members = members_safe(json.dumps(schema, ensure_ascii=False))
        size, where = schema_size(schema, members)
        if size > max_size:
            n = size if members else round(size ** 0.5)
            raise too_large(f"the json_schema (the object at {where}, {n:,} optional properties)", size, max_size)


def _holes_apply(spec: GrammarSpec) -> bool:
    """Whether a compact-output compile of ``spec`` writes holes or calls (json_holes.py):
    a schema's any-values and recursive ``$ref``s, an EBNF grammar's nesting recursion."""
    if spec.kind == "ebnf":
        return call_boundaries(spec.value) is not None
    return spec.kind in ("json_schema", "structural_tag") and schema_allows_holes(spec.value)


def _holes_of(spec: GrammarSpec | None, regex: str, index: Any, table: list, pda: Any) -> Holes | None:
    """The holes and calls of a regex, run on ``pda()``; None when it has none. A schema that
    may not have holes can still hold a placeholder character literally, hence the spec check."""
    if spec is None or not _holes_apply(spec) or not regex_has_holes(regex):
        return None
    if spec.kind == "ebnf":
        return Holes(pda(), index, len(table), call_boundaries(spec.value))
    if spec.kind == "structural_tag":
        return Holes(pda(), index, len(table), structural_tag_bounds(spec.value, regex))
    return Holes(pda(), index, len(table))


class _Worker:
    """One compile process plus the parent end of its pipe."""

    def __init__(self, ctx: Any, vocab: Any, memory_limit_bytes: int | None) -> None:
        self.proc = WorkerProcess(vocab, memory_limit_bytes)
        self.conn = self.proc
        self.ready = False
        self.broken = False

    def wait_ready(self) -> None:
        if self.ready:
            return
        if not self.conn.poll(_STARTUP_TIMEOUT_S):
            raise GrammarCompileError(f"grammar compile worker did not start within {_STARTUP_TIMEOUT_S:.0f}s")
        try:
            self.conn.recv()
        except EOFError as e:
            raise GrammarCompileError(
                f"grammar compile worker died at start (exit code {self.proc.exitcode}); "
                "memory_limit_bytes may be too small to load the vocabulary"
            ) from e
        self.ready = True

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)
        self.conn.close()


def _settle(fut: Future, result: Any = None, exc: BaseException | None = None) -> None:
    """Resolve ``fut`` unless another thread (e.g. ``close``) already did; first one wins."""
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)
    except InvalidStateError:
        pass  # already resolved concurrently; that outcome stands


def _shutdown_workers(workers: list[_Worker]) -> None:
    # a copy: a compile thread whose worker dies now removes it from the list (_retire)
    for w in list(workers):
        w.kill()


class GrammarCompiler:
    """Compiles and caches grammars for one tokenizer / model vocabulary.

    ``vocab_size`` is the model's logits width (may exceed len(tokenizer); the extra ids
    are never allowed). ``max_workers`` compile processes run at most that many builds at
    once, each for at most ``timeout_s`` (its regex and its index together) in at most
    ``memory_limit_bytes`` of address space; ``max_grammar_size`` bounds a grammar's estimated
    size (grammar_size.py) before it is built. The cache keeps at most ``cache_size`` specs
    and ``cache_bytes`` bytes (``cache_info``). ``whitespace_pattern`` and ``json_schema_mode`` ("strict": declared members only;
    "spec": all that JSON Schema admits) shape every JSON schema this compiler translates,
    and ``max_recursion_depth`` how deep recursion unrolls (schema ``$ref`` cycles, nesting
    EBNF rules), so they are fixed per compiler (the cache is keyed by spec alone). Thread-safe.
    """

    def __init__(
        self,
        tokenizer: Any,
        eos_token_ids: list[int],
        *,
        vocab_size: int,
        max_workers: int = 1,
        timeout_s: float = 60.0,
        memory_limit_bytes: int | None = 4 << 30,
        whitespace_pattern: str | None = None,
        cache_size: int = 4096,
        json_schema_mode: str = "strict",
        disk_cache_dir: str | None = None,
        max_recursion_depth: int = 3,
        cache_bytes: int = 1 << 30,
        max_grammar_size: int = MAX_GRAMMAR_SIZE,
        token_index: str = "lazy",
    ) -> None:
        if vocab_size <= 0 or max_workers < 1 or timeout_s <= 0 or cache_size < 1 or cache_bytes < 1 \
                or max_grammar_size < 1:
            raise ValueError(
                "need vocab_size > 0, max_workers >= 1, timeout_s > 0, cache_size >= 1, cache_bytes >= 1 and "
                f"max_grammar_size >= 1 (got {vocab_size}, {max_workers}, {timeout_s}, {cache_size}, "
                f"{cache_bytes}, {max_grammar_size})"
            )
        if token_index not in ("lazy", "outlines"):
            raise ValueError(f"token_index must be 'lazy' or 'outlines', got {token_index!r}")
        self._lazy = token_index == "lazy"
        if json_schema_mode not in ("strict", "spec"):
            raise ValueError(f"json_schema_mode must be 'strict' or 'spec', got {json_schema_mode!r}")
        if max_recursion_depth < 0:
            raise ValueError(f"max_recursion_depth must be >= 0, got {max_recursion_depth}")
        self._vocab, self._table = build_vocabulary(tokenizer, list(eos_token_ids))
        self._eos = tuple(int(e) for e in eos_token_ids)
        self._vocab_size = int(vocab_size)
        self._num_tokens = min(len(self._table), self._vocab_size)
        self._timeout_s = float(timeout_s)
        self._memory_limit = memory_limit_bytes
        self._whitespace_pattern = whitespace_pattern
        self._json_schema_mode = json_schema_mode
        self._max_recursion_depth = max_recursion_depth
        self._cache_size = cache_size
        self._cache_bytes = cache_bytes
        self._max_size = max_grammar_size
        self._index_bytes: dict[GrammarSpec, int] = {}  # the built index's pickle size, per cached spec
        # builds of a second or more also go to disk, for the next process (disk_cache.py)
        self._disk = GrammarDiskCache(disk_cache_dir, vocabulary_fingerprint(
            self._table, self._eos, self._vocab_size)) if disk_cache_dir else None
        self._cache: OrderedDict[GrammarSpec, Future[CompiledGrammar]] = OrderedDict()
        # specs whose compile timed out -> when that stops answering for them (TIMEOUT_MEMORY_S)
        self._timed_out: dict[GrammarSpec, float] = {}
        self._json_pda: JsonPushdown | None = None  # built at the first "any JSON" spec
        self._lock = threading.Lock()
        self._closed = False
        self._ctx = None  # workers are plain subprocesses (see compile_worker.py)
        self._workers: list[_Worker] = []  # every live worker, for shutdown
        self._idle: queue.Queue[_Worker] = queue.Queue()
        for _ in range(max_workers):
            self._idle.put(self._new_worker())
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="treadle-grammar")
        self._finalizer = weakref.finalize(self, _shutdown_workers, self._workers)

    # ------------------------------------------------------------------ public API

    def compile_async(self, spec: GrammarSpec) -> Future[CompiledGrammar]:
        """Start (or reuse) the compile of ``spec``; returns a future of the grammar.

        Never blocks on either step (see the module docstring): an invalid or unsupported
        grammar fails the future with a ``ValueError`` naming the problem. Futures are cached
        by spec, including failed ones (those that timed out, ``GrammarCompileTimeout``, for
        TIMEOUT_MEMORY_S only).
        """
        if not isinstance(spec, GrammarSpec):
            raise ValueError(f"compile needs a GrammarSpec, got {type(spec).__name__}")
        with self._lock:
            if self._closed:
                raise ValueError("GrammarCompiler is closed")
            fut = self._cache.get(spec)
            if fut is not None and spec in self._timed_out and time.monotonic() >= self._timed_out[spec]:
                del self._cache[spec], self._timed_out[spec]  # remembered long enough: compile again
                fut = None
            if fut is not None and not fut.cancelled():
                self._cache.move_to_end(spec)
                return fut
            fut = Future()
            self._cache[spec] = fut
            self._evict()
        try:
            precheck(spec, self._max_size)  # milliseconds: a grammar too large fails before any work
        except ValueError as e:
            _settle(fut, exc=e)
            return fut
        root = self._json_any_root(spec)
        if root is not None:  # "any JSON": the pushdown automaton, nothing to build
            _settle(fut, JsonAnyGrammar(self._pushdown(), root, spec=spec))
            return fut
        self._pool.submit(self._run, spec, fut)
        return fut

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Blocking ``compile_async(spec).result()``; raises ``ValueError`` on failure."""
        return self.compile_async(spec).result()

    def cancel(self, fut: Future[CompiledGrammar]) -> bool:
        """Give up a compile that no one waits for any more (its requests were aborted): the
        worker building it is stopped and replaced at once, instead of building on for up to
        ``timeout_s`` while every other new grammar queues for a worker; the spec leaves the
        cache, so asking for it again compiles it afresh. The caller must know that no other
        holder of ``fut`` (the cache hands one future to every asker of a spec) still needs
        it. False when the compile had already finished (its outcome stands)."""
        if not fut.cancel():
            return False
        with self._lock:
            for spec, f in self._cache.items():
                if f is fut:
                    del self._cache[spec]
                    self._index_bytes.pop(spec, None)
                    break
        return True

    def cache_info(self) -> dict:
        """What the cache holds: ``entries`` (specs, failed ones included), ``compiled`` (of
        them, grammars built), ``bytes`` (the estimate the cap is kept by: each spec's text, each
        index, the mask rows its matchers computed so far) and the caps ``cap_bytes`` and
        ``cap_entries``."""
        with self._lock:
            compiled = sum(1 for f in self._cache.values() if f.done() and not f.cancelled() and f.exception() is None)
            return {"entries": len(self._cache), "compiled": compiled, "bytes": self._total_bytes(),
                    "cap_bytes": self._cache_bytes, "cap_entries": self._cache_size}

    def close(self) -> None:
        """Stop the workers and fail compiles still pending. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = [f for f in self._cache.values() if not f.done()]
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._finalizer()
        for f in pending:
            _settle(f, exc=GrammarCompileError("GrammarCompiler was closed before the compile finished"))

    def __enter__(self) -> GrammarCompiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def token_bytes(self) -> list[bytes | None]:
        """The tokenizer's token bytes table (shared, read-only)."""
        return self._table

    # ------------------------------------------------------------------ internals

    def _entry_bytes(self, spec: GrammarSpec, fut: Future) -> int:
        """The cache's estimate of one entry: the spec's text, its index, its mask rows."""
        n = 2 * len(spec.value) + 200
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            g = fut.result()
            index = getattr(g, "index", None)
            if isinstance(index, LazyIndex):
                n += index.memory_bytes()  # it grows as its DFA is explored
            n += _INDEX_MEMORY_FACTOR * self._index_bytes.get(spec, 0)
            rows = getattr(g, "_rows", None)
            if rows:
                n += len(rows) * (4 * g.bitmask_words + 120)
            n += len(getattr(g, "regex", "") or "")
        return n

    def _total_bytes(self) -> int:
        return sum(self._entry_bytes(s, f) for s, f in self._cache.items())

    def _evict(self) -> None:
        """Drop least recently used entries until the cache is within both caps (the lock held).
        A grammar in use stays alive in its matchers; a later ask for its spec builds it again."""
        total = self._total_bytes()
        while self._cache and (total > self._cache_bytes or len(self._cache) > self._cache_size):
            spec, fut = self._cache.popitem(last=False)
            total -= self._entry_bytes(spec, fut)
            self._index_bytes.pop(spec, None)
            self._timed_out.pop(spec, None)

    def _json_any_root(self, spec: GrammarSpec) -> str | None:
        """The root kind when ``spec`` is a schema that asks only for JSON (json_any.py),
        and output is compact (a whitespace pattern goes through the regex backend)."""
        if spec.kind != "json_schema" or self._whitespace_pattern is not None or spec.reasoning:
            return None
        return json_any_root(json.loads(spec.value))

    def _holes(self, spec: GrammarSpec) -> bool:
        """Any-values of a schema become holes on the pushdown automaton (json_holes.py),
        for compact output (a whitespace pattern keeps the bounded regex). An EBNF grammar's
        nesting recursion becomes calls when at most ``MAX_CROSSING`` tokens of the
        vocabulary can cross a call's boundary other than by only starting it (those are
        decided in bulk; the others each take a walk in Python per mask row)."""
        if spec.kind == "ebnf":
            bounds = call_boundaries(spec.value)
            if bounds is None:
                return False
            tables = hole_tables(self._pushdown())
            crossing = tables.crossing(bounds)[0]
            walked = len(crossing) - int(tables.simple_entries(bounds)[1][list(crossing)].sum())
            return walked <= MAX_CROSSING
        return self._whitespace_pattern is None and _holes_apply(spec)

    def _pushdown(self) -> JsonPushdown:
        with self._lock:
            if self._json_pda is None:
                self._json_pda = JsonPushdown(self._table, self._num_tokens, self._vocab_size, self._eos)
            return self._json_pda

    def _new_worker(self) -> _Worker:
        w = _Worker(self._ctx, self._vocab, self._memory_limit)
        self._workers.append(w)
        return w

    def _retire(self, w: _Worker) -> None:
        """Kill a broken worker and start its replacement (unless closed)."""
        w.broken = True
        w.kill()
        with self._lock:
            if w in self._workers:
                self._workers.remove(w)
            if self._closed:
                return
            # listed under the lock that close() takes to mark itself closed: a close() racing
            # this either finds the replacement in the list or is seen here first
            new = self._new_worker()
        self._idle.put(new)

    def _run(self, spec: GrammarSpec, fut: Future[CompiledGrammar]) -> None:
        """A pool thread: the spec's regex, then its index (disk cache first), each in a worker,
        both within one ``timeout_s`` of work (time spent waiting for a worker not counted)."""
        budget = [self._timeout_s]
        index_bytes = 0
        try:
            holes = self._holes(spec)
            t0 = time.perf_counter()
            got = self._in_worker(fut, lambda w: self._regex_in(w, spec, holes, fut, budget))
            if got is None:
                return
            regex, nfa = got
            tokens = lazy_tokens(self._table, self._eos)
            if nfa is not None and tokens.covers(nfa):  # the lazy index: nothing more to build
                index = LazyIndex(nfa, tokens)
                _settle(fut, self._grammar(spec, regex, index, time.perf_counter() - t0))
                self._settled_grammar()
                return
            regex = standard_regex(regex, self._max_size, f"the {spec.kind} grammar")  # for outlines-core
            if self._disk is not None:
                hit = self._disk.load(regex)
                if hit is not None:
                    with self._lock:
                        self._index_bytes[spec] = self._disk.size(regex)
                    _settle(fut, self._grammar(spec, regex, *hit, from_disk=True))
                    self._settled_grammar()
                    return
            result = self._in_worker(fut, lambda w: self._compile_in(w, spec, regex, fut, budget))
        except _Cancelled:  # its worker was stopped and replaced (_in_worker)
            return
        except GrammarCompileTimeout as e:  # the machine's load as much as the grammar: remembered a while
            with self._lock:
                if self._cache.get(spec) is fut:
                    self._timed_out[spec] = time.monotonic() + TIMEOUT_MEMORY_S
            _settle(fut, exc=e)
            return
        except ValueError as e:  # the grammar's fault (GrammarCompileError included): cached
            _settle(fut, exc=e)
            return
        except BaseException as e:  # not the grammar's fault: not cached
            log.exception("compiling a %s grammar failed", spec.kind)
            with self._lock:
                if self._cache.get(spec) is fut:
                    del self._cache[spec]
            _settle(fut, exc=GrammarCompileError(f"internal error compiling the grammar: {type(e).__name__}: {e}"))
            return
        if result is None:
            return
        grammar, index_bytes = result
        if self._disk is not None:
            self._disk.store(regex, grammar.index, grammar.compile_time_s)
        with self._lock:
            if self._cache.get(spec) is fut:
                self._index_bytes[spec] = index_bytes
        _settle(fut, grammar)
        self._settled_grammar()

    def _settled_grammar(self) -> None:
        """A grammar joined the cache: its bytes now count (it may push others out, or itself)."""
        with self._lock:
            self._evict()

    def _in_worker(self, fut: Future, job: Any) -> Any:
        """Run ``job(worker)`` on an idle worker; None when ``fut`` was settled meanwhile
        (close, cancel). A worker whose job raised anything but the grammar's ValueError
        (a crash, a timeout, a cancel) is replaced."""
        while True:
            if fut.done():
                return None
            try:
                w = self._idle.get(timeout=0.5)
                break
            except queue.Empty:
                if self._closed:
                    _settle(fut, exc=GrammarCompileError("GrammarCompiler was closed before the compile started"))
                    return None
        try:
            out = job(w)
        except ValueError:  # the grammar's (a GrammarCompileError too): a sound worker goes on
            if not w.broken:
                self._idle.put(w)
            raise
        except BaseException:
            self._retire(w)
            raise
        self._idle.put(w)
        return out

    def _regex_in(self, w: _Worker, spec: GrammarSpec, holes: bool, fut: Future,
                  budget: list[float]) -> tuple[str, LazyNFA | None]:
        """The spec -> regex step in worker ``w``: (the regex, its lazy index's NFA or None), or
        the ``ValueError`` it raised (``GrammarTooLarge`` past ``max_grammar_size``)."""
        reply = self._ask(w, ("regex", spec, self._whitespace_pattern, self._json_schema_mode, holes,
                              self._max_recursion_depth, self._max_size, self._lazy),
                          f"{spec.kind} grammar (its regex)", fut,
                          budget)
        if reply[0] == "regex":
            return reply[1], None
        if reply[0] == "lazy":
            return reply[1], reply[2]
        if reply[0] == "invalid":
            raise reply[1] if isinstance(reply[1], ValueError) else ValueError(str(reply[1]))
        raise GrammarCompileError(f"translating the {spec.kind} grammar to a regex failed: {reply[1]}")

    def _grammar(self, spec: GrammarSpec, regex: str, index: Any, seconds: float,
                 from_disk: bool = False) -> CompiledGrammar:
        holes = _holes_of(spec, regex, index, self._table, self._pushdown)
        free_keys = spec.kind != "json_schema" or self._json_schema_mode != "strict" or \
            schema_has_free_keys(json.loads(spec.value))
        return CompiledGrammar(index=index, regex=regex, vocab_size=self._vocab_size,
                               num_tokens=self._num_tokens, eos_token_ids=self._eos, token_bytes=self._table,
                               spec=spec, compile_time_s=seconds, from_disk=from_disk, holes=holes,
                               free_keys=free_keys)

    def _compile_in(self, w: _Worker, spec: GrammarSpec, regex: str, fut: Future,
                    budget: list[float]) -> tuple[CompiledGrammar, int]:
        """Build the index of ``regex`` in worker ``w``: (the grammar, its index's pickle size)."""
        what = f"{spec.kind} grammar (regex of {len(regex)} chars)"
        reply = self._ask(w, regex, what, fut, budget)
        if reply[0] == "ok":
            _, index, seconds = reply
            return self._grammar(spec, regex, index, seconds), w.conn.last_bytes
        raise GrammarCompileError(f"compile of {what} was rejected: {reply[1]}")

    def _ask(self, w: _Worker, job: Any, what: str, fut: Future, budget: list[float]) -> tuple:
        """Send ``job`` to worker ``w`` and return its reply, taking the time it ran from
        ``budget[0]`` (seconds of the compile's ``timeout_s`` left). A worker that is unavailable,
        times out, crashes or runs out of memory is replaced before GrammarCompileError;
        _Cancelled (the worker is replaced by ``_in_worker``) once ``fut`` is cancelled."""
        try:
            w.wait_ready()
            w.conn.send(job)
        except (GrammarCompileError, OSError, EOFError) as e:
            self._retire(w)
            raise GrammarCompileError(f"compile of {what} failed: worker unavailable: {e}") from e
        start = time.monotonic()
        deadline = start + budget[0]
        while not w.conn.poll(max(0.0, min(_CANCEL_POLL_S, deadline - time.monotonic()))):
            if fut.cancelled():
                raise _Cancelled(what)
            if time.monotonic() < deadline:
                continue
            self._retire(w)
            raise GrammarCompileTimeout(
                f"compile of {what} timed out after {self._timeout_s:g}s, the grammar compile time limit (a "
                "server's --grammar-compile-timeout-s: a compile's own work, its time queued for a worker not "
                "counted); simplify the grammar (fewer alternatives / bounded repetitions) or raise the limit"
            )
        budget[0] -= time.monotonic() - start
        try:
            reply = w.conn.recv()
        except (EOFError, OSError) as e:
            w.proc.join(5)
            code = w.proc.exitcode
            self._retire(w)
            raise GrammarCompileError(
                f"compile of {what} crashed the compile worker (exit code {code}); most likely it "
                f"exceeded the memory limit of {self._memory_limit} bytes"
            ) from e
        if reply[0] == "oom":
            self._retire(w)
            raise GrammarCompileError(
                f"compile of {what} ran out of memory (limit {self._memory_limit} bytes)"
            )
        return reply
