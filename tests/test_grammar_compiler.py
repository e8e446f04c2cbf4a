"""GrammarCompiler: caching, fast failures, worker-process timeouts / OOM, concurrency."""

from __future__ import annotations

import os
import time

import pytest
from tokenizers import Tokenizer, models

from treadle.constrained import GrammarCompiler, GrammarCompileError, GrammarMatcher, GrammarSpec, GrammarTooLarge

EOS = 2
V = 49152
HEAVY = r"[a-z]{0,1000}"  # ~1e3 DFA states x ~1e4 tokens: seconds and hundreds of MB to build


@pytest.fixture(scope="module")
def compiler(smol):
    c = GrammarCompiler(smol, [EOS], vocab_size=V, max_workers=2, timeout_s=120)
    yield c
    c.close()


def accepts(g, tok, text: str) -> bool:
    m = GrammarMatcher(g)
    return all(m.accept_token(t) for t in tok.encode(text, add_special_tokens=False)) and m.accept_token(EOS)


def test_spec_from_params():
    assert GrammarSpec.from_params() is None
    with pytest.raises(ValueError, match="regex, json_schema"):
        GrammarSpec.from_params(regex="a", choices=["b"])
    a = GrammarSpec.from_params(json_schema={"b": 1, "a": {"type": "string"}})
    b = GrammarSpec.from_params(json_schema='{ "b" : 1, "a": {"type": "string"} }')
    assert a == b and a.value == '{"b":1,"a":{"type":"string"}}'  # compact, key order kept
    assert a != GrammarSpec.from_params(json_schema={"a": {"type": "string"}, "b": 1})
    assert GrammarSpec.from_params(choices=["x", "y"]) == GrammarSpec("choices", '["x", "y"]')
    with pytest.raises(ValueError, match="not valid JSON"):
        GrammarSpec.from_params(json_schema="{nope")
    with pytest.raises(ValueError, match="choices"):
        GrammarSpec.from_params(choices=[])


def test_compile_and_cache_hit(compiler, smol, monkeypatch):
    spec = GrammarSpec.from_params(regex=r"[0-9]{3}-[a-z]+")
    g = compiler.compile(spec)
    assert g.spec == spec and g.compile_time_s > 0 and g.vocab_size == V
    assert accepts(g, smol, "123-abc") and not accepts(g, smol, "12-abc")

    def no_work(*a, **k):
        raise AssertionError("a cache hit checked or built the grammar again")

    with monkeypatch.context() as m:  # a hit is a dict lookup: no size check, no build
        m.setattr("treadle.constrained.compile.compiler.precheck", no_work)
        m.setattr(compiler._pool, "submit", no_work)
        g2 = compiler.compile(GrammarSpec.from_params(regex=r"[0-9]{3}-[a-z]+"))
    assert g2 is g


def test_choices_and_schema_specs(compiler, smol):
    g = compiler.compile(GrammarSpec.from_params(choices=["red", "green"]))
    assert accepts(g, smol, "green") and not accepts(g, smol, "blue")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    gs = compiler.compile(GrammarSpec.from_params(json_schema=schema))
    assert accepts(gs, smol, '{"ok":true}') and not accepts(gs, smol, '{"ok":1}')
    assert GrammarMatcher(gs).find_jump_forward_string() == '{"ok":'


def test_json_schema_mode_reaches_the_compiler(compiler, smol):
    spec = GrammarSpec.from_params(json_schema={"type": "object", "properties": {"a": {"type": "integer"}},
                                                "required": ["a"]})
    strict = compiler.compile(spec)
    assert accepts(strict, smol, '{"a":1}') and not accepts(strict, smol, '{"a":1,"zz":2}')
    with GrammarCompiler(smol, [EOS], vocab_size=V, timeout_s=120, json_schema_mode="spec") as c:
        g = c.compile(spec)
        assert accepts(g, smol, '{"a":1,"zz":2}') and accepts(g, smol, '{"a":1}')
        assert not accepts(g, smol, '{"a":1,"a":2}') and not accepts(g, smol, '{"zz":2}')
    with pytest.raises(ValueError, match="json_schema_mode"):
        GrammarCompiler(smol, [EOS], vocab_size=V, json_schema_mode="loose")


def test_bad_specs_fail_fast_and_are_cached(compiler):
    for spec in (
        GrammarSpec.from_params(regex="("),
        # a $ref to another document: treadle resolves in-document refs only
        GrammarSpec.from_params(json_schema={"type": "object", "properties": {"a": {"$ref": "https://example.com/a"}}}),
    ):
        with pytest.raises(ValueError) as first:
            compiler.compile(spec)
        assert not isinstance(first.value, GrammarCompileError)  # the grammar's own error, not a build failure
        with pytest.raises(ValueError) as second:
            compiler.compile(spec)
        assert second.value is first.value
    assert "$ref" in str(first.value)


def test_regex_step_runs_in_the_worker_not_the_caller(compiler, smol):
    """Checking a large regex takes interegular seconds: the caller (the scheduler) must not
    wait for it, and its errors still come back as the grammar's own ValueError."""
    from treadle.constrained.regex.regex_text import RegexDialectError

    spec = GrammarSpec.from_params(regex="(" + "|".join(f"zz{i}[a-z]{{0,5}}" for i in range(400)) + ")")
    fut = compiler.compile_async(spec)
    assert not fut.done()
    g = fut.result(timeout=300)
    assert accepts(g, smol, "zz399abc") and not accepts(g, smol, "zz400")
    bad = compiler.compile_async(GrammarSpec.from_params(regex=r"x.\b"))
    with pytest.raises(RegexDialectError, match=r"\\b"):
        bad.result(timeout=120)


def test_concurrent_compile_async(compiler, smol):
    specs = [GrammarSpec.from_params(regex=rx) for rx in (r"(yes|no)", r"[a-c]{2}", r"x[0-9]+", r"(cat|dog)s?")]
    futures = [compiler.compile_async(s) for s in specs]
    assert compiler.compile_async(specs[0]) is futures[0]  # in-flight requests share a future
    grammars = [f.result(timeout=120) for f in futures]
    assert len({id(g) for g in grammars}) == 4
    for g, text in zip(grammars, ("no", "ab", "x42", "dogs")):
        assert accepts(g, smol, text)


def test_worker_rejection_keeps_worker():
    # A vocabulary with no "@" token cannot produce the regex: outlines rejects the index.
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    with GrammarCompiler(tok, [EOS], vocab_size=8, timeout_s=120) as c:
        with pytest.raises(GrammarCompileError, match="rejected.*@"):
            c.compile(GrammarSpec.from_params(regex="ab@"))
        g = c.compile(GrammarSpec.from_params(regex="(ab)+"))
        m = GrammarMatcher(g)
        assert m.accept_token(3) and not m.accept_token(3) and m.accept_token(4) and m.accept_token(EOS)
        # nor does a grammar the regex step refuses cost the worker its life
        pids = [w.proc.proc.pid for w in c._workers]
        with pytest.raises(ValueError, match="lookahead"):
            c.compile(GrammarSpec.from_params(regex="a(?=b)"))
        assert [w.proc.proc.pid for w in c._workers] == pids


def test_timeout_kills_worker_and_recovers(smol):
    # outlines-core's index of HEAVY takes seconds (the lazy one builds in milliseconds)
    with GrammarCompiler(smol, [EOS], vocab_size=V, timeout_s=0.5, token_index="outlines") as c:
        t0 = time.perf_counter()
        with pytest.raises(GrammarCompileError, match="timed out after 0.5s"):
            c.compile(GrammarSpec.from_params(regex=HEAVY))
        assert time.perf_counter() - t0 < 60  # includes the first worker's start
        g = c.compile(GrammarSpec.from_params(regex="(yes|no)"))  # a fresh worker serves it
        assert accepts(g, smol, "yes")


# interegular's checks of this regex take about a minute (it then fails on the reserved code point)
SLOW = "(" + "|".join(f"zz{i}[a-z]{{0,5}}" for i in range(4000)) + ")\U0010FFF9"


def _busy(c: GrammarCompiler, timeout_s: float = 60) -> None:
    """Wait until the only worker has taken a job."""
    deadline = time.monotonic() + timeout_s
    while c._idle.qsize():
        assert time.monotonic() < deadline, "the compile never reached the worker"
        time.sleep(0.05)


def test_cancel_stops_the_compile_and_frees_its_worker(smol):
    """A compile that no one waits for any more (its requests aborted) is cancelled: the worker
    building it is killed and replaced, so the next grammar does not queue behind it for the
    rest of its build (up to timeout_s), and the spec leaves the cache."""
    # SLOW is past the default max_grammar_size: lifted, so that its regex step keeps the worker busy
    # (interegular's check runs for outlines-core's index only: the lazy one reads SLOW at once)
    with GrammarCompiler(smol, [EOS], vocab_size=V, max_workers=1, timeout_s=600, max_grammar_size=10**9,
                         token_index="outlines") as c:
        c.compile(GrammarSpec.from_params(regex="ok"))  # the worker is up
        (old,) = [w.proc.proc.pid for w in c._workers]
        spec = GrammarSpec.from_params(regex=SLOW)
        fut = c.compile_async(spec)
        _busy(c)
        assert c.cancel(fut) and fut.cancelled()
        g = c.compile_async(GrammarSpec.from_params(regex="(yes|no)")).result(timeout=120)
        assert accepts(g, smol, "yes")
        assert old not in [w.proc.proc.pid for w in c._workers] and len(c._workers) == 1
        with pytest.raises(ProcessLookupError):
            os.kill(old, 0)  # killed and reaped
        again = c.compile_async(spec)
        assert again is not fut and not again.done()  # asked again: compiled afresh
        assert c.cancel(again)
        done = c.compile_async(GrammarSpec.from_params(regex="(yes|no)"))
        assert done.result(timeout=120) is g and not c.cancel(done)  # a finished compile stands


def _my_compile_workers() -> list[int]:
    """Live compile worker processes whose parent is this process."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"compile_worker" in cmd:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(pid))
    return found


@pytest.mark.parametrize("cancel_delay", [None, 0.0, 0.06, 0.1], ids=["busy", "cancel+0", "cancel+60ms", "cancel+100ms"])
def test_close_stops_every_worker(smol, cancel_delay):
    """close() while a compile runs, or right after a cancel: no worker may outlive it. A
    worker killed mid-loop left the list under close's iteration (the next one was skipped),
    and a cancel's replacement could join the list after close had read it."""
    others = set(_my_compile_workers())  # the module fixture's
    c = GrammarCompiler(smol, [EOS], vocab_size=V, max_workers=2, timeout_s=600, max_grammar_size=10**9)
    try:
        # one after the other: both workers have started, and the slow grammar then takes the
        # first worker of the list (the one whose removal made close() skip the next)
        c.compile(GrammarSpec.from_params(regex="(yes|no)"))
        c.compile(GrammarSpec.from_params(regex="(yes|no|maybe)"))
        fut = c.compile_async(GrammarSpec.from_params(regex=SLOW))
        deadline = time.monotonic() + 60
        while c._idle.qsize() != 1:  # one worker has taken the slow grammar
            assert time.monotonic() < deadline
            time.sleep(0.05)
        if cancel_delay is not None:
            c.cancel(fut)
            time.sleep(cancel_delay)
    finally:
        c.close()
    deadline = time.monotonic() + 5  # the pool thread may still be reaping the killed one
    while set(_my_compile_workers()) - others:
        assert time.monotonic() < deadline, set(_my_compile_workers()) - others
        time.sleep(0.05)


def test_out_of_memory_is_a_compile_error(smol):
    with GrammarCompiler(smol, [EOS], vocab_size=V, timeout_s=120, memory_limit_bytes=400 << 20,
                         token_index="outlines") as c:
        with pytest.raises(GrammarCompileError, match="memory"):
            c.compile(GrammarSpec.from_params(regex=r"[a-z]{0,1000}(,[a-z]{0,1000}){2}"))
        assert accepts(c.compile(GrammarSpec.from_params(regex="ok")), smol, "ok")


def test_closed_compiler_rejects(smol):
    c = GrammarCompiler(smol, [EOS], vocab_size=V)
    c.close()
    c.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        c.compile(GrammarSpec.from_params(regex="a"))
    with pytest.raises(ValueError, match="GrammarSpec"):
        GrammarCompiler.compile_async(c, "a")  # type: ignore[arg-type]


def test_disk_cache_serves_a_new_compiler(smol, tmp_path):
    """A build kept on disk by one compiler (one process) is loaded, not rebuilt, by the next;
    unreadable files are misses; another vocabulary never reads it; the folder stays bounded.
    (outlines-core's indexes only: a lazy index has nothing to keep.)"""
    from treadle.constrained.compile.disk_cache import GrammarDiskCache

    spec = GrammarSpec.from_params(regex=r"[0-9]{3}-[a-z]+")
    with GrammarCompiler(smol, [EOS], vocab_size=V, disk_cache_dir=str(tmp_path), token_index="outlines") as c:
        c._disk.min_compile_s = 0.0  # this small grammar builds in well under the 1 s default
        first = c.compile(spec)
    files = list(tmp_path.glob("*.grammar"))
    assert not first.from_disk and len(files) == 1
    with GrammarCompiler(smol, [EOS], vocab_size=V, disk_cache_dir=str(tmp_path), token_index="outlines") as c:
        again = c.compile(spec)
    assert again.from_disk and again.compile_time_s == first.compile_time_s
    assert accepts(again, smol, "123-abc") and not accepts(again, smol, "12-abc")
    m1, m2 = GrammarMatcher(first), GrammarMatcher(again)
    for t in smol.encode("123-ab", add_special_tokens=False):
        assert m1.accept_token(t) and m2.accept_token(t)
    assert (first.mask_row(m1.state) == again.mask_row(m2.state)).all()
    # a different vocabulary (logits width) has its own names: a miss
    with GrammarCompiler(smol, [EOS], vocab_size=V + 64, disk_cache_dir=str(tmp_path), token_index="outlines") as c:
        assert not c.compile(spec).from_disk
    # a corrupt file is dropped and rebuilt
    files[0].write_bytes(b"not a pickle")
    with GrammarCompiler(smol, [EOS], vocab_size=V, disk_cache_dir=str(tmp_path), token_index="outlines") as c:
        c._disk.min_compile_s = 0.0
        rebuilt = c.compile(spec)
    assert not rebuilt.from_disk and files[0].read_bytes() != b"not a pickle"
    # over max_bytes, the least recently used files go
    cache = GrammarDiskCache(str(tmp_path / "small"), "fp", max_bytes=2500, min_compile_s=0.0)
    for i in range(4):
        assert cache.store(f"r{i}", b"x" * 1000, 0.5)
        os.utime(cache.path(f"r{i}"), (i, i))
    assert cache.load("r0") is None and cache.load("r3") == (b"x" * 1000, 0.5)
    assert sum(f.stat().st_size for f in (tmp_path / "small").iterdir()) <= 2500
    assert not cache.store("slow-enough?", b"", -1.0)  # builds under min_compile_s stay off disk


# 5,000 alternatives of a word and a short class: its token index takes about a minute and
# hundreds of MB to build (#32: 42-64 s); its estimated size (grammar_size.py) is past the cap
HUGE_REGEX = "(" + "|".join(f"zz{i}[a-z]{{0,5}}" for i in range(5000)) + ")"


def test_too_large_regex_is_refused_before_any_work(compiler):
    fut = compiler.compile_async(GrammarSpec.from_params(regex=HUGE_REGEX))
    assert fut.done()  # decided inside compile_async: no worker, no regex check, no build
    with pytest.raises(GrammarTooLarge, match="estimated size 678,890 exceeds max_grammar_size 150,000"):
        fut.result()


def test_schema_of_many_optional_properties_is_refused_before_translation(compiler):
    # spelt out, N optional properties are ~N^2 pieces (10,000 drove a worker to 3.9 GB); the compile
    # path writes them as an ordered-members node (members.py), N pieces, so N itself is judged
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(160_000)}}
    fut = compiler.compile_async(GrammarSpec.from_params(json_schema=schema))
    assert fut.done()
    with pytest.raises(GrammarTooLarge, match=r"object at \$, 160,000 optional properties.*max_grammar_size 150,000"):
        fut.result()


def test_translated_regex_too_large_is_refused_before_its_index(smol):
    strings = {f"s{i}": {"type": "string", "minLength": 50, "maxLength": 50} for i in range(3)}
    schema = {"type": "object", "properties": strings, "required": list(strings)}
    # three strings of exactly 50 characters: ~6,000 states of the lazy index's automaton, past
    # 200 x 20, and no optional copies for narrowing (test_grammar_narrowing.py) to drop
    with GrammarCompiler(smol, [EOS], vocab_size=V, timeout_s=120, max_grammar_size=200) as c:
        with pytest.raises(GrammarTooLarge, match=r"json_schema grammar \(a regex of .* exceeds max_grammar_size 200\b"):
            c.compile(GrammarSpec.from_params(json_schema=schema))
        assert accepts(c.compile(GrammarSpec.from_params(json_schema={"enum": ["a", "b"]})), smol, '"b"')


def test_cache_is_bounded_in_bytes(smol):
    """The cache counts what its grammars hold (each [a-z]{0,60} index is ~8 MB), not entries:
    past ``cache_bytes`` the least recently used go, and asking again builds afresh."""
    cap = 20 << 20
    with GrammarCompiler(smol, [EOS], vocab_size=V, timeout_s=120, cache_bytes=cap, token_index="outlines") as c:
        sizes = []
        for n in range(4):
            c.compile(GrammarSpec.from_params(regex=f"x{n}[a-z]{{0,60}}"))
            info = c.cache_info()
            assert info["cap_bytes"] == cap and 0 < info["bytes"] <= cap, info
            sizes.append(info["entries"])
        assert sizes[0] == 1 and sizes[-1] < 4, sizes  # the oldest went
        assert accepts(c.compile(GrammarSpec.from_params(regex="x0[a-z]{0,60}")), smol, "x0abc")
        assert c.cache_info()["bytes"] <= cap


def test_deeply_nested_schema_text_is_a_value_error(compiler):
    # a spec built without from_params (whose parse would refuse it first): the size check's own
    # parse must not raise RecursionError on the caller's (the scheduler's) thread
    fut = compiler.compile_async(GrammarSpec("json_schema", "[" * 100_000 + "]" * 100_000))
    with pytest.raises(ValueError, match="nests too deeply"):
        fut.result()
