"""What an EBNF grammar's nesting recursion needs to run as calls (json_holes.py).

ebnf.py writes a rule that nests inside itself (``factor ::= "(" expr ")"`` inside ``expr``)
as a call placeholder plus one appended definition, instead of unrolling it a few levels. The
matcher then runs a stack of calls, and a token may cross a call's boundary mid-token (``((``
enters two, ``))`` returns from two). So that a mask need walk only the tokens that can
cross, the walk admits a mid-token entry only after a byte that can come just before a called
rule, and a mid-token return only at a byte that can come just after one. This module
computes those byte sets from the grammar (classic FIRST / LAST / FOLLOW analysis, on bytes,
over-approximating non-ASCII characters by every lead or continuation byte), and the rule
properties the emitter needs:

* which rules can derive a finite string at all (``productive``): a call to any other rule
  could never return, so such references match nothing;
* which can derive the empty string (``nullable``): a call to one is written optional at its
  site, so a definition's value is never read as empty where its site could be skipped;
* which call themselves before reading a byte through another rule (``left_recursive``,
  ``a ::= b "x"`` with ``b ::= a "y"``): a stack of calls cannot nest those at one position,
  so such grammars keep the unrolled regex.

Importing this module does not import torch.
"""

from __future__ import annotations

from treadle.constrained.ebnf.ebnf import Alt, Cls, Lit, Node, Ref, Rep, Seq

__all__ = ["Analysis"]

_LEADS = frozenset(range(0xC2, 0xF5))  # UTF-8 lead bytes
_CONTS = frozenset(range(0x80, 0xC0))  # UTF-8 continuation bytes


def _class_bytes(node: Cls) -> tuple[frozenset[int], frozenset[int]]:
    """(first bytes, last bytes) of the characters a class matches, non-ASCII approximated."""
    ascii_in = set()
    wide = False
    for lo, hi in node.ranges:
        ascii_in.update(range(lo, min(hi, 0x7F) + 1))
        wide |= hi >= 0x80
    if node.negated:
        ascii_in = set(range(0x80)) - ascii_in
        wide = True  # no class excludes every non-ASCII character in practice
    first = frozenset(ascii_in) | (_LEADS if wide else frozenset())
    last = frozenset(ascii_in) | (_CONTS if wide else frozenset())
    return first, last


class Analysis:
    """Fixpoints over the rules (after ebnf.py's loop rewrite): productive, nullable, first
    and last bytes, and the bytes that can precede and follow each rule's text."""

    def __init__(self, rules: dict[str, Node]) -> None:
        self.rules = rules
        self.productive: set[str] = set()
        self.nullable: set[str] = set()
        self.first: dict[str, frozenset[int]] = {n: frozenset() for n in rules}
        self.last: dict[str, frozenset[int]] = {n: frozenset() for n in rules}
        changed = True
        while changed:
            changed = False
            for name, body in rules.items():
                if name not in self.productive and self._productive(body):
                    self.productive.add(name)
                    changed = True
                if name not in self.nullable and self.is_nullable(body):
                    self.nullable.add(name)
                    changed = True
                f, la = self.first_bytes(body), self.last_bytes(body)
                if f != self.first[name] or la != self.last[name]:
                    self.first[name], self.last[name] = f, la
                    changed = True
        self.before: dict[str, set[int]] = {n: set() for n in rules}
        self.after: dict[str, set[int]] = {n: set() for n in rules}
        self._changed = True
        while self._changed:
            self._changed = False
            for name, body in rules.items():
                self._context(body, frozenset(self.before[name]), frozenset(self.after[name]))

    # ------------------------------------------------------------------ per node

    def _productive(self, node: Node) -> bool:
        if isinstance(node, (Lit, Cls)):
            return True
        if isinstance(node, Ref):
            return node.name in self.productive
        if isinstance(node, Seq):
            return all(map(self._productive, node.items))
        if isinstance(node, Alt):
            return any(map(self._productive, node.items))
        if isinstance(node, Rep):
            return node.min == 0 or self._productive(node.item)
        raise TypeError(node)

    def is_nullable(self, node: Node) -> bool:
        if isinstance(node, Lit):
            return not node.text
        if isinstance(node, Cls):
            return False
        if isinstance(node, Ref):
            return node.name in self.nullable
        if isinstance(node, Seq):
            return all(map(self.is_nullable, node.items))
        if isinstance(node, Alt):
            return any(map(self.is_nullable, node.items))
        if isinstance(node, Rep):
            return node.min == 0 or node.max == 0 or self.is_nullable(node.item)
        raise TypeError(node)

    def first_bytes(self, node: Node) -> frozenset[int]:
        return self._ends(node, True)

    def last_bytes(self, node: Node) -> frozenset[int]:
        return self._ends(node, False)

    def _ends(self, node: Node, first: bool) -> frozenset[int]:
        if isinstance(node, Lit):
            data = node.text.encode()
            return frozenset((data[0] if first else data[-1],)) if data else frozenset()
        if isinstance(node, Cls):
            return _class_bytes(node)[0 if first else 1]
        if isinstance(node, Ref):
            return (self.first if first else self.last)[node.name]
        if isinstance(node, Seq):
            out: set[int] = set()
            for item in (node.items if first else reversed(node.items)):
                out |= self._ends(item, first)
                if not self.is_nullable(item):
                    break
            return frozenset(out)
        if isinstance(node, Alt):
            return frozenset().union(*(self._ends(x, first) for x in node.items))
        if isinstance(node, Rep):
            return frozenset() if node.max == 0 else self._ends(node.item, first)
        raise TypeError(node)

    def _context(self, node: Node, before: frozenset[int], after: frozenset[int]) -> None:
        """Record that ``node``'s text can follow a byte of ``before`` and precede one of
        ``after``, down to the rule references in it."""
        if isinstance(node, Ref):
            b, a = self.before[node.name], self.after[node.name]
            if not before <= b or not after <= a:
                b |= before
                a |= after
                self._changed = True
        elif isinstance(node, Seq):
            items = node.items
            pre = [before]
            for item in items[:-1]:
                pre.append(self.last_bytes(item) | (pre[-1] if self.is_nullable(item) else frozenset()))
            post = [after]
            for item in reversed(items[1:]):
                post.append(self.first_bytes(item) | (post[-1] if self.is_nullable(item) else frozenset()))
            post.reverse()
            for item, b, a in zip(items, pre, post):
                self._context(item, b, a)
        elif isinstance(node, Alt):
            for item in node.items:
                self._context(item, before, after)
        elif isinstance(node, Rep):
            if node.max is None or node.max > 1:  # the item may follow and precede itself
                self._context(node.item, before | self.last_bytes(node.item), after | self.first_bytes(node.item))
            elif node.max == 1:
                self._context(node.item, before, after)

    # ------------------------------------------------------------------ per grammar

    def left_calls(self, node: Node) -> set[str]:
        """The rules ``node`` can begin with, before reading a byte."""
        if isinstance(node, Ref):
            return {node.name}
        if isinstance(node, Seq):
            out: set[str] = set()
            for item in node.items:
                out |= self.left_calls(item)
                if not self.is_nullable(item):
                    break
            return out
        if isinstance(node, Alt):
            return set().union(*(self.left_calls(x) for x in node.items))
        if isinstance(node, Rep):
            return set() if node.max == 0 else self.left_calls(node.item)
        return set()

    def left_recursive(self, names: set[str]) -> bool:
        """Whether one of ``names`` can begin with itself, through any rules."""
        graph = {n: self.left_calls(b) for n, b in self.rules.items()}
        for start in names:
            seen, todo = set(), list(graph[start])
            while todo:
                n = todo.pop()
                if n == start:
                    return True
                if n not in seen:
                    seen.add(n)
                    todo.extend(graph[n])
        return False

    def boundaries(self, names: set[str]) -> tuple[frozenset[int], ...]:
        """(bytes that can come just before the text of a rule of ``names``, its first bytes,
        its last bytes, bytes that can come just after it): json_holes.Bounds."""
        out: list[set[int]] = [set(), set(), set(), set()]
        for n in names:
            for acc, part in zip(out, (self.before[n], self.first[n], self.last[n], self.after[n])):
                acc |= part
        return tuple(frozenset(x) for x in out)
