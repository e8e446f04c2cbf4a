"""JSON Schema -> regex, sound by construction.

Every string the returned regex matches is a JSON text valid under the schema. The regex
may accept fewer texts than the schema allows, and how many fewer is the ``mode``:

- ``"strict"`` (the default, like xgrammar's strict mode or OpenAI's strict outputs): a
  model should not invent keys, so objects hold their declared properties only, arrays
  after ``prefixItems`` only as many free items as ``minItems`` needs, supported formats
  are enforced and integers are written as plain digits;
- ``"spec"``: what JSON Schema 2020-12 admits, as far as a regex can say it: extra
  members and trailing items that additionalProperties / items / unevaluated* allow,
  ``format`` as an annotation, integers with a zero fraction ("1.0"), deeper any-values.

Both keep compact separators, schema key order (extra members come after the declared
ones), and bounded sizes and nesting, except inside holes: with ``holes=True`` (the
compiler's choice for compact output) each any-value, and each free-form object or array
of an untyped schema, is one placeholder character that json_holes.py runs on the pushdown
automaton, unbounded; and a recursive ``$ref`` (one met again inside itself) is a call
placeholder of its definition, converted once and appended to the regex as a branch no
output can take (``with_definitions``), which json_holes.py runs as a stack of calls, to
any depth. Without holes, ``$ref`` cycles unroll ``max_recursion_depth`` times.

A keyword treadle cannot enforce raises ``UnsupportedSchemaError`` naming it and its JSON
path; nothing is silently ignored. Keywords that never change validity are skipped:
annotations, OpenAPI's ``discriminator`` and ``x-...`` extensions. Some keywords hold in
part: ``uniqueItems`` over a few listed values (every order of every subset),
``propertyNames`` on declared names and free keys, ``oneOf`` over branches no value written
for one can satisfy another (``_made_exclusive``: disjoint types, tags, keys one requires and
the other never writes or forbids), or narrowed to where the others fail; outside that they
are refused.
"""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from typing import Any, Literal

import interegular
import jsonschema
import referencing
import referencing.exceptions

from treadle.constrained.regex import fsm_crawl
from treadle.constrained.schema import regex_numbers as nums
from treadle.constrained.regex import regex_text as text
from treadle.constrained.schema.json_schema_dialects import dialect_of, to_2020_12
from treadle.constrained.schema.json_schema_logic import (
    complement,
    conditional_branches,
    contains_as_prefix,
    complement_exact,
    contains_past_cap,
    dependencies_as_anyof,
)
from treadle.constrained.index.json_holes import HOLE_CHARS, schema_allows_holes, with_definitions
from treadle.constrained.schema.members import MAX_SPELT_CHARS, MembersTooLarge, members_safe
from treadle.constrained.schema.unique_strings import unique_strings_checked
from treadle.constrained.schema.json_schema_parts import (
    ANNOTATIONS,
    DYNAMIC_REFS,
    CannotWrite,
    FAMILIES,
    NoOutput,
    Unsatisfiable,
    Merger,
    UnsupportedSchemaError,
    array_regex,
    check_keyword_values,
    check_metaschemas,
    object_regex,
    static_dynamic_refs,
)
from treadle.constrained.regex.regex_text import choices_to_regex, escape_literal, validate_regex
from treadle.constrained.schema.string_shapes import _WEB_URLS, _reshaped_to_lengths  # noqa: F401 (read by tests, regex_ecma)
from treadle.constrained.schema.json_schema_oneof import _AlternativesMixin, _alt
from treadle.constrained.schema.json_schema_refs import _RefsMixin
from treadle.constrained.schema.json_schema_strings import _StringsMixin
from treadle.constrained.schema.json_schema_listed import (  # noqa: F401 (_no_retrieve: json_schema_parts reads it here)
    _ListedMixin, _Validator, _no_retrieve)

__all__ = [
    "UnsupportedSchemaError",
    "drop_unenforceable",
    "json_schema_to_regex",
    "json_schemas_to_regexes",
    "embedded_defs",
    "rebase_refs",
    "choices_to_regex",
    "escape_literal",
    "validate_regex",
]

GENERIC_DEPTH = 2  # nesting of arrays/objects inside a `true` (any value) schema
# A schema without "type" constrains only the types its keywords belong to; values of the
# other types are valid as they are. Those are generated too, containers only this deep
# (1: arrays/objects of scalars), which keeps such a regex small (a depth-2 any-value
# regex is ~15k chars and its token index takes seconds). Deeper values are not produced.
OTHER_TYPES_DEPTH = 1
DEPENDENCIES = ("dependentRequired", "dependentSchemas")
# The spec mode goes one level deeper (the suite's arrays of nested objects need 3). Its
# containers list their members as (?:(?:V,)*V)? rather than V(?:,V)*: the two copies of V
# then run in lock-step, so the DFA (outlines-core and interegular alike, neither
# minimizes) grows ~2x per level instead of ~4x (depth 3: ~1.2k states instead of ~6.8k).
SPEC_GENERIC_DEPTH = 3
MODES = ("strict", "spec")
# the refusal of a schema nested deeper than the translation's recursive walks reach (Python's
# recursion limit: some hundreds of levels), a ValueError like any other, never a RecursionError
TOO_DEEP = "json_schema: schema nests too deeply to convert"


def json_schema_to_regex(
    schema: dict | str | bool,
    *,
    whitespace_pattern: str | None = None,
    max_recursion_depth: int = 3,
    mode: Literal["strict", "spec"] = "strict",
    holes: bool = False,
    members: bool = False,
    leave_out_branches: bool = True,
    unique_check: bool = False,
) -> str:
    """Compile a JSON Schema (draft 2020-12) to a regex matching only valid JSON texts.

    ``schema`` may be a dict, a bool, or a JSON string. ``whitespace_pattern=None`` gives
    compact output (no whitespace between tokens); pass e.g. ``r"[ ]?"`` to allow bounded
    whitespace. ``$ref`` cycles unroll at most ``max_recursion_depth`` times (with holes they
    are calls, to any depth, up to ``MAX_CALLS`` recursive definitions). ``mode`` is
    ``"strict"`` (declared members only) or ``"spec"`` (all that 2020-12 admits and a regex
    can express); see the module docstring. ``holes=True`` writes a placeholder character
    for each any-value (and free-form object / array) instead of a bounded regex for it,
    to be run on the pushdown automaton (json_holes.py); it needs compact output and is
    ignored where ``schema_allows_holes`` says no. ``members=True`` (the compile path) writes an
    object's long spelt-out property sequence as one ordered-members node, which only the lazy
    index reads (members.py; ``expand_members`` gives the standard text).
    ``leave_out_branches`` (strict mode): an ``anyOf`` branch it cannot write is left out
    while another branch can be written (a subset); False refuses it instead, as the opt-in
    leniency (``drop_unenforceable``) wants, to drop the keyword and keep the branch.
    ``unique_check``: the regex is for a JSON-schema grammar whose matcher checks string items
    for uniqueness (unique_strings.py, for the schemas ``unique_strings_checked`` names), so an
    array of unique free strings is written as a plain list of strings.
    Raises ``UnsupportedSchemaError`` (a ``ValueError``) for keywords it cannot enforce.
    """
    checked = unique_check and unique_strings_checked(schema)
    schema = _checked(schema, whitespace_pattern, max_recursion_depth, mode)
    holes = holes and not whitespace_pattern and schema_allows_holes(json.dumps(schema, ensure_ascii=False))
    try:
        conv = _Converter(schema, whitespace_pattern or "", max_recursion_depth, mode, holes)
        conv.members = members and members_safe(json.dumps(schema, ensure_ascii=False))
        conv.leave_out_branches = leave_out_branches and not conv.spec
        conv.unique_strings = checked
        with fsm_crawl.limit(states=MAX_AUTOMATON_STATES):
            root = conv.convert(schema, "$")
        conv.check_built()
        return with_definitions(root, conv.definitions)
    except RecursionError as exc:
        raise UnsupportedSchemaError(TOO_DEEP) from exc
    except fsm_crawl.TooLarge as exc:
        raise _automaton_refusal(exc) from None


def _automaton_refusal(exc: fsm_crawl.TooLarge) -> UnsupportedSchemaError:
    """The 400 of a translation whose automata passed ``MAX_AUTOMATON_STATES`` (or, ``work``, the
    steps of work of the opt-in leniency's translation)."""
    limit = (f"{LENIENT_MAX_STEPS:,} steps of work, the bound of the opt-in leniency's translation" if exc.work
             else f"{MAX_AUTOMATON_STATES:,} states")
    return UnsupportedSchemaError(
        f"json_schema: an automaton the schema needs passes {limit} (a 'pattern' with assertions, a 'not' of "
        "a pattern, a pattern beside a 'format' or length bounds, or 'patternProperties' / 'propertyNames' "
        "patterns, whose exact automata grow exponentially, as '(a|b)*a(a|b){30}' does); simplify the pattern")


# The most states one automaton (an interegular crawl, fsm_crawl.py) may have while a schema is
# translated: the translation builds exact DFAs where a pattern is intersected, complemented or
# searched under assertions, and those grow exponentially in a hostile pattern ('(a|b)*a(a|b){k}'
# has 2^(k+1)); about 60 us a state on a 2-core box, so a refusal comes within seconds instead of
# running into the compile timeout (or, where the opt-in leniency translates the schema where the
# request arrives, without any timeout). A plain 'pattern' builds no DFA (regex_text._tree_verdict).
MAX_AUTOMATON_STATES = 100_000

# No (sub)schema's regex may pass this many chars (nor a spelt-out sequence of its members):
# past it the conversion stops with a refusal naming the size, before the text (copied into
# every enclosing alternative) exhausts time and memory. It is above what the compiler's
# default cap allows (compiler.LAZY_CHARS_PER_STATE chars a state).
MAX_REGEX_CHARS = MAX_SPELT_CHARS
# ... and all the (sub)schemas' regexes of one translation together (each level of nesting copies
# its parts' text, so this is the work of the copies): past it the translation stops, whatever a
# strict anyOf would have left out. Vega-Lite's top-level specs (altair's vega-lite-schema.json:
# layers of layers of views, each with dozens of optional channels, unrolled) built 800 million
# chars in 34 s and ran out of 4 GiB at 56 s; the largest real schema that compiles (CycloneDX
# 1.7, a 4.5-million-char regex) builds 57 million.
MAX_BUILT_CHARS = 256_000_000
LENIENT_MAX_DROPS = 64  # keywords one lenient translation may drop before it gives up
# ... and the work its automata may take, all its rounds together (fsm_crawl's steps: about 10 s
# on a quiet 2-core box; counted in work, so that the verdict does not depend on the load)
LENIENT_MAX_STEPS = 25_000_000
_NAMED = re.compile(r"keyword '([^']+)' at (\$[^\s:]*)")


def drop_unenforceable(schema: dict | str | bool, *, whitespace_pattern: str | None = None,
                       max_recursion_depth: int = 3, mode: Literal["strict", "spec"] = "strict",
                       holes: bool = True) -> tuple[dict | bool, list[dict[str, str]]]:
    """The opt-in leniency: ``schema`` (in the 2020-12 spelling treadle reads) without the
    assertion keywords treadle cannot enforce, and what was dropped, as
    ``[{"keyword": ..., "path": ...}]`` (empty when it compiles as it is). Each round translates
    the schema as ``json_schema_to_regex`` does (same options) and removes the keyword its
    refusal names, at the JSON path it names (or, where merging moved it, its first place in
    the schema). A schema no value satisfies, or one still refused after
    ``LENIENT_MAX_DROPS`` drops, raises as the strict translation does."""
    root = _checked(schema, whitespace_pattern, max_recursion_depth, mode)
    if isinstance(root, dict):
        root = {k: v for k, v in root.items() if k != "$schema"}  # already rewritten: read it as is
    dropped: list[dict[str, str]] = []
    # (where the request arrives, on a thread that builds requests: no compile worker's timeout
    # bounds it, so its automata stop at a budget of their own, one for all rounds)
    try:
        with fsm_crawl.limit(steps=LENIENT_MAX_STEPS):
            while True:
                try:
                    json_schema_to_regex(root, whitespace_pattern=whitespace_pattern,
                                         max_recursion_depth=max_recursion_depth, mode=mode, holes=holes,
                                         leave_out_branches=False, unique_check=True)
                    return root, dropped
                except UnsupportedSchemaError as exc:
                    if isinstance(exc, NoOutput) and not isinstance(exc, CannotWrite):
                        raise  # (no value at all: nothing to drop)
                    named = _NAMED.search(str(exc))
                    if named is None or len(dropped) >= LENIENT_MAX_DROPS:
                        raise
                    keyword, path = named.groups()
                    where = _drop(root, keyword, path)
                    if where is None:
                        raise
                    dropped.append({"keyword": keyword, "path": where, "reason": str(exc)})
    except fsm_crawl.TooLarge as exc:  # the budget of all rounds spent
        raise _automaton_refusal(exc) from None


def _drop(root: Any, keyword: str, path: str) -> str | None:
    """Remove ``keyword`` from the subschema at JSON path ``path`` (``$.properties.a.items``,
    ``$.anyOf[0]``), else from its first place in ``root``; the path it was removed at, or None."""
    node, rest = root, path[1:]
    while rest and isinstance(node, (dict, list)):
        m = re.match(r"\[(\d+)\]", rest)
        if m and isinstance(node, list) and int(m.group(1)) < len(node):
            node, rest = node[int(m.group(1))], rest[m.end():]
            continue
        keys = [k for k in node if isinstance(k, str) and rest.startswith("." + k)
                and rest[len(k) + 1:len(k) + 2] in ("", ".", "[")] if isinstance(node, dict) else []
        if not keys:
            break
        key = max(keys, key=len)
        node, rest = node[key], rest[len(key) + 1:]
    if not rest and isinstance(node, dict) and keyword in node:
        del node[keyword]
        return path

    def search(n: Any, at: str) -> str | None:
        if isinstance(n, dict):
            if keyword in n:
                del n[keyword]
                return at
            for k, v in n.items():
                if k not in _DATA_KEYWORDS and (found := search(v, f"{at}.{k}")) is not None:
                    return found
        elif isinstance(n, list):
            for i, v in enumerate(n):
                if (found := search(v, f"{at}[{i}]")) is not None:
                    return found
        return None

    return search(root, "$")


def json_schemas_to_regexes(
    schemas: list,
    *,
    whitespace_pattern: str | None = None,
    max_recursion_depth: int = 3,
    mode: Literal["strict", "spec"] = "strict",
    holes: bool = False,
    paths: list[str] | None = None,
) -> tuple[list[str], list[str]]:
    """Several schemas converted together, for a regex that places each one itself (a
    structural tag's): (the regex of each, the definitions their calls name). Each schema
    is embedded under ``$defs`` of one root with its local refs rebased (``rebase_refs``),
    so its refs mean what they meant alone while all recursive refs share one list of
    definitions (``with_definitions`` appends them to the caller's regex). ``paths`` name
    the schemas in errors (default ``$[i]``). Same options and errors as
    ``json_schema_to_regex``."""
    paths = paths or [f"$[{i}]" for i in range(len(schemas))]
    checked = [_checked(s, whitespace_pattern, max_recursion_depth, mode) for s in schemas]
    holes = holes and not whitespace_pattern and schema_allows_holes(json.dumps(checked, ensure_ascii=False))
    root = {"$defs": embedded_defs({f"s{i}": s for i, s in enumerate(checked)})}
    try:
        conv = _Converter(root, whitespace_pattern or "", max_recursion_depth, mode, holes)
        with fsm_crawl.limit(states=MAX_AUTOMATON_STATES):
            regexes = [conv.convert(root["$defs"][f"s{i}"], path) for i, path in enumerate(paths)]
        conv.check_built()
        return regexes, conv.definitions
    except RecursionError as exc:
        raise UnsupportedSchemaError(TOO_DEEP) from exc
    except fsm_crawl.TooLarge as exc:
        raise _automaton_refusal(exc) from None


def _checked(schema: Any, whitespace_pattern: str | None, max_recursion_depth: int, mode: str) -> dict | bool:
    """``schema`` parsed (from JSON text) and checked against the options and the
    metaschema; raises ``ValueError`` / ``UnsupportedSchemaError`` naming the problem (a schema
    nested past what these recursive walks reach, a few hundred levels, is one)."""
    try:
        return _checked_walks(schema, whitespace_pattern, max_recursion_depth, mode)
    except RecursionError as exc:
        raise UnsupportedSchemaError(TOO_DEEP) from exc


def _checked_walks(schema: Any, whitespace_pattern: str | None, max_recursion_depth: int, mode: str) -> dict | bool:
    if mode not in MODES:
        raise ValueError(f"json_schema: mode must be 'strict' or 'spec', got {mode!r}")
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"json_schema: not valid JSON: {exc}") from exc
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"json_schema: expected an object or boolean schema, got {type(schema).__name__}")
    if whitespace_pattern:
        whitespace_pattern = validate_regex(whitespace_pattern)
        # Whatever it matches is spliced between tokens: it must be JSON whitespace only.
        ws_fsm = interegular.parse_pattern(whitespace_pattern).to_fsm()
        if not (ws_fsm - interegular.parse_pattern(r"[ \t\n\r]*").to_fsm()).empty():
            raise ValueError(f"json_schema: whitespace_pattern {whitespace_pattern!r} matches non-whitespace text")
    for reserved in ("__conj__", "__refs__", "__not_in__", "__not_pattern__", "__and_pattern__"):
        if reserved in json.dumps(schema):
            raise UnsupportedSchemaError(f"json_schema: keyword '{reserved}' is reserved by treadle")
    if max_recursion_depth < 0:
        raise ValueError("json_schema: max_recursion_depth must be >= 0")
    check_metaschemas(schema, "$")
    check_keyword_values(schema, "$", draft3=dialect_of(schema) == "draft-03")
    return to_2020_12(static_dynamic_refs(schema))


_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})  # their values are data, not schemas
# keywords whose value maps names to schemas (a property may be called "const" or "$ref")
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def embedded_defs(named: dict[str, Any]) -> dict[str, Any]:
    """``named`` schemas as the ``$defs`` of a larger schema, each with its local refs rebased
    there (``rebase_refs``): reference one as ``{"$ref": "#/$defs/<name>"}``. Names must be
    plain (no ``/`` or ``~``, which a JSON pointer escapes)."""
    bad = [n for n in named if "/" in n or "~" in n]
    if bad:
        raise ValueError(f"embedded_defs: name {bad[0]!r} needs escaping in a JSON pointer")
    return {name: rebase_refs(schema, f"/$defs/{name}") for name, schema in named.items()}


def rebase_refs(schema: Any, pointer: str) -> Any:
    """``schema`` with its local ``$ref``s (``#`` and ``#/...``) rewritten to point under
    ``pointer`` (a JSON pointer such as ``/$defs/tool_0``), for embedding it there in a larger
    schema: a tool's ``{"$ref": "#/$defs/Address"}`` becomes ``#/$defs/tool_0/$defs/Address``.
    Data (``const``, ``enum``, ``default``, ``examples``), anchors (``#name``) and anything
    under an ``$id`` (a resource of its own, where ``#`` means that resource) are kept as they
    are. Returns a new object; ``schema`` is not changed."""
    if pointer and not pointer.startswith("/"):
        raise ValueError(f"rebase_refs: pointer must be empty or start with '/', got {pointer!r}")

    def walk(node: Any, top: bool) -> Any:
        if isinstance(node, list):
            return [walk(v, False) for v in node]
        if not isinstance(node, dict) or (not top and "$id" in node):
            return node
        out = {}
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str) and (v == "#" or v.startswith("#/")):
                out[k] = "#" + pointer + v[1:]
            elif k in _DATA_KEYWORDS:
                out[k] = v
            elif k in _SCHEMA_MAPS and isinstance(v, dict):
                out[k] = {name: walk(sub, False) for name, sub in v.items()}
            else:
                out[k] = walk(v, False)
        return out

    if isinstance(schema, dict) and "$id" in schema:
        return schema
    return walk(schema, True)


class _Converter(_RefsMixin, _AlternativesMixin, _StringsMixin, _ListedMixin):
    """One conversion: holds the root (for refs), whitespace, mode and recursion counters.

    Here: the walk over a schema (``_convert``: booleans, merged ``allOf`` / refs, the logic
    keywords' rewrites), types, numbers, containers (via json_schema_parts.py) and any-values.
    Its mixins write the rest, each in a module of its own: ``$ref`` (json_schema_refs.py),
    ``anyOf`` / ``oneOf`` (json_schema_oneof.py), strings (json_schema_strings.py, on
    string_shapes.py) and listed values (json_schema_listed.py)."""

    def __init__(self, root: dict | bool, ws: str, max_depth: int, mode: str = "strict", holes: bool = False,
                 calls: bool = True) -> None:
        self.root = root
        self.holes = holes
        self.calls = holes and calls  # recursive refs as calls (holes only)
        self.members = False  # ordered-members nodes for long property sequences (json_schema_to_regex)
        self.unique_strings = False  # the matcher checks string items for uniqueness (unique_strings.py)
        self.leave_out_branches = mode != "spec"  # an anyOf branch it cannot write is left out (a subset)
        self.mode = mode
        self.ws = ws
        self.max_depth = max_depth
        self.spec = mode == "spec"
        # Whole numbers are written in their digits only ("1", never "1.0") in strict mode, and in
        # draft-03 / -04 schemas, whose validators call 1.0 no integer (later drafts: the same value)
        self.digits = not self.spec or dialect_of(root) in ("draft-03", "draft-04")
        # In the spec mode `format` is an annotation like any other (2020-12's default).
        self.annotations = (ANNOTATIONS | {"format"}) if self.spec else ANNOTATIONS
        self.generic_depth = SPEC_GENERIC_DEPTH if self.spec else GENERIC_DEPTH
        self.merger = Merger(root, self.annotations)
        self._active: dict[str, int] = {}  # ref pointer -> times on the current stack
        self._calls: dict[str, int] = {}  # with holes: recursive ref pointer -> its definition's index
        self.definitions: list[str] = []  # their regexes (CALL_CHARS[i] is a value of definitions[i])
        self._failed: dict[str, NoOutput] = {}  # definitions with no possible value
        # conversions of pure $refs and of schemas merged from refs, by what decides them
        # (_reused): a definition used at many places is converted once
        self._memo: dict[tuple, str] = {}
        self._refused: dict[tuple, tuple[UnsupportedSchemaError, str]] = {}  # _reused's: (error, its path)
        self._verdicts: dict[tuple, tuple[bool, Any]] = {}  # (id(part), value's JSON) -> (valid, part)
        # id(part) -> (part, its enum's (or its not's enum's) ListedValues, the part without it,
        # whether a valid value is inside the list)
        self._listed: dict[int, tuple] = {}
        self._reach: dict[str, frozenset[str]] = {}  # ref -> the refs its target reaches
        self._refs_of: dict[str, frozenset[str]] = {}  # ref -> the refs inside its target (not followed)
        registry = referencing.Registry(retrieve=_no_retrieve)
        checker = None if self.spec else jsonschema.Draft202012Validator.FORMAT_CHECKER
        self._validator = _Validator(root, registry=registry, format_checker=checker)
        self._generic: dict[int, str] = {}  # depth -> any-value regex
        self.built, self.built_past = 0, None  # chars of the regexes converted so far (MAX_BUILT_CHARS)
        w = ws
        self.OPEN_O, self.CLOSE_O = r"\{" + w, w + r"\}"
        self.OPEN_A, self.CLOSE_A = r"\[" + w, w + r"\]"
        self.COLON, self.COMMA = w + ":" + w, w + "," + w

    # ------------------------------------------------------------ entry
    def convert(self, schema: Any, path: str) -> str:
        """Regex for one (sub)schema at JSON path ``path`` (at most ``MAX_REGEX_CHARS``)."""
        self.check_built()
        try:
            out = self._convert(schema, path)
        except MembersTooLarge as exc:
            raise UnsupportedSchemaError(f"json_schema: the schema at {path} is too large to convert: {exc}") from exc
        if len(out) > MAX_REGEX_CHARS:
            raise UnsupportedSchemaError(f"json_schema: the schema at {path} is too large to convert: its regex "
                                         f"passes {MAX_REGEX_CHARS:,} chars")
        self.built += len(out)
        if self.built > MAX_BUILT_CHARS and self.built_past is None:
            self.built_past = path
        return out

    def check_built(self) -> None:
        """Refuse once the regexes built so far pass ``MAX_BUILT_CHARS`` (at every later convert,
        and at the end: a strict anyOf leaves the refusal's branch out and goes on)."""
        if self.built_past is not None:
            raise UnsupportedSchemaError(
                f"json_schema: the schema is too large to convert: its subschemas' regexes together pass "
                f"{MAX_BUILT_CHARS:,} chars (at {self.built_past}); a regex that large is past any grammar "
                "size the compiler allows")

    def _convert(self, schema: Any, path: str) -> str:
        if schema is True:
            return self.generic()
        if schema is False:
            raise Unsatisfiable(f"json_schema: schema at {path} is false: no possible output")
        if not isinstance(schema, dict):
            raise UnsupportedSchemaError(f"json_schema: schema at {path} must be an object or boolean")
        if "__refs__" in schema:  # merged from resolved refs (Merger.merge_all): inside them
            return self._inside(schema["__refs__"], {k: v for k, v in schema.items() if k != "__refs__"}, path)
        if not self.spec and isinstance(schema.get("discriminator"), dict):
            schema = _tag_required(schema)
        # Annotations (every keyword that is not an assertion, whatever its name) never change
        # validity: leave them out (in the spec mode `format` is one of them).
        schema = {k: v for k, v in schema.items() if k not in self.annotations}
        for key in DYNAMIC_REFS:
            if key in schema:
                raise UnsupportedSchemaError(f"json_schema: keyword '{key}' at {path} is not supported")
        if self.spec and all(k == "__conj__" for k in schema):
            # Any value, as for `true` (built per type, it would nest one level deeper).
            return self.generic()
        if "enum" in schema or "const" in schema:
            return self._literals(schema, path)
        if self.spec and _is_lone_if(schema) and ("unevaluatedItems" in schema or "unevaluatedProperties" in schema):
            return self._lone_if(schema, path)
        if "$ref" in schema:
            return self._ref(schema, path)
        if not all(self._trivial(k, schema[k], schema, "object") for k in DEPENDENCIES if k in schema):
            if not self._evaluates_nothing(schema.get("dependentSchemas", {})):
                self._no_unevaluated(schema, "dependentSchemas", path)
            rest, parts = dependencies_as_anyof(schema, path)
            if not parts:
                return self.convert(rest, path)
            return self.convert(self.merger.merge_all(rest, parts, path + ".dependentSchemas"), path)
        if "allOf" in schema:
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            parts = schema["allOf"]
            if not isinstance(parts, list) or not parts:
                raise UnsupportedSchemaError(f"json_schema: 'allOf' at {path} must be a non-empty list")
            if len(parts) == 1 and self._annotations_only(rest):  # a wrapped part ({"allOf": [{"$ref": ...}]})
                return self.convert(parts[0], path + ".allOf[0]")
            return self.convert(self.merger.merge_all(rest, parts, path + ".allOf"), path)
        if "anyOf" in schema or "oneOf" in schema:
            return self._alternatives(schema, path)
        branches = conditional_branches(schema, lambda ref: self.merger.resolve(ref, path))
        if branches is not None:
            if not self._conditional_evaluates_nothing_new(schema):
                self._no_unevaluated(schema, "if", path)
            rest = {k: v for k, v in schema.items() if k not in ("if", "then", "else")}
            exact = complement_exact(schema["if"], lambda ref: self.merger.resolve(ref, path), self.annotations)
            return self._some_of(rest, branches, path + ".if", "if", exact)
        schema = {k: v for k, v in schema.items() if k not in ("if", "then", "else")}  # alone, they never decide
        if "not" in schema and not self._negates_types(schema["not"]):
            resolve = lambda ref: self.merger.resolve(ref, path)  # noqa: E731
            broken = complement(schema["not"], resolve)
            exact = complement_exact(schema["not"], resolve, self.annotations)
            if any(schema.get(k, True) not in (True, {}) for k in ("unevaluatedProperties", "unevaluatedItems")):
                # `not` evaluates nothing: only the ways to fail it that evaluate nothing either
                exact = exact and all(self._quiet(b) for b in broken)
                broken = [b for b in broken if self._quiet(b)]
                if not broken:
                    self._no_unevaluated(schema, "not", path)
            rest = {k: v for k, v in schema.items() if k != "not"}
            return self._some_of(rest, broken, path + ".not", "not", exact)
        excluded = self._negated_types(schema, path)
        return self._typed(schema, path, excluded)

    @staticmethod
    def _no_unevaluated(schema: dict, keyword: str, path: str) -> None:
        """The rewrites of json_schema_logic.py move properties between subschemas, which
        changes what unevaluated* sees: refuse them there."""
        for key in ("unevaluatedProperties", "unevaluatedItems"):
            if key in schema and schema[key] is not True and schema[key] != {}:
                raise UnsupportedSchemaError(f"json_schema: keyword '{keyword}' at {path} beside {key} is not supported")

    def _conditional_evaluates_nothing_new(self, schema: dict) -> bool:
        """Whether ``if`` / ``then`` / ``else`` evaluate no property that ``schema``'s own
        ``properties`` / ``patternProperties`` do not (the same names, the same pattern texts),
        and ``schema`` has no ``unevaluatedItems``: then what they evaluate when they pass is
        evaluated anyway, unevaluatedProperties sees the same members in the rewrite as in the
        schema, and the rewrite is sound beside it. OpenAPI 3.2's Responses Object: "if no
        property is a status code (``patternProperties: {code: false}``), then ``default`` is
        required", beside ``unevaluatedProperties: false`` and the same status-code pattern."""
        if schema.get("unevaluatedItems", True) not in (True, {}):
            return False
        names, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
        if not isinstance(names, dict) or not isinstance(patterns, dict):
            return False
        for key in ("if", "then", "else"):
            sub = schema.get(key, True)
            if sub is True or sub is False:
                continue
            if not isinstance(sub, dict):
                return False
            evaluating = {k: v for k, v in sub.items() if k in ("properties", "patternProperties")}
            others = {k: v for k, v in sub.items() if k not in evaluating}
            if not self._quiet(others):
                return False
            for k, own in (("properties", names), ("patternProperties", patterns)):
                inner = evaluating.get(k, {})
                if not isinstance(inner, dict) or not set(inner) <= set(own):
                    return False
        return True

    def _evaluates_nothing(self, dependents: Any) -> bool:
        """Whether the ``dependentSchemas`` subschemas evaluate no property (for unevaluated*):
        each holds only keywords that yield no annotation (``not`` and what is inside it,
        ``required``, counts, ``type``, ``propertyNames``), as OpenAPI 3.1's license
        ``{"identifier": {"not": {"required": ["url"]}}}``. Then their rewrite ("absent, or the
        schema": ``properties: {name: false}`` holds only where the name is absent) leaves the
        evaluated properties as they were, and so does ``dependentRequired``'s, always."""
        return isinstance(dependents, dict) and all(self._quiet(sub) for sub in dependents.values())

    def _quiet(self, sub: Any) -> bool:
        """Whether ``sub`` yields no evaluated property or item for unevaluated* (see
        ``_evaluates_nothing``): its keywords are ``not``, presence and counts, types, bounds,
        listed values, and ``properties`` that only forbid (``{"url": false}``: the key is absent)."""
        quiet = {"not", "required", "type", "minProperties", "maxProperties", "propertyNames", "dependentRequired",
                 "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
                 "exclusiveMaximum", "const", "enum", "__not_in__", "__not_pattern__", "__and_pattern__", "pattern",
                 "format"}
        if sub is True or sub is False:
            return True
        if not isinstance(sub, dict):
            return False
        props = sub.get("properties", {})
        return isinstance(props, dict) and all(v is False for v in props.values()) and all(
            k in quiet or k in self.annotations or k == "properties" for k in sub)

    def _negates_types(self, neg: Any) -> bool:
        """Whether ``not: neg`` only excludes whole types (or nothing, or everything)."""
        return neg is True or neg is False or isinstance(neg, dict) and all(
            k in self.annotations or k == "type" for k in neg)

    def _some_of(self, rest: dict, branches: list, path: str, keyword: str, exact: bool = True) -> str:
        """``rest`` and any of ``branches``, each a subset of what a keyword allows (its
        rewrite, json_schema_logic.py): a branch that cannot be built only narrows the
        output, so it is left out; none at all refuses the keyword. ``exact``: the branches say
        every value the keyword allows (``complement_exact``), so none having a value proves the
        schema empty; else that is a refusal, not a claim that no value exists."""
        out, first_error = [], None
        for i, branch in enumerate(branches):
            where = f"{path}[{i}]"
            try:
                out.append(self.convert(self.merger.merge_all(rest, [branch], where, named=True), where))
            except UnsupportedSchemaError as exc:
                first_error = first_error or exc
        if out:
            return _alt(out)
        if not branches:
            raise UnsupportedSchemaError(f"json_schema: keyword '{keyword}' at {path.rsplit('.', 1)[0]} is not "
                                         "supported: treadle cannot write the values it excludes")
        if isinstance(first_error, NoOutput) and exact:
            raise Unsatisfiable(f"json_schema: keyword '{keyword}' at {path.rsplit('.', 1)[0]}: no output "
                                "treadle can write satisfies it") from first_error
        if isinstance(first_error, NoOutput):
            fails = "the 'not' schema" if keyword == "not" else "the 'if' schema (for 'else')"
            raise CannotWrite(
                f"json_schema: keyword '{keyword}' at {path.rsplit('.', 1)[0]} is not supported here: treadle cannot "
                f"write every value that fails {fails}, and none of those it can write is left ({first_error})"
            ) from first_error
        raise UnsupportedSchemaError(f"json_schema: keyword '{keyword}' at {path.rsplit('.', 1)[0]} is not "
                                     f"supported here: {first_error}") from first_error

    def _negated_types(self, schema: dict, path: str) -> set[str]:
        """``not`` is supported when it only excludes whole types (or nothing/everything)."""
        if "not" not in schema or schema["not"] is False:
            return set()
        neg = schema["not"]
        if neg is True or (isinstance(neg, dict) and all(k in self.annotations for k in neg)):
            raise Unsatisfiable(f"json_schema: keyword 'not' at {path} rejects every value: no possible output")
        if isinstance(neg, dict) and all(k in self.annotations or k == "type" for k in neg):
            names = [neg["type"]] if isinstance(neg["type"], str) else neg["type"]
            if isinstance(names, list) and all(isinstance(n, str) for n in names):
                return set(names) | ({"integer"} if "number" in names else set())
        raise UnsupportedSchemaError(f"json_schema: keyword 'not' at {path} is not supported (only 'not: {{type: ...}}')")

    def _lone_if(self, schema: dict, path: str) -> str:
        """spec mode: a lone ``if`` beside unevaluated*, as "rest AND if" or "rest".

        A lone ``if`` never decides validity, but when it passes, what it evaluated is no
        longer unevaluated. "rest AND if" (an allOf, whose parts' annotations count the
        same way) gives those outputs; "rest" alone, where unevaluated* holds for every
        member, is valid whether ``if`` passes or not. If the first cannot be built (the
        ``if`` uses an unsupported keyword), the schema is refused: leaving it out would
        narrow the output, which the spec mode does not do silently.
        """
        rest = {k: v for k, v in schema.items() if k != "if"}
        with_if = {**rest, "allOf": [*rest.get("allOf", []), schema["if"]]}
        out, first_error = [], None
        try:
            out.append(self.convert(with_if, path))
        except NoOutput as exc:  # an unsatisfiable "if": only "rest" remains
            first_error = exc
        try:
            out.append(self.convert(rest, path))
        except NoOutput as exc:
            first_error = exc
        if not out:
            assert first_error is not None
            raise first_error
        return _alt(out)

    def _annotations_only(self, schema: dict) -> bool:
        return all(k in self.annotations for k in schema)

    # ------------------------------------------------------------ types
    def _typed(self, schema: dict, path: str, excluded: set[str]) -> str:
        types = self._types(schema, path) - excluded
        if "integer" in excluded and "number" in types:
            raise UnsupportedSchemaError(f"json_schema: keyword 'not' at {path}: numbers that are not integers are not supported")
        if not types:
            raise Unsatisfiable(f"json_schema: keyword 'not' at {path} excludes every allowed type: no possible output")
        # Without "type", a value of a type none of the keywords constrain is valid as is.
        # (With no keywords at all every type is built as before, array/object included.)
        untyped = "type" not in schema and any(k in schema for keys in FAMILIES.values() for k in keys)
        parts, first_error = [], None
        for t in sorted(types, key=["null", "boolean", "integer", "number", "string", "array", "object"].index):
            if untyped and not any(k in schema for k in FAMILIES.get("number" if t == "integer" else t, ())):
                part = self._other_type(t)  # (its values are still those __not_in__ lets through)
            else:
                self._reject_unsupported(schema, t, path)
                try:
                    part = self._one_type(t, schema, path)
                except NoOutput as exc:
                    if not untyped:
                        raise
                    first_error = first_error or exc  # no value of this type: the others remain
                    continue
            if "__not_in__" in schema:
                try:
                    part = self._not_listed(part, t, schema["__not_in__"], path)
                except Unsatisfiable as exc:
                    # every value of this type is excluded (not: {const: null}): the other types remain
                    first_error = first_error or exc
                    continue
            parts.append(part)
        if not parts:
            assert first_error is not None
            raise first_error
        return _alt(parts)

    def _other_type(self, t: str) -> str:
        """Any value of type ``t``: scalars exactly, containers OTHER_TYPES_DEPTH deep."""
        if t not in ("array", "object"):
            return self._one_type(t, {}, "$")
        if self.holes:
            return HOLE_CHARS[t]
        arr, obj = self._containers(OTHER_TYPES_DEPTH)
        return arr if t == "array" else obj

    def _types(self, schema: dict, path: str) -> set[str]:
        if "type" in schema:
            declared = schema["type"]
            names = [declared] if isinstance(declared, str) else declared
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise UnsupportedSchemaError(f"json_schema: keyword 'type' at {path} must be a string or list")
            types = set(names)
            bad = types - {"null", "boolean", "integer", "number", "string", "array", "object"}
            if bad:
                raise UnsupportedSchemaError(f"json_schema: keyword 'type' at {path}: unknown type {sorted(bad)}")
            if "number" in types:
                types.discard("integer")  # number already covers integers
        else:
            types = {"null", "boolean", "number", "string", "array", "object"}
        if "multipleOf" in schema and "number" in types:
            m = schema["multipleOf"]
            if isinstance(m, (int, float)) and not isinstance(m, bool) and nums.finite(m) and m >= 1 and m == int(m):
                types = (types - {"number"}) | {"integer"}  # multiples of a whole number are integers
        if not types:
            raise Unsatisfiable(f"json_schema: keyword 'type' at {path}: no type is possible")
        return types

    def _reject_unsupported(self, schema: dict, t: str, path: str) -> None:
        for key in FAMILIES.get("number" if t == "integer" else t, ()):
            if key in schema and not self._trivial(key, schema[key], schema, t):
                if key in _SUPPORTED.get("number" if t == "integer" else t, ()):
                    continue
                if key == "multipleOf" and t == "integer" and _integer_multiples(schema) is not None:
                    continue
                if key == "multipleOf" and t == "number" and not self.spec and nums.multiple_grid(schema[key]):
                    continue  # strict mode: the multiples on a grid of 1/2**a (a sound subset; the spec mode refuses)
                raise UnsupportedSchemaError(f"json_schema: keyword '{key}' at {path} is not supported"
                                             + (_MULTIPLE_OF_HELP.get(t, "") if key == "multipleOf" else ""))

    @staticmethod
    def _trivial(key: str, value: Any, schema: dict, t: str) -> bool:
        """Keywords whose value makes them always satisfied."""
        if key == "uniqueItems":
            return value is False or schema.get("maxItems", 2) <= 1
        if key == "multipleOf":
            # Every integer is a multiple of 1/k (0.5, 0.25, 0.1, 1, ...), as validators compute it too.
            return t == "integer" and nums.multiple_grid(value, nums.integer_magnitude(schema)) is not None
        if key in ("patternProperties", "dependentRequired", "dependentSchemas"):
            return value == {}
        if key in ("propertyNames", "unevaluatedProperties", "unevaluatedItems"):
            return value is True or value == {}
        if key in ("minContains", "maxContains"):
            return "contains" not in schema
        return False

    def _one_type(self, t: str, schema: dict, path: str) -> str:
        if t == "null":
            return "null"
        if t == "boolean":
            return "(?:true|false)"
        try:
            if t == "integer" and "multipleOf" in schema and not self._trivial("multipleOf", schema["multipleOf"], schema, t):
                written = _integer_multiples(schema)  # (not None: _reject_unsupported saw to it)
                if not written:
                    raise Unsatisfiable(f"json_schema: keyword 'multipleOf' at {path}: no multiple within the bounds")
                return written
            if t == "integer":
                return nums.integer_regex(schema, zero_fraction=not self.digits)
            if t == "number" and "multipleOf" in schema:
                return nums.multiples_regex(schema, nums.multiple_grid(schema["multipleOf"]))
            if t == "number":
                return nums.number_regex(schema)
        except nums.BoundsError as exc:
            error = UnsupportedSchemaError if exc.unsupported else Unsatisfiable
            raise error(f"json_schema: keyword '{exc.keyword}' at {path}: {exc}") from exc
        if t == "string":
            if "__and_pattern__" in schema:
                return self._string_matching_all(schema, path)
            if "__not_pattern__" in schema:
                return self._string_not_matching(schema, path)
            return self._string(schema, path)
        if t == "array":
            if "contains" in schema:
                return self._containing(schema, path)
            return array_regex(self, schema, path)
        return object_regex(self, schema, path)

    def _containing(self, schema: dict, path: str) -> str:
        """An array with ``contains``: any of its rewrites (json_schema_logic.contains_as_prefix)
        that has an output."""
        rewrites, untried = contains_as_prefix(schema, path)
        out, first_error = [], None
        for rewrite in rewrites:
            try:
                out.append(array_regex(self, rewrite, path))
            except NoOutput as exc:
                first_error = first_error or exc
        past, capped = contains_past_cap(schema)
        why = None
        if past is not None:  # the arrays longer than maxContains
            try:
                out.append(array_regex(self, past, path))
            except NoOutput as exc:  # (no item fails contains: none is longer)
                first_error = first_error or exc
            except UnsupportedSchemaError as exc:  # left out: only narrows while another rewrite writes
                first_error, why = first_error or exc, f": {exc}"
        elif capped:
            why = " (prefixItems beside it)"
        if why is not None and not out:  # (no proof that no array is longer)
            raise UnsupportedSchemaError(
                f"json_schema: keyword 'maxContains' at {path} is not supported here: arrays longer than "
                f"maxContains {schema['maxContains']} are written only where treadle can write items that fail "
                f"'contains'{why}") from first_error
        if not out:
            if untried is not None:  # (not every way was tried: no proof that none has an output)
                raise UnsupportedSchemaError(untried) from first_error
            assert first_error is not None
            if isinstance(first_error, Unsatisfiable):  # (its reason names what the rewrite holds: minItems)
                raise Unsatisfiable(f"json_schema: keyword 'contains' at {path}: no array holds the items it needs "
                                    f"({str(first_error).removeprefix('json_schema: ')})") from first_error
            raise first_error
        return _alt(out)

    # ------------------------------------------------------------ any value
    def generic(self, depth: int | None = None) -> str:
        """A bounded-depth regex for any JSON value (the `true` schema), or its hole."""
        if depth is None and self.holes:
            return HOLE_CHARS["value"]
        depth = self.generic_depth if depth is None else depth
        if depth not in self._generic:
            if depth == 0:
                self._generic[0] = "(?:" + "|".join([text.string_regex(), nums.NUMBER, "true", "false", "null"]) + ")"
            else:
                arr, obj = self._containers(depth)
                self._generic[depth] = f"(?:{self.generic(0)}|{arr}|{obj})"
        return self._generic[depth]

    def _containers(self, depth: int) -> tuple[str, str]:
        """Any array and any object whose members are any values ``depth - 1`` deep."""
        value = self.generic(depth - 1)
        pair = text.string_regex() + self.COLON + value
        if self.spec:  # lock-step copies: see SPEC_GENERIC_DEPTH
            arr = self.OPEN_A + f"(?:(?:{value}{self.COMMA})*{value})?" + self.CLOSE_A
            obj = self.OPEN_O + f"(?:(?:{pair}{self.COMMA})*{pair})?" + self.CLOSE_O
            return arr, obj
        arr = self.OPEN_A + f"(?:{value}(?:{self.COMMA}{value})*)?" + self.CLOSE_A
        obj = self.OPEN_O + f"(?:{pair}(?:{self.COMMA}{pair})*)?" + self.CLOSE_O
        return arr, obj


_SUPPORTED = {
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "string": {"minLength", "maxLength", "pattern", "format", "__not_pattern__", "__and_pattern__"},
    "array": {"items", "prefixItems", "minItems", "maxItems", "unevaluatedItems", "uniqueItems", "contains",
              "minContains", "maxContains"},
    "object": {"properties", "required", "additionalProperties", "minProperties", "maxProperties", "unevaluatedProperties",
               "propertyNames", "patternProperties"},
}


def _tag_required(schema: dict) -> dict:
    """A oneOf / anyOf beside OpenAPI's ``discriminator`` (an annotation: Pydantic writes one for
    every discriminated union) with its ``propertyName`` required in each object branch (strict
    mode: a subset). Pydantic's validator reads the tag before anything else, so a branch whose
    tag has a default ({"type": "leaf"} left out) was valid JSON Schema it refused."""
    name = schema["discriminator"].get("propertyName")
    kind = "oneOf" if "oneOf" in schema else "anyOf" if "anyOf" in schema else None
    if not isinstance(name, str) or kind is None or not isinstance(schema[kind], list):
        return schema
    branches = []
    for b in schema[kind]:
        if isinstance(b, dict) and (not isinstance(b.get("required", []), list) or name in b.get("required", [])):
            branches.append(b)
        elif isinstance(b, dict):
            branches.append({**b, "required": [*b.get("required", []), name]})
        else:
            branches.append(b)
    return {**schema, kind: branches}


MAX_LISTED_MULTIPLES = 4096  # an integer multipleOf between bounds: at most this many multiples listed
# why a multipleOf was refused, and what is written instead
_MULTIPLE_OF_HELP = {
    "integer": (" (a multipleOf such as 3, 7 or 86400 is written only between a minimum and a maximum with at most "
                f"{MAX_LISTED_MULTIPLES} multiples between them; one dividing a power of ten, such as 2, 5, 25 or 100, "
                "with any bounds)"),
    "number": (" (a fractional multipleOf is written only as 1/k for a small k, such as 0.5, 0.25, 0.1 or 0.01, "
               "in strict mode; a whole one as for an integer)"),
}


def _bounded_multiples(schema: dict) -> list[int] | None:
    """The integers an integer schema's ``multipleOf`` (a whole number) allows between its bounds
    (minimum / maximum, exclusive or not), in order, where both bounds are there and at most
    ``MAX_LISTED_MULTIPLES`` lie between (minecraft's dimension heights: multiples of 16 in
    -2032..2031); else None (unbounded multiples are refused)."""
    m = schema.get("multipleOf")
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not nums.finite(m) or m <= 0 or m != int(m):
        return None
    exact = isinstance(m, int)  # a float m: validators divide float(n) by it, exact for |n| <= 2**53 only
    m = int(m)
    bounds = []
    for incl, excl, side in (("minimum", "exclusiveMinimum", 1), ("maximum", "exclusiveMaximum", -1)):
        limits = [(Fraction(schema[k]), k == excl) for k in (incl, excl)
                  if isinstance(schema.get(k), (int, float)) and not isinstance(schema.get(k), bool)
                  and nums.finite(schema[k])]
        if not limits:
            return None
        # the tighter bound (of equal values, the exclusive one)
        value, strict = max(limits) if side == 1 else min(limits, key=lambda vs: (vs[0], not vs[1]))
        whole = math.ceil(value) if side == 1 else math.floor(value)
        if strict and whole == value:
            whole += side
        bounds.append(whole)
    first, last = -(-bounds[0] // m) * m, bounds[1] // m * m
    if (last - first) // m + 1 > MAX_LISTED_MULTIPLES or not exact and max(abs(first), abs(last)) > 2**53:
        return None
    return list(range(first, last + 1, m))


def _integer_multiples(schema: dict) -> str | None:
    """The regex of the integers a whole ``multipleOf`` allows under the schema's bounds ("" for
    none), or None where they cannot be written: listed where both bounds hold at most
    ``MAX_LISTED_MULTIPLES`` of them (``_bounded_multiples``); else exactly, by their last
    digits, where the multipleOf divides a power of ten (5, 25, 100: Pydantic's
    ``multiple_of=5`` on an int, with no bound or one; an open side stops at 15 digits, as for
    any integer). Another (3, 7, 86400) with a side open is refused."""
    listed = _bounded_multiples(schema)
    if listed is not None:
        return "(?:" + "|".join(str(v) for v in listed) + ")" if listed else ""
    m = schema.get("multipleOf")
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not nums.finite(m) or m < 1 or m != int(m):
        return None
    try:
        lo, hi = nums.integer_bounds(schema)
    except nums.BoundsError:
        return None  # (a bound that is no finite number: refused where the integer is written)
    if isinstance(m, float) and any(b is not None and abs(b) > 2**53 for b in (lo, hi)):
        return None  # validators divide float(n) by a float m: exact for |n| <= 2**53 only
    return nums.decimal_multiples_regex(lo, hi, int(m))


def _is_lone_if(schema: dict) -> bool:
    return "if" in schema and "then" not in schema and "else" not in schema
