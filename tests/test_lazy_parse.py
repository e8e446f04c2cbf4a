"""The lazy index's regex parser and the compile's automaton tries (lazy_index.parse_regex,
nfa_of; compiler.lazy_nfa): runs of plain characters and class texts are read in bulk into
the very trees the one-character-at-a-time reading made; the regex is parsed once for all
its narrowing tries, and a grammar too large even narrowed is refused after two builds."""
from __future__ import annotations

import random
import re

import pytest

from treadle.constrained.compile import compiler
from treadle.constrained.compile.compiler import GrammarTooLarge, NARROW_SHARES, lazy_nfa
from treadle.constrained.index.index_markers import MEMBER_OPTIONAL, MEMBER_REQUIRED, MEMBERS_CLOSE, MEMBERS_OPEN, marked
from treadle.constrained.index.lazy_index import LazyTooLarge, build_nfa, nfa_of, parse_regex


def _c(ch: str) -> tuple:
    return ("lit", ((ord(ch), ord(ch)),))


def test_plain_runs_and_classes_parse_to_one_node_per_character():
    assert parse_regex("ab") == ("seq", [_c("a"), _c("b")])
    # the last character of a run is the atom of a quantifier after it
    assert parse_regex("abc*d") == ("seq", [_c("a"), _c("b"), ("rep", _c("c"), 0, None), _c("d")])
    assert parse_regex("xy{2,3}") == ("seq", [_c("x"), ("rep", _c("y"), 2, 3)])
    assert parse_regex("k+") == ("rep", _c("k"), 1, None)
    # ']' and '}' outside a class stand for themselves; runs stop at the syntax
    assert parse_regex("a]}b|cd") == ("alt", [("seq", [_c("a"), _c("]"), _c("}"), _c("b")]), ("seq", [_c("c"), _c("d")])])
    assert parse_regex("é日\\.x") == ("seq", [_c("é"), _c("日"), _c("."), _c("x")])
    # classes: a leading ']' (after '^' too) is a member; an escaped ']' does not close
    assert parse_regex("[]a]b") == ("seq", [("lit", ((ord("]"), ord("]")), (ord("a"), ord("a")))), _c("b")])
    assert parse_regex("[^]]") == ("lit", ((0, ord("]") - 1), (ord("]") + 1, 0x10FFFF)))
    assert parse_regex(r"[a\]]z") == ("seq", [("lit", ((ord("]"), ord("]")), (ord("a"), ord("a")))), _c("z")])
    assert parse_regex(r"[\\]x") == ("seq", [("lit", ((ord("\\"), ord("\\")),)), _c("x")])
    # the same class text twice is read once
    rx = parse_regex("[a-c]q[a-c]")
    assert rx[1][0][1] is rx[1][2][1]
    # ordered members: the markers end a run
    node = parse_regex(MEMBERS_OPEN + "," + MEMBER_REQUIRED + "ab" + MEMBER_OPTIONAL + "cd" + MEMBERS_CLOSE + "e")
    assert node == ("seq", [("members", _c(","), [(("seq", [_c("a"), _c("b")]), True),
                                                   (("seq", [_c("c"), _c("d")]), False)], True), _c("e")])


@pytest.mark.parametrize("bad", ["[ab", "ab\\", "[a\\", "a{2,1}", "(ab"])
def test_malformed_text_is_still_refused(bad):
    from treadle.constrained.index.lazy_index import LazyUnsupported

    with pytest.raises(LazyUnsupported):
        parse_regex(bad)


def _walk(nfa, data: bytes) -> bool:
    """Whether the NFA accepts ``data`` (plain subset simulation)."""
    def close(states):
        todo, seen = list(states), set(states)
        while todo:
            q = todo.pop()
            for t in nfa.eps_dst[nfa.eps_ptr[q]:nfa.eps_ptr[q + 1]]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return seen

    cur = close({nfa.start})
    for b in data:
        cur = close({nfa.dst[q] for q in cur if nfa.lo[q] <= b <= nfa.hi[q]})
    return nfa.accept in cur


def test_random_regexes_accept_what_python_re_accepts():
    rng = random.Random(5)
    atoms = ["a", "b", "ab", "[ab]", "[^a]", "[]b]", r"\]", "}", "[a-c]"]

    def gen(d=0):
        if d > 2 or rng.random() < 0.35:
            return rng.choice(atoms)
        k = rng.choice(["cat", "alt", "q"])
        if k == "cat":
            return gen(d + 1) + gen(d + 1)
        if k == "alt":
            return f"(?:{gen(d + 1)}|{gen(d + 1)})"
        return f"(?:{gen(d + 1)})" + rng.choice(["*", "+", "?", "{1,2}", "{2}"])

    for _ in range(120):
        rx = gen()
        nfa = build_nfa(rx)
        py = re.compile(rx)
        for _ in range(25):
            s = "".join(rng.choice("abc]}") for _ in range(rng.randint(0, 5)))
            assert _walk(nfa, s.encode()) == (py.fullmatch(s) is not None), (rx, s)


def _same(a, b) -> bool:
    return all(getattr(a, k) == getattr(b, k) for k in ("start", "accept", "lo", "hi", "dst", "eps_ptr", "eps_dst",
                                                          "narrowed"))


def test_narrowing_parses_once_and_keeps_the_largest_share_that_fits(monkeypatch):
    cap_size = 500  # 20 states a unit: a cap of 10,000 states
    cap = compiler.LAZY_STATES_PER_SIZE * cap_size
    # twelve repetitions of ~1,000 states 40 times: too large exact and at an eighth of the cap
    # each, it fits at a 64th
    regex = "".join(f"(?:[a-z]{{1,300}}{c}){{1,40}}" for c in "abcdefghijkl")
    parses, builds = [], []
    monkeypatch.setattr(compiler, "parse_regex", lambda rx: parses.append(1) or parse_regex(rx))
    monkeypatch.setattr(compiler, "nfa_of", lambda *a, **k: builds.append(a[3:]) or nfa_of(*a, **k))
    got = lazy_nfa(regex, cap_size, narrow=True)
    assert len(parses) == 1
    # the largest share that fits, as trying them largest first finds it
    want = None
    for share in NARROW_SHARES:
        try:
            want = build_nfa(marked(regex), cap, cap // share)
            break
        except LazyTooLarge:
            continue
    assert want is not None and got.narrowed > 0 and _same(got, want)
    assert builds == [(), (cap // NARROW_SHARES[-1],), (cap // NARROW_SHARES[0],), (cap // NARROW_SHARES[1],)]
    with pytest.raises(LazyTooLarge):
        build_nfa(marked(regex), cap, cap // NARROW_SHARES[0])


def test_a_grammar_too_large_even_narrowed_is_refused_after_two_builds(monkeypatch):
    cap_size = 200  # a cap of 4,000 states
    regex = "|".join(f"(?:word{i}[a-z]{{2,9}})" for i in range(400))  # wide, not deep: narrowing cannot help
    builds = []
    monkeypatch.setattr(compiler, "nfa_of", lambda *a, **k: builds.append(a[3:]) or nfa_of(*a, **k))
    with pytest.raises(GrammarTooLarge, match="even with its bounded repetitions lowered"):
        lazy_nfa(regex, cap_size, narrow=True)
    cap = compiler.LAZY_STATES_PER_SIZE * cap_size
    assert builds == [(), (cap // NARROW_SHARES[-1],)]
    for share in NARROW_SHARES:  # every share fails alike
        with pytest.raises(LazyTooLarge):
            build_nfa(marked(regex), cap, cap // share)


def test_a_grammar_too_large_with_nothing_to_lower_is_refused_after_one_build(monkeypatch):
    # no bounded repetition that a narrowed build would lower is met before the cap: that
    # build would make the very same states, so it is not made
    cap_size = 200
    cap = compiler.LAZY_STATES_PER_SIZE * cap_size
    regex = "|".join(f"(?:word{i}[a-z]+)" for i in range(400)) + "|x{1,5000}"
    builds = []
    monkeypatch.setattr(compiler, "nfa_of", lambda *a, **k: builds.append((a[3:], k)) or nfa_of(*a, **k))
    with pytest.raises(GrammarTooLarge):
        lazy_nfa(regex, cap_size, narrow=True)
    assert builds == [((), {"watch": cap // NARROW_SHARES[-1]})]
    with pytest.raises(LazyTooLarge):  # indeed: the narrowest build passes the cap too
        build_nfa(marked(regex), cap, cap // NARROW_SHARES[-1])


def test_a_regex_far_longer_than_the_cap_allows_is_refused_unparsed(monkeypatch):
    cap_size = 10  # a cap of 200 states: 16 characters a state is 3,200 characters
    cap = compiler.LAZY_STATES_PER_SIZE * cap_size
    parses = []
    monkeypatch.setattr(compiler, "parse_regex", lambda rx: parses.append(1) or parse_regex(rx))
    with pytest.raises(GrammarTooLarge, match=f"regex of 3,201 chars passes the {compiler.LAZY_CHARS_PER_STATE * cap:,}"):
        lazy_nfa("(?:" + "a" * 3196 + ")?", cap_size, narrow=True)
    assert parses == []
    with pytest.raises(GrammarTooLarge, match="byte automaton passes"):  # at the limit: parsed, then built
        lazy_nfa("a" * 3200, cap_size, narrow=True)
    assert parses == [1]


def test_counted_copies_made_at_once_are_the_copies_made_one_by_one():
    # _Builder.copies shifts the k - 1 copies of a fragment in one numpy step: the same states
    # and moves as shifting them one at a time (a body with epsilon moves and one without)
    import numpy as np

    from treadle.constrained.index import lazy_index as li

    class OneByOne(li._Builder):
        def copies(self, body, k, least=None):
            if k <= 0:
                return []
            base, e0 = len(self.lo), len(self.esrc)
            a, b = self.frag(body)
            n, e1 = len(self.lo) - base, len(self.esrc)
            if least is not None and self.narrow_to is not None and n * k > self.narrow_to:
                fit = max(least, 1, self.narrow_to // max(n, 1))
                if fit < k:
                    k = fit
                    self.narrowed += 1
            out = [(a, b)]
            lo, hi = self.lo[base:], self.hi[base:]
            dst = np.frombuffer(self.dst, dtype=np.int32)[base:].astype(np.int64)
            src_e = np.frombuffer(self.esrc, dtype=np.int32)[e0:e1].astype(np.int64)
            dst_e = np.frombuffer(self.edst, dtype=np.int32)[e0:e1].astype(np.int64)
            for _ in range(1, k):
                off = len(self.lo) - base
                self.lo.extend(lo)
                self.hi.extend(hi)
                self.dst.frombytes(np.where(dst >= 0, dst + off, -1).astype(np.int32).tobytes())
                self.esrc.frombytes((src_e + off).astype(np.int32).tobytes())
                self.edst.frombytes((dst_e + off).astype(np.int32).tobytes())
                out.append((a + off, b + off))
            return out

    for rx in ["a{5}", "[a-z]{2,7}", "(?:ab|[é-ü]c){3,9}x", "(?:(?:a[0-9]{1,4}){2,3},)*z{0,3}", '"[^"]{0,40}"']:
        for narrow_to in (None, 12):
            ast = parse_regex(rx)
            got = nfa_of(ast, len(rx), 10**6, narrow_to)
            ref = OneByOne(10**6, narrow_to)
            entry, exit_ = ref.frag(ast)
            assert (got.start, got.accept, got.narrowed) == (entry, exit_, ref.narrowed), rx
            assert (got.lo, got.hi, got.dst) == (ref.lo, ref.hi, ref.dst), rx
            pairs = sorted(zip(ref.esrc, ref.edst))
            flat = sorted((q, t) for q in range(got.num_states) for t in got.eps_dst[got.eps_ptr[q]:got.eps_ptr[q + 1]])
            assert flat == pairs, rx


def test_ordered_members_of_at_least_one_optional_entry_make_no_dead_state():
    # {"minProperties": 1} over optional members: no A_n state is made (the empty sequence is
    # not allowed) and every state reaches the end, so the index skips its dead-state pass
    from treadle.constrained.index.lazy_index import LazyIndex, TokenArrays
    from treadle.constrained.index.index_markers import MEMBERS_OPEN_NONEMPTY

    rx = "\\{" + MEMBERS_OPEN_NONEMPTY + "," + "".join(MEMBER_OPTIONAL + f'"{k}":[0-9]' for k in "abc") + MEMBERS_CLOSE + "\\}"
    nfa = build_nfa(rx)
    assert not nfa.dead_ends
    nfa.dead_ends = True  # the pass itself finds every state live
    index = LazyIndex(nfa, TokenArrays({i: bytes([i]) for i in range(256)}))
    assert all(index._live)
    for text, ok in [(b'{"a":1}', True), (b'{"b":2,"c":3}', True), (b"{}", False), (b'{"c":1,"a":2}', False)]:
        assert _walk(build_nfa(rx), text) == ok, text


def test_a_group_written_again_is_one_node_built_once_and_copied():
    # a translated schema repeats its string / number groups: the parse hands back the same
    # node for the same text, the build copies its first states; the NFA is the one built
    # from a tree with every group apart, array for array, narrowed or not
    string = '"(?:[^"\\\\\\x00-\\x1f]|\\\\["\\\\/bfnrt]|\\\\u[0-9a-fA-F]{4})*"'
    number = "(?:-?(?:0|[1-9][0-9]{0,15})(?:\\.[0-9]{1,6})?)"
    obj = ("\\{" + MEMBERS_OPEN + "," + MEMBER_OPTIONAL + f'"a":{string}' + MEMBER_OPTIONAL + f'"b":{number}'
           + MEMBER_REQUIRED + f'"c":\\[(?:{string}(?:,{string}){{0,30}})?\\]' + MEMBERS_CLOSE + "\\}")
    rx = marked(f"\\[(?:{obj}(?:,{obj})*)?\\]|{number}|(?:{string}|{number}){{2,40}}")
    tree = parse_regex(rx)
    assert len(tree.shared) >= 2
    apart = tuple(tree)  # the same nodes, no sharing: each built afresh where it stands
    assert not getattr(apart, "shared", None)
    for narrow_to in (None, 300, 40):
        got, want = nfa_of(tree, len(rx), 10**6, narrow_to), nfa_of(apart, len(rx), 10**6, narrow_to)
        assert _same(got, want) and got.dead_ends == want.dead_ends, narrow_to
    with pytest.raises(LazyTooLarge):
        nfa_of(tree, len(rx), want.num_states - 1)
