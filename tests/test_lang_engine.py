"""The DSL end to end on the real embedded model through the in-process Engine backend."""
from __future__ import annotations

import asyncio
import re

import pytest
from pydantic import BaseModel, Field

from treadle.lang import (EngineBackend, assistant, assistant_begin, assistant_end, function, gen,
                          greedy_token_selection, select, set_default_backend, system, system_begin, system_end,
                          unconditional_likelihood_normalized, user, user_begin, user_end)
from treadle.runtime import Engine
from treadle.runtime.tokenizer import apply_chat_template


@pytest.fixture(scope="module")
def engine():
    eng = Engine(max_total_tokens=16384)
    set_default_backend(eng)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def backend(engine):
    return EngineBackend(engine)


def test_text_and_variables(backend):
    @function
    def prog(s, topic):
        s += f"A short poem about {topic}:\n"
        s += gen("line", max_tokens=8, temperature=0)
        s += "\nThe end."

    st = prog.run(topic="the sea", backend=backend)
    assert isinstance(st["line"], str) and st["line"]
    assert st.text() == f"A short poem about the sea:\n{st['line']}\nThe end."
    meta = st.get_meta_info("line")
    assert meta["prompt_tokens"] > 0 and 0 < meta["completion_tokens"] <= 8
    assert meta["finish_reason"]["type"] in ("stop", "length")



def test_get_meta_info_is_none_for_a_name_no_call_produced(backend):
    # as SGLang's: a variable set by s[name] = ..., and a name the program never used, have none
    @function
    def prog(s):
        s["note"] = "set by hand"
        s += "Say hi: " + gen("hi", max_tokens=2, temperature=0)

    st = prog.run(backend=backend)
    assert st.get_meta_info("note") is None
    assert st.get_meta_info("never_used") is None
    assert st.get_meta_info("hi")["completion_tokens"] <= 2

def test_same_as_engine_greedy(engine, backend):
    prompt = "The three primary colors are"

    @function
    def prog(s):
        s += prompt
        s += gen("x", max_tokens=10, temperature=0)

    direct = engine.generate(prompt, {"max_new_tokens": 10, "temperature": 0})["text"]
    assert prog.run(backend=backend)["x"] == direct


def test_roles_render_like_the_chat_template(engine, backend):
    @function
    def chat(s):
        s += system("You are terse.")
        s += user("Hi there")
        s += assistant("Hello!")
        with s.user():
            s += "Bye"

    st = chat.run(backend=backend)
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
    assert st.messages() == msgs
    assert st.text() == apply_chat_template(engine.tokenizer, msgs, add_generation_prompt=False)

    @function
    def no_system(s):  # the template's default system prompt appears, as with apply_chat_template
        s += user("Hi")
        s += assistant(gen("reply", max_tokens=8, temperature=0))

    st = no_system.run(backend=backend)
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": st["reply"]}]
    assert st.messages() == msgs
    assert st.text() == apply_chat_template(engine.tokenizer, msgs, add_generation_prompt=False)
    gen_prompt = apply_chat_template(engine.tokenizer, msgs[:1], add_generation_prompt=True)
    assert st.text().startswith(gen_prompt)


def test_fork_branches_share_the_prefix(backend):
    @function
    def tot(s):
        s += "Here is a long shared context about planets. " * 8
        s += "Name one planet:"
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f" (idea {i})" + gen("idea", max_tokens=6, temperature=0)
        forks.join()

    st = tot.run(backend=backend)
    ideas = st["idea"]
    assert isinstance(ideas, list) and len(ideas) == 3
    branch_metas = st.get_meta_info("idea")["branches"]
    assert all(m["cached_tokens"] > 0 for m in branch_metas)


def test_a_name_generated_again_reads_its_new_value(backend):
    """Reading a variable waits for the queued gen that sets it again (an agent loop reusing a
    name), on the state and in fork branches; a gather join, as SGLang's, leaves a name the
    parent had before the fork as the parent's (it listed the branches' values until session 40)."""
    @function
    def loop(s):
        seen = []
        for topic in ("a fruit", "a color", "a planet"):
            s += f"\nName {topic}:" + gen("step", max_tokens=4, temperature=0)
            value = s["step"]  # read before anything syncs the state
            assert s.text().endswith(value)
            seen.append(value)
        s += "\nName an animal:" + gen("ans", max_tokens=3, temperature=0)
        animal = s["ans"]
        forks = s.fork(2)
        for f, country in zip(forks, ("France", "Japan")):
            f += f"\nThe capital of {country} is" + gen("ans", max_tokens=3, temperature=0)
            assert f.text().endswith(f["ans"])
        branch_values = [f["ans"] for f in forks]
        forks.join()
        return seen, branch_values, animal

    st = loop.run(backend=backend)
    seen, branch_values, animal = st.ret_value
    assert len(set(seen)) == 3, seen
    assert st["step"] == seen[-1]
    assert st["ans"] == animal and len(set(branch_values)) == 2


def test_fork_written_as_in_sglang(backend):
    """SGLang's forms: `forks += expr` adds to every branch (a function of the branch index, or
    a list, one item each), `forks.join()` as a statement brings the branches back (its mode
    names too), and the program's return value is `state.ret_value`."""
    @function
    def tips(s, mode):
        s += "Two tips for staying healthy: 1. Sleep. 2. Exercise.\n"
        forks = s.fork(2)
        forks += lambda i: f"Expand tip {i + 1}:"
        forks += gen("tip", max_tokens=5, temperature=0)
        forks += ["\n(a)", "\n(b)"]
        forks.join(mode)
        with pytest.raises(ValueError, match="already joined"):
            forks.join(mode)
        return [f.text() for f in forks]

    st = tips.run(mode="gather_variable", backend=backend)
    branch_texts = st.ret_value
    assert isinstance(st["tip"], list) and len(st["tip"]) == 2
    for i, (text, tip) in enumerate(zip(branch_texts, st["tip"])):
        assert text.endswith(f"Expand tip {i + 1}:{tip}\n({'ab'[i]})")
    st = tips.run(mode="concate_and_append", backend=backend)
    fork_at = len("Two tips for staying healthy: 1. Sleep. 2. Exercise.\n")
    assert st.text() == st.ret_value[0] + st.ret_value[1][fork_at:]
    with pytest.raises(ValueError, match="one per branch"):
        @function
        def wrong(s):
            forks = s.fork(2)
            forks += ["only one"]

        wrong.run(backend=backend)


def test_select_obvious_cases(backend):
    @function
    def capital(s):
        s += "The capital of France is "
        s += select("city", ["Paris", "London", "banana"])

    st = capital.run(backend=backend)
    assert st["city"] == "Paris"
    assert st.text() == "The capital of France is Paris"
    meta = st.get_meta_info("city")
    assert len(meta["scores"]) == 3 and meta["scores"][0] == max(meta["scores"])

    @function
    def sentiment(s, review):
        s += user(f"Is this review positive or negative? \"{review}\" Answer with one word.")
        s += assistant(select("label", ["positive", "negative"]))

    good = sentiment.run(review="I loved it, wonderful and delightful, best movie ever!", backend=backend)
    bad = sentiment.run(review="Terrible, boring and awful. I hated every minute.", backend=backend)
    assert (good["label"], bad["label"]) == ("positive", "negative")
    for method in ("greedy_token", "sum"):
        @function
        def cap2(s):
            s += "The capital of France is"
            s += select("city", [" Paris", " London", " banana"], choices_method=method)

        assert cap2.run(backend=backend)["city"] == " Paris"


def test_sglang_spellings(backend, engine):
    """SGLang's API forms: gen(choices=...) is a select, role begin/end expressions, the
    choices_method names, gen(min_tokens=...), text_iter(var_name=...), run(stop_token_ids=...)."""
    @function
    def pick(s, how):
        s += "The capital of France is"
        s += how("city", choices=[" Paris", " London", " banana"], choices_method=greedy_token_selection)

    st = pick.run(how=gen, backend=backend)
    assert st["city"] == pick.run(how=select, backend=backend)["city"] == " Paris"
    assert "choices" in st.get_meta_info("city") or "token_logprobs" in st.get_meta_info("city")
    with pytest.raises(ValueError, match="temperature must be 0"):
        select("x", [" a", " b"], temperature=0.7)
    with pytest.raises(ValueError, match="choices cannot be combined"):
        gen("x", choices=["a"], regex="a")

    @function
    def chat(s, min_tokens):
        s += system_begin() + "Be brief." + system_end()
        s += user_begin() + "What is the capital of France?" + user_end()
        s += assistant_begin() + gen("reply", max_tokens=12, min_tokens=min_tokens, temperature=0) + assistant_end()

    free, forced = chat.run(min_tokens=None, backend=backend), chat.run(min_tokens=12, backend=backend)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": free["reply"]}]
    assert free.messages() == msgs
    assert free.text() == apply_chat_template(engine.tokenizer, msgs, add_generation_prompt=False)
    assert free.get_meta_info("reply")["completion_tokens"] < 12  # the model stops early on its own
    assert forced.get_meta_info("reply")["completion_tokens"] == 12

    @function
    def two(s):
        s += "Count: one," + gen("a", max_tokens=3, temperature=0) + " and" + gen("b", max_tokens=3, temperature=0)

    st = two.run(stream=True, backend=backend, stop_token_ids=[engine.tokenizer.eos_token_id])
    assert "".join(st.text_iter(var_name="b")) == st["b"]

    @function
    def scored(s):
        s += "The capital of France is" + gen("x", max_tokens=4, temperature=0, return_logprob=True,
                                              top_logprobs_num=2, return_text_in_logprobs=True)

    meta = scored.run(backend=backend).get_meta_info("x")
    assert "".join(text for _, _, text in meta["output_token_logprobs"]) == scored.run(backend=backend)["x"]
    assert [t[0][1] for t in meta["output_top_logprobs"]] == [t for _, t, _ in meta["output_token_logprobs"]]


def test_select_with_no_text_or_one_merged_token_before_it(backend, engine):
    """A choice whose first token starts the sequence (no text before the select, or a one-
    token text merged into the choice) is scored after the BOS/EOS token, for every choice."""
    ctx = backend.context_token()
    assert ctx is not None
    for text, choices in [("", ["Hello", "Zyzzyva quibble", "The"]), ("x", ["y", "yz"]),
                          ("Hi", [" there", "!", "gh"])]:
        scores = backend.choice_logprobs(text, choices).token_logprobs
        for choice, lps in zip(choices, scores):
            ids = engine.encode(text + choice)
            start = 0 if not text else next((i for i, (a, b) in enumerate(zip(engine.encode(text), ids)) if a != b),
                                            min(len(engine.encode(text)), len(ids) - 1))
            want = engine.generate(input_ids=[ctx] + ids, sampling_params={"max_new_tokens": 0}, return_logprob=True,
                                   logprob_start_len=start + 1)["meta_info"]["input_token_logprobs"]
            assert len(lps) == len(ids) - start > 0
            assert lps == pytest.approx([float(x) for x, _, _ in want], abs=1e-4), (text, choice)

    @function
    def first(s):
        s += select("c", choices=["Hello", "Zyzzyva quibble", "The"])
        s += " world"

    st = first.run(backend=backend)
    assert st["c"] in ("Hello", "Zyzzyva quibble", "The") and st.text() == st["c"] + " world"


def test_greedy_token_pads_a_short_choice_with_its_mean():
    """As SGLang: a shorter choice's missing tokens count as its own mean logprob, so a
    longer choice sharing its first token does not win by default."""
    from treadle.lang.backend import pick_choice

    assert pick_choice([[-1.0], [-1.0, -5.0], [-2.0]], "greedy_token")[0] == 0
    assert pick_choice([[-1.0], [-1.0, -0.5], [-2.0]], "greedy_token")[0] == 1
    assert pick_choice([[-3.0], [-1.0, -9.0]], "greedy_token")[0] == 1  # the first token decides


def test_unconditional_likelihood_normalized(backend, engine):
    """SGLang's fourth choices_method: the mean gain of each choice token's logprob after the
    text over its logprob with only the BOS/EOS token before it (computed here again, apart)."""
    @function
    def cap(s):
        s += "The capital of France is"
        s += select("city", [" Paris", " London", " the"], choices_method=unconditional_likelihood_normalized)

    st = cap.run(backend=backend)
    meta = st.get_meta_info("city")
    assert st["city"] == " Paris" and meta["method"] == "unconditional_likelihood_normalized"
    ctx = backend.context_token()
    for choice, cond, uncond, score in zip(meta["choices"], meta["token_logprobs"],
                                          meta["unconditional_token_logprobs"], meta["scores"]):
        ids = engine.encode("The capital of France is" + choice)[-len(cond):]
        alone = engine.generate(input_ids=[ctx] + ids, sampling_params={"max_new_tokens": 0}, return_logprob=True,
                                logprob_start_len=1)["meta_info"]["input_token_logprobs"]
        assert [t for _, t, _ in alone] == ids == [t for _, t, _ in uncond]
        uncond = [lp for lp, _, _ in uncond]  # SGLang's [logprob, token id, text] entries
        assert uncond == pytest.approx([lp for lp, _, _ in alone], abs=1e-3)
        assert score == pytest.approx(sum(c - u for c, u in zip(cond, uncond)) / len(cond), abs=1e-6)


def test_variables_set_in_program_order(backend):
    """`s[name] = value` / `s.set_var(name, value)`, as SGLang: a read sees the value the
    program text says; a gen of that name queued after a set replaces it, and a set after a
    gen replaces the gen's value; fork branches that set a name gather it into a list."""
    @function
    def prog(s):
        s["steps"] = 0
        s += "Count to three:"
        for _ in range(3):
            s += gen("word", max_tokens=2, temperature=0)
            s["steps"] = s["steps"] + 1  # read while the gen may still run
        s.set_var("config", {"k": 1})
        s["word"] = "replaced"
        s["late"] = "set"
        s += gen("late", max_tokens=2, temperature=0)
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f["branch"] = i
        forks.join()

    st = prog.run(backend=backend)
    assert st["steps"] == 3 and st["config"] == {"k": 1} and st["word"] == "replaced"
    assert st["late"] != "set" and st.text().endswith(st["late"])
    assert st["branch"] == [0, 1]
    with pytest.raises(ValueError, match="non-empty string"):
        prog2 = function(lambda s: s.set_var("", 1))
        prog2.run(backend=backend).sync()


def test_gen_with_an_ebnf_grammar(backend):
    grammar = 'root ::= item (", " item){2}\nitem ::= "red" | "green" | "blue" | "yellow"'

    @function
    def prog(s):
        s += "Name three colours, separated by commas: "
        s += gen("colours", ebnf=grammar, max_tokens=16, temperature=0)

    out = prog.run(backend=backend)["colours"]
    assert re.fullmatch(r"(red|green|blue|yellow)(, (red|green|blue|yellow)){2}", out), out


def test_dtype_int_and_regex(backend):
    @function
    def prog(s):
        s += "Q: How many legs does a spider have?\nA (a number): "
        s += gen("n", dtype=int, max_tokens=6, temperature=0)
        s += "\nQ: Give a date.\nA: "
        s += gen("date", regex=r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", max_tokens=16, temperature=0)

    st = prog.run(backend=backend)
    assert re.fullmatch(r"[-+]?[0-9]+", st["n"]), st["n"]  # the text, as SGLang's; it parses
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", st["date"])


def test_json_schema_gen(backend):
    import json

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                "age": {"type": "integer"}},
              "required": ["name", "age"]}

    @function
    def prog(s):
        s += "Alice is 31 years old. As JSON: "
        s += gen("j", json_schema=schema, max_tokens=32, temperature=0)

    obj = json.loads(prog.run(backend=backend)["j"])
    assert set(obj) == {"name", "age"} and isinstance(obj["age"], int)


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int


def test_json_schema_gen_from_a_pydantic_model(engine, backend):
    """gen(json_schema=Model) and the Engine's {"json_schema": Model} take the model's schema;
    the output parses into the model."""
    @function
    def prog(s):
        s += "Alice is 31 years old. As JSON: "
        s += gen("j", json_schema=Person, max_tokens=32, temperature=0)

    person = Person.model_validate_json(prog.run(backend=backend)["j"])
    out = engine.generate("Alice is 31 years old. As JSON: ", {"json_schema": Person, "max_new_tokens": 32,
                                                               "temperature": 0})
    assert Person.model_validate_json(out["text"]) == person


def test_unknown_variable_and_nested_role_raise(backend):
    @function
    def prog(s):
        s += "Hello " + gen("greeting", max_tokens=2, temperature=0)
        s["nope"]

    with pytest.raises(KeyError, match="nope.*greeting"):
        prog.run(backend=backend)

    @function
    def nested(s):
        with s.user():
            s += assistant("x")

    with pytest.raises(ValueError, match="inside the open 'user'"):
        nested.run(backend=backend)


def test_invalid_regex_raises(backend):
    with pytest.raises(ValueError, match="invalid regex"):
        gen("x", regex="(unclosed")

    @function
    def prog(s):  # valid for Python, outside the runtime's dialect (no lookaround): gen() says so
        s += "x" + gen("x", regex=r"((?=a)a)+", max_tokens=2, temperature=0)

    with pytest.raises(ValueError, match="not supported"):
        prog.run(backend=backend)


def test_a_gen_the_runtime_refuses_is_named(backend):
    @function
    def prog(s):
        s += "Hi" + gen("first", max_tokens=2, temperature=0) + gen("second", max_tokens=2, temperature=-1)

    with pytest.raises(ValueError, match=r"gen\('second'\): .*temperature"):
        prog.run(backend=backend)


def test_bad_arguments_raise_at_the_call(backend):
    with pytest.raises(ValueError, match="variable name must be a string"):
        gen(5)
    with pytest.raises(ValueError, match="variable name must be a string"):
        select(["a"], ["b", "c"])

    @function
    def prog(s):
        s += "x" + gen("x", max_tokens=2)

    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):  # even if no gen would use it
        prog.run(backend=backend, max_new_tokens=-1)
    with pytest.raises(ValueError, match="top_p"):
        prog.run_batch([{}], backend=backend, top_p=3.0)


def test_run_batch_isolates_errors_and_uses_the_prefix(engine, backend):
    @function
    def classify(s, text):
        s += "Classify the sentiment of movie reviews as positive or negative.\n" * 3
        s += f"Review: {text}\nSentiment:"
        if text == "EARLY":  # fails before the select is ever added: reading "label" raises this
            raise TypeError("early failure")
        s += select("label", [" positive", " negative"])
        if text == "BOOM":
            raise RuntimeError("boom in program")
        if text == "BADGRAMMAR":  # rejected by the runtime's grammar compiler
            s += gen("why", ebnf='root ::= "a" item', max_tokens=2)

    assert classify.trace_prefix(backend).endswith("Review: ")
    texts = ["Great fun!", "BOOM", "Awful, just awful.", "BADGRAMMAR", "EARLY"]
    states = classify.run_batch([{"text": t} for t in texts], backend=backend, progress_bar=False)
    assert states[0]["label"] in (" positive", " negative")
    assert states[2]["label"] in (" positive", " negative")
    # a failed state's text() / messages() give the text it had, as SGLang's; error() has the error
    prompt = "Classify the sentiment of movie reviews as positive or negative.\n" * 3 + "Review: BOOM\nSentiment:"
    # the body raised after queueing the select: its error is kept once the select has run
    assert states[1].text() == prompt + states[1]["label"]
    assert isinstance(states[1].error(), RuntimeError) and "boom in program" in str(states[1].error())
    with pytest.raises(ValueError, match="'item'"):
        states[3]["why"]
    assert states[3]["label"] in (" positive", " negative")  # set before the failing call
    assert states[3].text().endswith("Review: BADGRAMMAR\nSentiment:" + states[3]["label"])
    assert states[3].messages() == [] and "'item'" in str(states[3].error())
    assert states[0].get_meta_info("label")["cached_tokens"] > 0
    with pytest.raises(TypeError, match="early failure"):
        states[4]["label"]


def test_streaming(backend):
    @function
    def prog(s):
        s += "Count: one, two,"
        s += gen("rest", max_tokens=8, temperature=0)

    st = prog.run(backend=backend, stream=True)
    pieces = list(st.text_iter())
    assert "".join(pieces) == st.text()
    assert len(pieces) > 2  # token-level deltas, not one blob
    st2 = prog.run(backend=backend, stream=True)

    async def collect():
        return [d async for d in st2.text_async_iter("rest")]

    assert "".join(asyncio.run(collect())) == st2["rest"]


def _in_thread(fn, timeout_s: float = 60):
    """fn()'s result, or a failure naming the hang (a blocked text_iter must not hang pytest)."""
    import threading

    box: list = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), f"still blocked after {timeout_s}s"
    return box[0]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_fork_branch_stream_ends_when_it_is_joined(backend, stream):
    """A branch's text_iter ended only with an end() that nothing ever called on a branch: it
    blocked forever, even after join. Joined (or when the program ends), it ends."""
    @function
    def prog(s, join):
        s += "Fruits:"
        forks = s.fork(2)
        forks += gen("x", max_tokens=5, temperature=0)
        if join:
            forks.join()
        return forks

    for join in (True, False):
        st = prog.run(join=join, backend=backend, stream=stream)
        branch = st.ret_value[0]
        pieces = _in_thread(lambda: list(branch.text_iter()))
        assert "".join(pieces) == branch.text() and branch["x"]  # from the text it was forked from
        assert _in_thread(lambda: "".join(branch.text_iter("x"))) == branch["x"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_text_iter_of_a_variable_ends_with_its_gen(backend, stream):
    """text_iter(var) waited for the whole program: called in the program's own body it never
    returned, and outside it ended only after every later gen. It ends when the variable's gen
    does (SGLang's tip_suggestion style reads a variable this way in the body)."""
    @function
    def prog(s):
        s += "List:" + gen("x", max_tokens=6, temperature=0)
        s["b0"] = "".join(s.text_iter("x"))
        s += "\nMore:" + gen("y", max_tokens=40, temperature=0, ignore_eos=True)

    st = _in_thread(lambda: prog.run(backend=backend, stream=stream))
    assert _in_thread(lambda: st["b0"]) == st["x"] and st["x"]
    st = prog.run(backend=backend, stream=stream)
    assert _in_thread(lambda: "".join(st.text_iter("x"))) == st["x"]


def test_run_batch_with_arguments_whose_equality_is_not_a_bool(backend):
    """An argument whose == answers elementwise (a numpy array) made run_batch raise while it
    looked for arguments equal in every run; such an argument now counts as varying."""
    import numpy as np  # a dependency of torch

    @function
    def prog(s, arr, q):
        s += f"Data: {arr.tolist()}\nQ: {q}\nA:" + gen("a", max_tokens=3, temperature=0)

    args = [{"arr": np.array([1, 2]), "q": "sum?"}, {"arr": np.array([1, 2]), "q": "max?"}]
    states = prog.run_batch(args, backend=backend, progress_bar=False)
    assert [s["a"] for s in states] == [prog.run(**a, backend=backend)["a"] for a in args]


def test_run_batch_traces_a_retry_loop_that_catches_exception(backend):
    """The prefix tracer stops a program by raising at its first generated value; that was an
    Exception, so a retry loop's `except Exception` swallowed it and tracing ran forever."""
    @function
    def prog(s, q):
        s += "Answer with a number. " + q
        while True:
            try:
                s += gen("n", regex=r"[0-9]+", max_tokens=4, temperature=0)
                return int(s["n"])
            except Exception:  # noqa: BLE001 - the retry loop under test
                s += "\nPlease, only a number: "

    assert _in_thread(lambda: prog.trace_prefix(backend), 30) == "Answer with a number. "
    states = _in_thread(lambda: prog.run_batch([{"q": "2+2?"}, {"q": "3+3?"}], backend=backend,
                                               progress_bar=False))
    assert all(isinstance(s.ret_value, int) for s in states)


def test_a_role_scope_left_by_an_exception_is_closed(backend, engine):
    """An exception leaving `with s.user():` forgot the role on the state but left it open in
    the prompt: a program that caught it wrote the next message inside the user's."""
    @function
    def prog(s):
        try:
            with s.user():
                s += "Hello"
                raise KeyError("x")
        except KeyError:
            pass
        s += assistant("ok")

    st = prog.run(backend=backend)
    msgs = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "ok"}]
    assert st.messages() == msgs
    assert st.text() == apply_chat_template(engine.tokenizer, msgs, add_generation_prompt=False)


def test_a_typed_gen_cut_by_max_tokens_says_so(backend):
    """As SGLang's, the cut value is stored as generated and the program goes on (it raised a
    ValueError until session 40); a warning says why it does not parse."""
    @function
    def prog(s):
        s += "Q: Name a fruit.\nA: " + gen("t", dtype=str, max_tokens=3, temperature=0)
        s += " Done."

    with pytest.warns(UserWarning, match="stopped at max_tokens before the value was complete"):
        st = prog.run(backend=backend)
    assert st["t"].startswith('"') and st.text().endswith(st["t"] + " Done.")


def test_run_batch_of_one_runs_the_body_once_and_checks_num_threads_first(backend):
    calls = []

    @function
    def prog(s, q):
        calls.append(q)  # a side effect: the prefix-tracing run would repeat it
        s += q + gen("a", max_tokens=1, temperature=0)

    for bad in (0, True, "many"):
        with pytest.raises(ValueError, match="num_threads"):
            prog.run_batch([{"q": "Hi"}, {"q": "Ho"}], backend=backend, num_threads=bad)
    assert calls == []  # refused before anything ran, tracing included
    prog.run_batch([{"q": "Hi"}], backend=backend)
    assert calls == ["Hi"]


def test_run_keywords_the_program_takes_go_to_the_program(backend):
    @function
    def prog(s, n, seed=None):  # parameters sharing names with run()'s sampling keywords
        s += "Count:" + " one" * n + gen("next", max_tokens=1, temperature=0)
        return seed

    st = prog.run(n=2, seed=7, backend=backend)
    assert st.text().startswith("Count: one one") and st.ret_value == 7
    states = prog.run_batch([{"n": 1}, (3,)], seed=5, backend=backend)
    assert [st.text()[:-len(st["next"])] for st in states] == ["Count: one", "Count: one one one"]
    assert [st.ret_value for st in states] == [5, 5]
    with pytest.raises(ValueError, match="n=2"):  # one sample per gen here (sgl.OpenAI makes several)
        function(lambda s: s.__iadd__("Hi" + gen("x", n=2, max_tokens=1))).run(backend=backend)
