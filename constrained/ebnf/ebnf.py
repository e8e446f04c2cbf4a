"""EBNF grammars (the GBNF dialect of llama.cpp and xgrammar) compiled to treadle's regex.

A request may constrain its output with a grammar such as::

    root   ::= expr
    expr   ::= term (("+" | "-") term)*
    term   ::= [0-9]+ | "(" expr ")"

The grammar is parsed here and written as one regex of the dialect regex_text.py
documents, so it runs on the same token FSM as every other constraint (index, bitmask rows,
jump-forward, the GPU sampler). The syntax:

* rules ``name ::= body``; the output is the rule ``root``; a body may span lines (a rule
  ends where the next ``name ::=`` begins); ``#`` starts a comment;
* string literals ``"..."``, character classes ``[a-z_]`` / ``[^"\\\\]``, ``.`` (any
  character), rule references, grouping ``( )``, alternation ``|``, an empty alternative;
* quantifiers ``*``, ``+``, ``?``, ``{n}``, ``{n,}``, ``{n,m}``, ``{,m}`` (at most 256);
* escapes in literals and classes: ``\\n \\r \\t \\\\ \\" \\' \\[ \\] \\- \\^ \\/``,
  xgrammar's ``\\a \\b \\f \\v \\0 \\e \\?``, ``\\xHH``, ``\\uHHHH``, ``\\UHHHHHHHH``;
* as in llama.cpp, a quantifier may follow whitespace (``"a" *``), and a rule name may
  start with a digit.

**Recursion.** A regex cannot nest without bound, so recursion is handled in three ways:

* where a rule refers to itself at the very start or the very end of an alternative
  (``list ::= item "," list | item``, ``sum ::= sum "+" num | num``), that recursion is a
  loop: ``r ::= p r | r s | b`` becomes ``p* b s*``, with no depth limit (a leading or
  trailing group is opened first: ``list ::= (list ",")? item`` is ``item | list "," item``,
  ``ws ::= ([ \\t\\n] ws)?`` is ``[ \\t\\n] ws | ""``);
* what recursion is left (nesting such as ``"(" expr ")"``, rules that call each other)
  becomes **calls** (``calls=True``, as the compiler asks): a call target entered again
  inside its own expansion is a call placeholder, and its text is appended once as a
  definition (json_holes.py's ``with_definitions``), which the matcher runs as a stack of
  calls, so it nests to any depth (where those first expansions in place, nested in each
  other, pass ``MAX_REGEX_CHARS``, every reference to a target is a call). The targets: a recursive rule whose alternatives do not
  all nest has those that do split off (``factor ::= [0-9]+ | "(" expr ")"`` calls only
  ``"(" expr ")"``), and in an alternative that nests, the stretch between the literals
  around the nesting is a rule of its own (``name "(" args ")"`` may call ``"(" args
  ")"``); then, per group of rules that reach each other, up to three that break
  every cycle, chosen so that the fewest byte pairs can cross a call's boundary (the other
  rules expand in place). A token that crosses mid-token costs a walk per mask row, so a
  call that starts and ends at brackets, not at letters, keeps masks fast. A rule with no
  finite text matches nothing (a grammar left with nothing is an error); a call to a rule
  that may be empty is optional at its site; ebnf_calls.py computes the bytes around
  calls, which bound the tokens a mask must walk;
* where calls cannot run (left recursion through other rules, more than 16 called rules,
  a literal in the placeholders' code points, or for the compiler, too many tokens that
  would cross a call's boundary other than by only starting it), or without ``calls``, it
  unrolls ``max_recursion_depth`` levels (default 3, like JSON schema ``$ref`` cycles under
  a whitespace pattern): a rule may be entered again at most that many times while it is
  already being expanded. Deeper nesting is not generated (the regex allows a subset of the
  grammar, never more); a grammar that cannot finish within the limit is an error, as is
  one whose unrolled regex grows past ``MAX_REGEX_CHARS``.

Every problem is an ``EbnfError`` (a ``ValueError``) naming the line and column or the rule.
Importing this module does not import torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Union

from treadle.constrained.index.json_holes import CALL_CHARS, MAX_CALLS, PLACEHOLDER_RANGE, with_definitions
from treadle.constrained.regex.regex_text import MAX_REPEAT, class_literal, escape_literal

__all__ = ["EbnfError", "Grammar", "call_boundaries", "ebnf_to_regex", "parse_ebnf", "MAX_REGEX_CHARS"]

MAX_REGEX_CHARS = 200_000  # an unrolled grammar longer than this is refused (its DFA build would take minutes)
MAX_CUT_WORK = 200_000  # rules and references looked at choosing call targets (_Emitter._call_targets)
cut_work = 0  # that work, summed over this process (for tests: a count, not a bound)
_NAME_START = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789")  # llama.cpp: 2digit
_NAME_CHARS = _NAME_START | set("-")
# llama.cpp's escapes, and xgrammar's C-style ones (\a \b \f \v \0 \e \?)
_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "'": "'", "[": "[", "]": "]",
                   "-": "-", "^": "^", "/": "/", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "0": "\0",
                   "e": "\x1b", "?": "?"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
# vLLM's guided_grammar may be Lark (name: body, ?rule, %import): not this dialect
_LARK = ("; this looks like a Lark grammar, which is not supported: GBNF rules are written "
         "'name ::= body', the output is rule 'root', and terminals are string literals or [classes]")
_XGRAMMAR_MACROS = ("TagDispatch",)  # xgrammar's built-in functions, written name(args, key=value)
_RESERVED = 0x100000  # the first code point of the range grammars never generate (index_markers.py)


class EbnfError(ValueError):
    """The grammar text is malformed, refers to an undefined rule, or cannot be compiled."""


# ---------------------------------------------------------------------------- the tree


@dataclass(frozen=True, slots=True)
class Lit:
    text: str


@dataclass(frozen=True, slots=True)
class Cls:
    """A character class: the code-point ranges (inclusive), or everything but them."""
    negated: bool
    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Ref:
    name: str
    line: int
    col: int


@dataclass(frozen=True, slots=True)
class Seq:
    items: tuple["Node", ...]


@dataclass(frozen=True, slots=True)
class Alt:
    items: tuple["Node", ...]


@dataclass(frozen=True, slots=True)
class Rep:
    item: "Node"
    min: int
    max: int | None  # None: unbounded


Node = Union[Lit, Cls, Ref, Seq, Alt, Rep]
ANY = Cls(True, ())  # "." : every code point


@dataclass(frozen=True, slots=True)
class Grammar:
    rules: dict[str, Node]
    root: str


# ---------------------------------------------------------------------------- the parser


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def error(self, msg: str, at: int | None = None) -> EbnfError:
        at = self.i if at is None else at
        line = self.s.count("\n", 0, at) + 1
        col = at - (self.s.rfind("\n", 0, at) + 1) + 1
        return EbnfError(f"ebnf: line {line} col {col}: {msg}")

    def where(self, at: int) -> tuple[int, int]:
        return self.s.count("\n", 0, at) + 1, at - (self.s.rfind("\n", 0, at) + 1) + 1

    def skip(self) -> None:
        s, n = self.s, len(self.s)
        while self.i < n:
            c = s[self.i]
            if c in " \t\r\n":
                self.i += 1
            elif c == "#":
                end = s.find("\n", self.i)
                self.i = n if end < 0 else end + 1
            else:
                return

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def name(self) -> str:
        start = self.i
        if self.peek() not in _NAME_START or not self.peek():
            raise self.error("expected a rule name")
        while self.i < len(self.s) and self.s[self.i] in _NAME_CHARS:
            self.i += 1
        return self.s[start:self.i]

    def at_rule_start(self) -> bool:
        """Whether a ``name ::=`` begins here (it ends the rule before it)."""
        save = self.i
        try:
            if not self.peek() or self.peek() not in _NAME_START:
                return False
            self.name()
            self.skip()
            return self.s.startswith("::=", self.i)
        finally:
            self.i = save

    def grammar(self) -> dict[str, Node]:
        rules: dict[str, Node] = {}
        self.skip()
        if self.i >= len(self.s):
            raise self.error("the grammar is empty")
        while self.i < len(self.s):
            start = self.i
            if self.peek() in ("?", "!", "%"):  # Lark's ?rule, !rule, %import, %ignore
                raise self.error("expected a rule name" + _LARK)
            name = self.name()
            self.skip()
            if not self.s.startswith("::=", self.i):
                lark = _LARK if self.peek() == ":" else ""
                raise self.error(f"expected '::=' after the rule name {name!r}" + lark)
            self.i += 3
            if name in rules:
                raise self.error(f"rule {name!r} is defined twice", start)
            rules[name] = self.alternation(top=True)
            self.skip()
        return rules

    def alternation(self, top: bool) -> Node:
        items = [self.sequence(top)]
        while self.peek() == "|":
            self.i += 1
            items.append(self.sequence(top))
        return items[0] if len(items) == 1 else Alt(tuple(items))

    def sequence(self, top: bool) -> Node:
        items: list[Node] = []
        while True:
            self.skip()
            c = self.peek()
            if not c or c in "|)" or (top and self.at_rule_start()):
                break
            items.append(self.quantified(self.primary()))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def primary(self) -> Node:
        c = self.peek()
        start = self.i
        if c == '"':
            self.i += 1
            out = []
            while True:
                if self.i >= len(self.s) or self.s[self.i] == "\n":
                    raise self.error("unterminated string literal", start)
                ch = self.s[self.i]
                if ch == '"':
                    self.i += 1
                    return Lit("".join(out))
                out.append(self.char())
        if c == "[":
            return self.char_class()
        if c == ".":
            self.i += 1
            return ANY
        if c == "(":
            self.i += 1
            self.skip()
            if self.peek() == "=":  # xgrammar's "rule ::= body (= follow)": a restriction treadle cannot enforce
                raise self.error("xgrammar's lookahead assertion '(= ...)' is not supported (treadle cannot enforce "
                                 "it); remove it where what follows the rule already implies it", start)
            inner = self.alternation(top=False)
            self.skip()
            if self.peek() != ")":
                raise self.error("expected ')' to close the group opened", start)
            self.i += 1
            return inner
        if c in _NAME_START:
            name = self.name()
            if name in _XGRAMMAR_MACROS and self.peek() == "(":
                raise self.error(f"xgrammar's {name}(...) macro is not supported; write its tags as rules", start)
            line, col = self.where(start)
            return Ref(name, line, col)
        if c == "'":
            raise self.error("string literals take double quotes")
        if c == "/":
            raise self.error("unexpected '/' (a /regex/ terminal" + _LARK + ")")
        token = re.match(r"!?<(?:\[[0-9]+\]|[^<>\s\"]+)>", self.s[self.i:]) if c in "<!" else None
        if token:  # llama.cpp's token constraints: <think>, <[151643]>, !<[151643]>
            raise self.error(f"llama.cpp's token reference {token.group(0)!r} is not supported (it matches one token "
                             "of the model's vocabulary by its id or text, not text a tokenizer may split); write "
                             "the text it stands for as a string literal")
        raise self.error(f"unexpected {c!r}")

    def char(self) -> str:
        """One (possibly escaped) character of a literal or class."""
        ch = self.s[self.i]
        if ch != "\\":
            self.i += 1
            return ch
        start = self.i
        if self.i + 1 >= len(self.s):
            raise self.error("a backslash ends the grammar")
        e = self.s[self.i + 1]
        if e in _SIMPLE_ESCAPES:
            self.i += 2
            return _SIMPLE_ESCAPES[e]
        if e in _HEX_ESCAPES:
            n = _HEX_ESCAPES[e]
            digits = self.s[self.i + 2:self.i + 2 + n]
            if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"'\\{e}' needs {n} hex digits", start)
            cp = int(digits, 16)
            if cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
                raise self.error(f"'\\{e}{digits}' is not a Unicode scalar value", start)
            self.i += 2 + n
            return chr(cp)
        raise self.error(f"unknown escape '\\{e}'", start)

    def char_class(self) -> Cls:
        start = self.i
        self.i += 1
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        while True:
            if self.i >= len(self.s):
                raise self.error("unterminated character class", start)
            if self.s[self.i] == "]":
                self.i += 1
                break
            lo = self.char()
            hi = lo
            if self.peek() == "-" and self.i + 1 < len(self.s) and self.s[self.i + 1] != "]":
                self.i += 1
                hi = self.char()
                if ord(hi) < ord(lo):
                    raise self.error(f"class range {lo!r}-{hi!r} is reversed", start)
            ranges.append((ord(lo), ord(hi)))
        if not ranges and not negated:
            raise self.error("empty character class", start)
        if not negated:  # U+100000-U+10FFFF is never generated (index_markers.py): [\x00-\U0010FFFF] stops before
            ranges = [(lo, min(hi, _RESERVED - 1)) if lo < _RESERVED else (lo, hi) for lo, hi in ranges]
        else:  # and leaving it out changes nothing: [^"\U0010FFFF] is [^"]
            ranges = [(lo, min(hi, _RESERVED - 1)) for lo, hi in ranges if lo < _RESERVED]
            at = 0  # the first code point below U+100000 the class may match (past the surrogates)
            for lo, hi in sorted(ranges + [(0xD800, 0xDFFF)]):
                if lo > at:
                    break
                at = max(at, hi + 1)
            if at >= _RESERVED:
                raise self.error("the class matches no character a grammar generates (only code points of "
                                 "U+100000-U+10FFFF, which are reserved, or surrogates)", start)
        return Cls(negated, tuple(sorted(set(ranges))))

    def quantified(self, node: Node) -> Node:
        while True:
            save = self.i
            self.skip()  # llama.cpp reads '"a" *' as '"a"*'
            c = self.peek()
            if c == "*":
                lo, hi = 0, None
            elif c == "+":
                lo, hi = 1, None
            elif c == "?":
                lo, hi = 0, 1
            elif c == "{":
                lo, hi = self.braces()
                node = Rep(node, lo, hi)
                continue
            else:
                self.i = save
                return node
            self.i += 1
            node = Rep(node, lo, hi)

    def braces(self) -> tuple[int, int | None]:
        start = self.i
        end = self.s.find("}", self.i)
        if end < 0:
            raise self.error("unterminated '{' quantifier", start)
        body = self.s[self.i + 1:end].replace(" ", "")
        self.i = end + 1
        lo_s, comma, hi_s = body.partition(",")
        if not (lo_s.isdigit() or (lo_s == "" and comma)) or not (hi_s.isdigit() or hi_s == ""):
            raise self.error(f"bad quantifier '{{{body}}}'", start)
        lo = int(lo_s) if lo_s else 0
        hi = int(hi_s) if hi_s else (None if comma else lo)
        if hi is not None and hi < lo:
            raise self.error(f"quantifier '{{{body}}}': the maximum is below the minimum", start)
        if lo > MAX_REPEAT or (hi is not None and hi > MAX_REPEAT):
            raise self.error(f"quantifier '{{{body}}}': counts above {MAX_REPEAT} are not supported", start)
        return lo, hi


def parse_ebnf(text: str, root: str = "root") -> Grammar:
    """Parse ``text``; raises ``EbnfError`` on bad syntax, an undefined rule or no ``root``."""
    if not isinstance(text, str) or not text.strip():
        raise EbnfError("ebnf: the grammar is empty")
    try:
        rules = _Parser(text).grammar()
    except RecursionError:
        raise EbnfError("ebnf: the grammar's groups nest too deeply to parse") from None
    if root not in rules:
        raise EbnfError(f"ebnf: no rule named {root!r} (the output is that rule)")
    for name, body in rules.items():
        for ref in _refs(body):
            if ref.name not in rules:
                raise EbnfError(f"ebnf: line {ref.line} col {ref.col}: rule {ref.name!r} is used in {name!r} "
                                "but never defined")
    return Grammar(rules, root)


def _refs(node: Node) -> list[Ref]:
    if isinstance(node, Ref):
        return [node]
    if isinstance(node, (Seq, Alt)):
        return [r for item in node.items for r in _refs(item)]
    if isinstance(node, Rep):
        return _refs(node.item)
    return []


# ---------------------------------------------------------------------------- to a regex


def _sccs(graph: dict[str, set[str]]) -> dict[str, frozenset[str]]:
    """Each rule's strongly connected component (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: dict[str, frozenset[str]] = {}
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                fc = frozenset(comp)
                for w in comp:
                    out[w] = fc
    return out


def _recursion(graph: dict[str, set[str]]) -> tuple[dict[str, frozenset[str]], set[str]]:
    """Each rule's strongly connected component, and the recursive rules: those in a
    component of several, or referring to themselves."""
    scc = _sccs(graph)
    return scc, {n for n in graph if len(scc[n]) > 1 or n in graph[n]}


def _at_edge(name: str, node: Node, end: int) -> bool:
    """Whether ``node`` may begin (end 0) or end (end -1) with a reference to ``name`` through
    groups, alternatives and optional items (``(name ",")?``, ``("," name)?``, ``("a" | name)``)."""
    if isinstance(node, Ref):
        return node.name == name
    if isinstance(node, Seq):
        return bool(node.items) and _at_edge(name, node.items[end], end)
    if isinstance(node, Alt):
        return any(_at_edge(name, x, end) for x in node.items)
    if isinstance(node, Rep):
        return node.max == 1 and _at_edge(name, node.item, end)
    return False


def _opened(name: str, alt: Node, end: int, limit: int = 64) -> list[Node]:
    """``alt`` as alternatives, its leading (end 0) or trailing (end -1) group opened where
    rule ``name`` may begin or end with itself through it, so that ``_as_loop`` sees the left
    or right recursion: ``(a | r) s`` is ``a s | r s``, ``(r ",")? t`` is ``t | r "," t``;
    ``p ("," r)?`` is ``p | p "," r``, ``ws ::= ([ \\t\\n] ws)?`` is ``[ \\t\\n] ws | ""`` (a loop,
    not a call per character). ``[alt]`` otherwise, or past ``limit`` forms."""
    forms, changed = [alt], True
    while changed:
        changed, out = False, []
        for a in forms:
            items = list(a.items) if isinstance(a, Seq) else [a]
            edge = items[end] if items else None
            if edge is None or isinstance(edge, Ref) or not _at_edge(name, edge, end):
                out.append(a)
                continue
            if isinstance(edge, Alt):
                options = edge.items
            elif isinstance(edge, Rep):
                options = (edge.item,) if edge.min else (Seq(()), edge.item)
            else:  # a Seq: a group of items
                options = (edge,)
            for o in options:
                inner = list(o.items) if isinstance(o, Seq) else [o]
                new = inner + items[1:] if end == 0 else items[:-1] + inner
                out.append(new[0] if len(new) == 1 else Seq(tuple(new)))
            changed = True
        if len(out) > limit:
            return [alt]
        forms = out
    return forms


def _as_loop(name: str, body: Node) -> Node | None:
    """``body`` of rule ``name`` with the recursion at the very start or end of its
    alternatives turned into loops: ``r ::= p r | r s | b`` becomes ``p* b s*`` (a leading
    group through which ``r`` begins with itself is opened first: ``_opened``). Other
    references to ``name`` (nested inside ``p``, ``s`` or ``b``) are kept, and unroll later.
    None when no alternative starts or ends with ``name``."""
    alts = [g for alt in (body.items if isinstance(body, Alt) else (body,)) for f in _opened(name, alt, 0)
            for g in _opened(name, f, -1)]
    prefixes, bases, suffixes = [], [], []
    for alt in alts:
        items = list(alt.items) if isinstance(alt, Seq) else [alt]
        if not items:  # an empty alternative
            bases.append(alt)
            continue
        first = isinstance(items[0], Ref) and items[0].name == name
        last = isinstance(items[-1], Ref) and items[-1].name == name
        if len(items) == 1 and first:
            continue  # "r ::= r | ..." adds nothing
        if first:
            suffixes.append(Seq(tuple(items[1:])) if len(items) > 2 else items[1])
        elif last:
            prefixes.append(Seq(tuple(items[:-1])) if len(items) > 2 else items[0])
        else:
            bases.append(alt)
    if not prefixes and not suffixes:
        return None
    if not bases:
        return Alt(())  # every alternative recurses: the rule matches nothing
    parts: list[Node] = []
    if prefixes:
        parts.append(Rep(prefixes[0] if len(prefixes) == 1 else Alt(tuple(prefixes)), 0, None))
    parts.append(bases[0] if len(bases) == 1 else Alt(tuple(bases)))
    if suffixes:
        parts.append(Rep(suffixes[0] if len(suffixes) == 1 else Alt(tuple(suffixes)), 0, None))
    return parts[0] if len(parts) == 1 else Seq(tuple(parts))


# A regex fragment and how tightly it binds: 4 an atom, 3 a quantified atom, 2 a
# concatenation, 1 an alternation.
_Frag = tuple[str, int]
ATOM, QUANTIFIED, CONCAT, ALTERNATION = 4, 3, 2, 1


def _wrap(f: _Frag, need: int) -> str:
    return f[0] if f[1] >= need else f"(?:{f[0]})"


class _NoCalls(Exception):
    """The grammar cannot run its recursion as calls: it unrolls instead."""


class _TooLarge(EbnfError):
    """A rule's regex passed ``MAX_REGEX_CHARS``."""


def _split_recursive(rules: dict[str, Node]) -> dict[str, Node]:
    """With calls, rules of their own for the parts of recursive rules that nest, so that a
    call can be placed there, where the first and last bytes are few:

    * a rule whose alternatives do not all nest keeps those that do in ``n#rec``
      (``sexp ::= atom | "(" sexp* ")"`` becomes ``sexp ::= atom | sexp#rec``);
    * in an alternative that nests, the stretch from the literal before the nesting to the
      literal after it becomes ``n#inK`` (``expr ::= name "(" args ")"``, ``args`` reaching
      ``expr``, becomes ``expr ::= name expr#in0``, ``expr#in0 ::= "(" args ")"``)."""
    scc, recursive = _recursion({n: {r.name for r in _refs(b)} for n, b in rules.items()})
    out = dict(rules)
    for name, body in rules.items():
        if name not in recursive:
            continue
        comp = scc[name]
        alts = body.items if isinstance(body, Alt) else (body,)
        nests = [any(r.name in comp for r in _refs(x)) for x in alts]
        alts = tuple(_bracketed(x, comp, name, out) if n else x for x, n in zip(alts, nests))
        if isinstance(body, Alt) and any(nests) and not all(nests):
            rec = tuple(x for x, n in zip(alts, nests) if n)
            out[f"{name}#rec"] = rec[0] if len(rec) == 1 else Alt(rec)
            out[name] = Alt(tuple(x for x, n in zip(alts, nests) if not n) + (Ref(f"{name}#rec", 0, 0),))
        elif isinstance(body, Alt):
            out[name] = Alt(alts)
        else:
            out[name] = alts[0]
    return out


def _shape(node: Node) -> object:
    """``node`` without the positions of its references: equal for equal text."""
    if isinstance(node, Ref):
        return ("ref", node.name)
    if isinstance(node, (Seq, Alt)):
        return (type(node).__name__, tuple(_shape(x) for x in node.items))
    if isinstance(node, Rep):
        return ("rep", _shape(node.item), node.min, node.max)
    return node


def _bracketed(alt: Node, comp: frozenset[str], name: str, out: dict[str, Node]) -> Node:
    """``alt`` with each stretch of its items from the last literal before an item that nests
    to the first literal after it as a rule of its own (added to ``out``), when that stretch
    is not the whole of ``alt``. Items that nest with no literal between them share a
    stretch; a last group that nests with no literal after it (C's ``("else" "{" stmt* "}")?``)
    is bracketed inside. Equal stretches share one rule (``"{" stmt* "}"`` after ``while``,
    ``for``, ``if`` and ``else``), so a single call target can break every cycle."""
    if isinstance(alt, Rep) and alt.item is not None:
        inner = _bracketed(alt.item, comp, name, out)
        return alt if inner is alt.item else Rep(inner, alt.min, alt.max)
    if not isinstance(alt, Seq):
        return alt
    items = alt.items
    nest = [i for i, x in enumerate(items) if any(r.name in comp for r in _refs(x))]
    lit = [i for i, x in enumerate(items) if isinstance(x, Lit) and x.text]
    if not nest:
        return alt
    spans: list[list[int]] = []  # [first nesting item, last nesting item] with no literal between
    for i in nest:
        if spans and not any(spans[-1][1] < j < i for j in lit):
            spans[-1][1] = i
        else:
            spans.append([i, i])
    stretches: list[tuple[int, int, Node | None]] = []  # (start, end, replacement or None: the items)
    for lo, hi in spans:
        a = max((j for j in lit if j < lo), default=None)
        b = min((j for j in lit if j > hi), default=None)
        if a is None or b is None:
            if lo == hi == len(items) - 1 and isinstance(items[lo], (Rep, Seq)):
                inner = _bracketed(items[lo], comp, name, out)
                if inner is not items[lo]:
                    stretches.append((lo, lo, inner))
                    continue
            return _bracketed_whole(alt, comp, name, out)
        if stretches and a <= stretches[-1][1]:  # overlapping stretches (at a shared literal) merge
            if stretches[-1][2] is not None:
                return _bracketed_whole(alt, comp, name, out)
            stretches[-1] = (stretches[-1][0], b, None)
        else:
            stretches.append((a, b, None))
    if len(stretches) == 1 and stretches[0][:2] == (0, len(items) - 1) and stretches[0][2] is None:
        return alt
    new: list[Node] = []
    at = 0
    for a, b, repl in stretches:
        new.extend(items[at:a])
        new.append(repl if repl is not None else _inner_rule(Seq(items[a:b + 1]), name, out))
        at = b + 1
    new.extend(items[at:])
    return Seq(tuple(new))


def _bracketed_whole(alt: Seq, comp: frozenset[str], name: str, out: dict[str, Node]) -> Node:
    """The one stretch from the literal before the first item that nests to the literal after
    the last (``alt`` itself when there is none, or it is the whole)."""
    items = alt.items
    nest = [i for i, x in enumerate(items) if any(r.name in comp for r in _refs(x))]
    lit = [i for i, x in enumerate(items) if isinstance(x, Lit) and x.text]
    a = max((i for i in lit if i < nest[0]), default=None)
    b = min((i for i in lit if i > nest[-1]), default=None)
    if a is None or b is None or (a, b) == (0, len(items) - 1):
        return alt
    return Seq(items[:a] + (_inner_rule(Seq(items[a:b + 1]), name, out),) + items[b + 1:])


def _inner_rule(body: Seq, name: str, out: dict[str, Node]) -> Ref:
    """A reference to a rule ``name#inK`` of ``body``: one already made with an equal body, or
    a new one."""
    shape = _shape(body)
    for n, b in out.items():
        if "#in" in n and _shape(b) == shape:
            return Ref(n, 0, 0)
    inner = f"{name}#in{sum(n.startswith(name + '#in') for n in out)}"
    out[inner] = body
    return Ref(inner, 0, 0)


def _inline_tails(rules: dict[str, Node]) -> dict[str, Node]:
    """Each rule with an alternative that is only a reference to another rule whose
    alternatives begin or end with the first (``factor ::= ... | unary``, ``unary ::= "-"
    factor``) given that rule's alternatives in its place (``factor ::= ... | "-" factor``),
    so that ``_as_loop`` makes the recursion a loop. The same language: a rule's body for a
    reference to it."""
    out = dict(rules)
    for name, body in rules.items():
        alts = body.items if isinstance(body, Alt) else (body,)
        new: list[Node] = []
        changed = False
        for x in alts:
            q = rules.get(x.name) if isinstance(x, Ref) and x.name != name else None
            if q is not None:
                q_alts = q.items if isinstance(q, Alt) else (q,)
                ends = [(y.items[0], y.items[-1]) if isinstance(y, Seq) and y.items else (y, y) for y in q_alts]
                if any(isinstance(e, Ref) and e.name == name for pair in ends for e in pair):
                    new.extend(q_alts)
                    changed = True
                    continue
            new.append(x)
        if changed:
            out[name] = new[0] if len(new) == 1 else Alt(tuple(new))
    return out


class _Emitter:
    def __init__(self, grammar: Grammar, max_depth: int, calls: bool = False, eager: bool = False) -> None:
        self.rules = {n: (_as_loop(n, b) or b) for n, b in _inline_tails(grammar.rules).items()}
        if calls:
            self.rules = _split_recursive(self.rules)
        self.max_depth = max_depth
        graph = {n: {r.name for r in _refs(b)} for n, b in self.rules.items()}
        # rules still recursive after the loop rewrite: they unroll, or with calls, are called
        self.scc, self.unrolled = _recursion(graph)
        self.memo: dict[tuple, _Frag | None] = {}
        self.calls = calls and bool(self.unrolled)
        self.eager = eager  # every reference to a call target is a call, not only those inside it
        self.defs: dict[str, int] = {}  # called rule -> its definition's index (CALL_CHARS)
        if self.calls:
            from treadle.constrained.ebnf.ebnf_calls import Analysis

            self.analysis = Analysis(self.rules)
            if self.analysis.left_recursive(self.unrolled) or _names_reserved(self.rules):
                raise _NoCalls
            self.targets = self._call_targets(graph)

    def _call_targets(self, graph: dict[str, set[str]]) -> set[str]:
        """The recursive rules that become calls when entered again; the others are expanded
        in place (every cycle passes a target, so that ends). Per component, of the sets of up
        to 3 rules that break every cycle, the one whose boundaries let the fewest byte pairs
        cross (before x first, last x after: the tokens a mask walks, json_holes.py); else
        the whole component. The search stops at ``MAX_CUT_WORK`` (rules and references
        looked at, over all checks: a cycle of 300 rules tried 180,000 pairs, minutes),
        keeping the best set found by then."""
        from itertools import combinations

        global cut_work
        order = {n: i for i, n in enumerate(self.rules)}
        out: set[str] = set()
        work = 0
        for comp in sorted({self.scc[n] for n in self.unrolled}, key=len):
            names = sorted(comp, key=order.__getitem__)
            size = len(comp) + sum(len(graph[n] & comp) for n in comp)  # one check's work
            best: tuple[tuple[int, int], tuple[str, ...]] | None = None
            for k in range(1, min(3 if len(names) <= 24 else 2, len(names)) + 1):
                if work + size > MAX_CUT_WORK:
                    break
                for cut in combinations(names, k):
                    if work + size > MAX_CUT_WORK:
                        break
                    work += size
                    cut_work += size
                    rest = comp - set(cut)
                    if not _recursion({n: graph[n] & rest for n in rest})[1]:  # no cycle left
                        b, f, la, a = self.analysis.boundaries(set(cut))
                        cost = (len(b) * len(f) + len(la) * len(a), k)
                        if best is None or cost < best[0]:
                            best = (cost, cut)
            out |= set(best[1]) if best is not None else comp
        return out

    def call(self, name: str, active: dict[str, int]) -> _Frag | None:
        """A reference to a recursive rule, with calls: a call where the rule is being
        expanded already, else its body with the rule active. A rule with no finite text
        matches nothing; a call to one that may be empty is optional at its site."""
        if name not in self.analysis.productive:
            return None
        if active.get(name) or self.eager:
            i = self.defs.setdefault(name, len(self.defs))
            if i >= MAX_CALLS:
                raise _NoCalls
            return (CALL_CHARS[i] + "?", QUANTIFIED) if name in self.analysis.nullable else (CALL_CHARS[i], ATOM)
        key = (name, frozenset(r for r in self.scc[name] if active.get(r)))
        if key in self.memo:
            return self.memo[key]
        active[name] = 1
        try:
            out = self.node(self.rules[name], active)
        finally:
            active[name] = 0
        self.memo[key] = out
        return out

    def emit(self, root: str) -> _Frag | None:
        """The root's regex, with the definitions of the calls it makes appended (json_holes.py)."""
        out = self.definition(root) if root in self.targets else self.rule(root, {})
        if out is None or not self.defs:
            return out
        texts: list[str] = []
        while len(texts) < len(self.defs):  # a definition may call rules not called before
            name = next(n for n, i in self.defs.items() if i == len(texts))
            texts.append(self.definition(name)[0])  # type: ignore[index]  # productive: not None
        return with_definitions(out[0], texts), ALTERNATION

    def definition(self, name: str) -> _Frag | None:
        """A call target's text: its body, with the rule active (entered again, it is a call)."""
        if name not in self.analysis.productive:
            return None
        return self.node(self.rules[name], {name: 1})

    def inline(self, name: str, active: dict[str, int]) -> _Frag | None:
        """A recursive rule that is not a call target, with calls: its body in place."""
        if name not in self.analysis.productive:
            return None
        key = (name, frozenset(r for r in self.scc[name] if active.get(r)))
        if key not in self.memo:
            self.memo[key] = self.node(self.rules[name], active)
        return self.memo[key]

    def rule(self, name: str, active: dict[str, int]) -> _Frag | None:
        if self.calls and name in self.unrolled:
            out = self.call(name, active) if name in self.targets else self.inline(name, active)
            if out is not None and len(out[0]) > MAX_REGEX_CHARS:  # (expansions of targets nested in each other)
                raise _TooLarge(f"ebnf: rule {name!r} is a regex of {len(out[0])} characters, over the "
                                f"{MAX_REGEX_CHARS} supported; flatten the grammar")
            return out
        comp = self.scc[name] if name in self.unrolled else frozenset()
        key = (name, tuple(sorted((r, active[r]) for r in comp if active.get(r))))
        if key in self.memo:
            return self.memo[key]
        if name in self.unrolled:
            if active.get(name, 0) > self.max_depth:
                return None
            active[name] = active.get(name, 0) + 1
            try:
                out = self.node(self.rules[name], active)
            finally:
                active[name] -= 1
        else:
            out = self.node(self.rules[name], active)
        if out is not None and len(out[0]) > MAX_REGEX_CHARS:
            if self.calls:
                raise _TooLarge(f"ebnf: rule {name!r} is a regex of {len(out[0])} characters, over the "
                                f"{MAX_REGEX_CHARS} supported; flatten the grammar")
            if not self.unrolled:  # no recursion: the rules' own text is too long
                raise _TooLarge(f"ebnf: rule {name!r} is a regex of {len(out[0])} characters, over the "
                                f"{MAX_REGEX_CHARS} supported; shorten the grammar (its literals, or rules "
                                "used many times inside each other)")
            raise _TooLarge(f"ebnf: rule {name!r} unrolled {self.max_depth} levels of recursion is a regex of "
                            f"{len(out[0])} characters, over the {MAX_REGEX_CHARS} supported; lower the "
                            "nesting or the recursion depth")
        self.memo[key] = out
        return out

    def node(self, node: Node, active: dict[str, int]) -> _Frag | None:
        """``node`` as a regex fragment; None when it matches nothing (recursion cut off)."""
        if isinstance(node, Lit):
            return escape_literal(node.text), ATOM if len(node.text) <= 1 else CONCAT
        if isinstance(node, Cls):
            # with calls, no class may match a placeholder: a state where a class and a call
            # are both possible must offer the call (json_holes.py's canary would hide it)
            hide = PLACEHOLDER_RANGE if self.calls and node.negated else ""
            if node.negated and not node.ranges:
                return rf"(?:[^\n{hide}]|\n)", ATOM
            if not node.negated and len(node.ranges) == 1 and node.ranges[0][0] == node.ranges[0][1]:
                return escape_literal(chr(node.ranges[0][0])), ATOM
            lit = class_literal
            parts = "".join(lit(chr(lo)) if lo == hi else f"{lit(chr(lo))}-{lit(chr(hi))}" for lo, hi in node.ranges)
            return f"[{'^' if node.negated else ''}{parts}{hide}]", ATOM
        if isinstance(node, Ref):
            return self.rule(node.name, active)
        if isinstance(node, Seq):
            frags = []
            for item in node.items:
                f = self.node(item, active)
                if f is None:
                    return None
                if f[0]:
                    frags.append(f)
            if len(frags) <= 1:
                return frags[0] if frags else ("", ATOM)
            return "".join(_wrap(f, CONCAT) for f in frags), CONCAT
        if isinstance(node, Alt):
            frags = [f for f in (self.node(x, active) for x in node.items) if f is not None]
            if not frags:
                return None
            unique = list({f[0]: f for f in frags}.values())
            if len(unique) == 1:
                return unique[0]
            rest = [f for f in unique if f[0]]
            if len(rest) < len(unique):  # an empty alternative: the rest is optional
                inner = rest[0] if len(rest) == 1 else ("|".join(f[0] for f in rest), ALTERNATION)
                return _wrap(inner, ATOM) + "?", QUANTIFIED
            return "|".join(f[0] for f in unique), ALTERNATION
        if isinstance(node, Rep):
            f = self.node(node.item, active)
            if f is None:
                return ("", ATOM) if node.min == 0 else None
            if not f[0] or (node.min, node.max) == (1, 1):
                return f
            q = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((node.min, node.max))
            if q is None:
                hi = "" if node.max is None else node.max
                q = f"{{{node.min}}}" if node.max == node.min else f"{{{node.min},{hi}}}"
            if node.max == 0:
                return "", ATOM
            return _wrap(f, ATOM) + q, QUANTIFIED
        raise TypeError(f"not an EBNF node: {node!r}")


def _names_reserved(rules: dict[str, Node]) -> bool:
    """Whether a literal or class names a code point of U+100000-U+10FFFF (index_markers.py),
    where the call placeholders are: such a grammar unrolls, and its regex is refused."""
    def bad(node: Node) -> bool:
        if isinstance(node, Lit):
            return any(ord(c) >= _RESERVED for c in node.text)
        if isinstance(node, Cls):
            return any(hi >= _RESERVED for _, hi in node.ranges)
        if isinstance(node, (Seq, Alt)):
            return any(map(bad, node.items))
        if isinstance(node, Rep):
            return bad(node.item)
        return False

    return any(map(bad, rules.values()))


def ebnf_to_regex(text: str, *, root: str = "root", max_recursion_depth: int = 3, calls: bool = False) -> str:
    """The regex (regex_text.py's dialect) matching exactly the outputs ``text`` allows, with
    nesting recursion unrolled ``max_recursion_depth`` levels, or with ``calls`` run as calls
    to any depth where the grammar allows (module docstring)."""
    if max_recursion_depth < 0:
        raise EbnfError("ebnf: max_recursion_depth must be >= 0")
    if calls:
        planned = _with_calls(text, root)
        if planned is not None:
            return planned[0]
    emitter = _Emitter(parse_ebnf(text, root), max_recursion_depth)
    try:
        out = emitter.rule(root, {})
    except RecursionError:
        if not emitter.unrolled:  # no recursion: a long chain of rules, each used inside the one before
            raise EbnfError(f"ebnf: rule {root!r} expands too deeply: it reaches rules "
                            f"{_chain_depth(emitter.rules, root)} references deep (rules within rules), over "
                            "the supported (about 150); flatten the grammar") from None
        raise EbnfError(f"ebnf: rule {root!r} expands too deeply (rules within rules, with recursion unrolled "
                        f"{max_recursion_depth} levels); lower the recursion depth or flatten the grammar") from None
    if out is None:
        raise EbnfError(f"ebnf: rule {root!r} matches nothing within {max_recursion_depth} levels of recursion "
                        "(does some rule recurse without a way to stop?)")
    if not out[0]:
        raise EbnfError(f"ebnf: rule {root!r} matches only the empty string")
    if len(out[0]) > MAX_REGEX_CHARS:
        raise EbnfError(f"ebnf: the grammar unrolled {max_recursion_depth} levels of recursion is a regex of "
                        f"{len(out[0])} characters, over the {MAX_REGEX_CHARS} supported; lower the nesting "
                        "or the recursion depth")
    return out[0]


def _chain_depth(rules: dict[str, Node], root: str) -> int:
    """The longest chain of rule references from ``root`` (rules with no recursion: a DAG),
    counted without recursion."""
    depth: dict[str, int] = {}
    todo: list[tuple[str, bool]] = [(root, False)]
    while todo:
        name, done = todo.pop()
        refs = {r.name for r in _refs(rules[name])}
        if done:
            depth[name] = 1 + max((depth.get(r, 0) for r in refs), default=0)
        elif name not in depth:
            todo.append((name, True))
            todo.extend((r, False) for r in refs if r not in depth)
    return depth[root] - 1


@lru_cache(maxsize=256)
def _with_calls(text: str, root: str) -> tuple[str, tuple[frozenset[int], ...]] | None:
    """(regex, boundary bytes of its calls: json_holes.Bounds) of a grammar whose nesting
    recursion runs as calls; None when it has none or cannot (left recursion through other
    rules, more than ``MAX_CALLS`` called rules, reserved code points): it unrolls then.
    Cached: a compile asks for the regex and the bounds separately."""
    grammar = parse_ebnf(text, root)
    # First a call target is called only where it is entered again inside itself (its first
    # entry is expanded in place, so fewer tokens cross calls). Where targets nest in each
    # other's first entries (C's statements, expressions, calls and parentheses), those
    # expansions multiply: then every reference to a target is a call.
    for eager in (False, True):
        try:
            emitter = _Emitter(grammar, 0, calls=True, eager=eager)
            if not emitter.calls:
                return None
            out = emitter.emit(root)
        except _NoCalls:
            return None
        except _TooLarge:
            if eager:
                raise
            continue
        except RecursionError:
            raise EbnfError(f"ebnf: rule {root!r} expands too deeply (rules within rules); flatten the grammar") from None
        if out is None:
            raise EbnfError(f"ebnf: rule {root!r} matches nothing (does some rule recurse without a way to stop?)")
        if not emitter.defs:
            return None  # the recursion is never reached from the root
        if len(out[0]) <= MAX_REGEX_CHARS:
            return out[0], emitter.analysis.boundaries(set(emitter.defs))
    raise EbnfError(f"ebnf: the grammar is a regex of {len(out[0])} characters, over the "
                    f"{MAX_REGEX_CHARS} supported; flatten the grammar")


def call_boundaries(text: str, root: str = "root") -> tuple[frozenset[int], ...] | None:
    """For a grammar whose ``ebnf_to_regex(calls=True)`` has calls: (the bytes that can come
    just before a call's text, its first bytes, its last bytes, the bytes that can come just
    after it), for the matcher's walk (json_holes.Bounds). None when the regex has no calls.
    Raises ``EbnfError`` like ``ebnf_to_regex``."""
    out = _with_calls(text, root)
    return None if out is None else out[1]
