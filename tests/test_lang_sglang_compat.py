"""SGLang frontend programs, written as SGLang documents them (`import treadle.lang as sgl` and
nothing else), run on the embedded model twice: in process (`sgl.Engine`) and over HTTP through
a server this module starts with `sgl.Runtime` (one for the module, stopped by `shutdown()`)."""
from __future__ import annotations

import asyncio
import json
import re

import pytest
import requests

import treadle.lang as sgl


@pytest.fixture(scope="module")
def engine():
    eng = sgl.Engine(max_total_tokens=8192)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def runtime(sgl_runtime):  # conftest's shared Runtime (whose shutdown test_lang_sglang_module_paths_... checks)
    assert requests.get(sgl_runtime.url + "/health", timeout=5).status_code == 200
    return sgl_runtime


@pytest.fixture(scope="module", params=["engine", "http"])
def backend(request, sgl_runtime):  # named here, so conftest sees this module among the Runtime's users
    be = request.getfixturevalue({"engine": "engine", "http": "runtime"}[request.param])
    if request.param == "http":  # the way SGLang programs also set it
        sgl.global_config.default_backend = be
    else:
        sgl.set_default_backend(be)
    assert sgl.get_default_backend() is not None and sgl.global_config.default_backend is not None
    yield be
    sgl.global_config.default_backend = None


@sgl.function
def qa(s, question):
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=8))


def test_calling_a_program_runs_it(backend):
    state = qa(question="What is the capital of France?", temperature=0)
    answer = state["answer"]
    assert answer and state.text().endswith(answer + "<|im_end|>\n")
    assert state.messages() == [{"role": "system", "content": "You are a helpful assistant."},
                                {"role": "user", "content": "What is the capital of France?"},
                                {"role": "assistant", "content": answer}]
    assert qa.run(question="What is the capital of France?", temperature=0)["answer"] == answer

    streamed = qa(question="What is the capital of France?", temperature=0, stream=True)
    pieces = list(streamed.text_iter("answer"))
    assert len(pieces) > 1 and "".join(pieces) == streamed["answer"] == answer

    @sgl.function(num_api_spec_tokens=64)  # accepted; nothing to speculate without an API backend
    def outer(s):
        qa(s, "What is the capital of France?")  # a program called on a state runs on that state
        s += sgl.user_begin() + "Thanks!" + sgl.user_end()
        s += sgl.assistant_begin() + sgl.gen("bye", max_tokens=3) + sgl.assistant_end()
        return len(s["answer"])

    state = outer(temperature=0)
    assert state["answer"] == answer and state.ret_value == len(answer)
    assert state.messages()[3:] == [{"role": "user", "content": "Thanks!"},
                                    {"role": "assistant", "content": state["bye"]}]
    assert outer.num_api_spec_tokens == 64


def test_typed_gens_end_and_parse(backend):
    @sgl.function
    def facts(s):
        s += "A day has " + sgl.gen_int("hours", max_tokens=8) + " hours.\n"
        s += "Pi is about " + sgl.gen("pi", dtype=float, max_tokens=8) + ".\n"
        s += "Q: Is Paris in France? Answer True or False.\nA: " + sgl.gen("yes", dtype=bool) + "\n"
        s += "Q: Is 7 odd?\nA: " + sgl.gen("odd", regex=sgl.REGEX_BOOL) + "\n"

    @sgl.function
    def record(s):
        s += '{"country": "France", "capital": ' + sgl.gen_string("capital", max_tokens=8) + "}"

    state = facts(temperature=0)
    # an integer ends where the model writes a space: it stops at its own "24", the number it
    # writes when free ("A day has 24 hours of daylight"), not a run of digits to max_tokens
    assert state["hours"] == "24" and int(state["hours"]) == 24
    assert state.get_meta_info("hours")["finish_reason"] == {"type": "stop", "matched": " "}
    assert re.fullmatch(r"[-+]?[0-9]*\.?[0-9]+", state["pi"]) and float(state["pi"]) < 1e6
    capital = record(temperature=0)["capital"]  # a JSON string literal with its quotes, as SGLang keeps it
    assert capital.startswith('"') and capital.endswith('"') and isinstance(json.loads(capital), str)
    assert state["yes"] in ("True", "False") and state["odd"] in ("True", "False")
    assert state.text().startswith(f"A day has 24 hours.\nPi is about {state['pi']}.\n")

    from treadle.lang.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR  # where SGLang keeps them

    assert (REGEX_INT, REGEX_FLOAT, REGEX_BOOL, REGEX_STR) == (sgl.REGEX_INT, sgl.REGEX_FLOAT, sgl.REGEX_BOOL,
                                                               sgl.REGEX_STR)
    assert REGEX_INT == r"[-+]?[0-9]+[ \n]*" and REGEX_STR == r"\"[\w\d\s]*\""


def test_var_scope_fork_and_copy(backend):
    @sgl.function
    def plan(s, topic):
        s += f"Topic: {topic}\n"
        with s.var_scope("first_step"):
            s += "Step 1:" + sgl.gen("step", max_tokens=6, stop="\n") + "\n"
        forks = s.fork(2)
        forks += lambda i: f"Idea {i + 1}:"
        forks += sgl.gen("idea", max_tokens=5, stop="\n")
        forks.join()
        with s.copy() as c:
            c += "Summary:" + sgl.gen("summary", max_tokens=5, stop="\n")

    state = plan(topic="baking bread", temperature=0)
    state.sync()
    state.set_var("topic_seen", "baking bread")
    assert state.get_var("topic_seen") == "baking bread" and state.get_var("step") == state["step"]
    assert state["first_step"] == "Step 1:" + state["step"] + "\n"
    assert state.text().endswith(state["first_step"])  # branches and the copy add variables, not text
    assert len(state["idea"]) == 2 and all(isinstance(x, str) and x for x in state["idea"])
    assert len(state["summary"]) == 1 and isinstance(state["summary"][0], str)
    assert "idea" in state and "nothing" not in state


def test_select_and_its_choices_methods(backend):
    @sgl.function
    def pick(s):
        s += "Q: What colour is the sky on a clear day?\nA: The sky is"
        s += sgl.select("tln", [" blue", " green"])
        s += "\nAgain: The sky is" + sgl.select("greedy", [" blue", " green"],
                                                choices_method=sgl.greedy_token_selection)
        s += "\nAgain: The sky is" + sgl.gen("uln", choices=[" blue", " green"],
                                             choices_method=sgl.unconditional_likelihood_normalized)
        s += "\nAgain: The sky is" + sgl.select("named", [" blue", " green"],
                                                choices_method=sgl.token_length_normalized)

    state = pick()
    for name in ("tln", "greedy", "uln", "named"):
        assert state[name] == " blue", (name, state.get_meta_info(name))
    assert state["tln"] == state["named"]


def test_run_batch_generator_style_and_progress_bar(backend, capsys):
    @sgl.function
    def capital(s, country, max_words=3):
        s += f"The capital of {country} is"
        s += sgl.gen("city", max_tokens=max_words, stop="\n")

    batch = [{"country": "France"}, {"country": "Japan"}, {"country": "Italy"}]
    states = capital.run_batch(batch, temperature=0, num_threads=2, progress_bar=True, generator_style=True)
    assert not isinstance(states, list)  # a generator: states come as they finish, in input order
    got = [(st.text(), st["city"]) for st in states]
    assert [text for text, _ in got] == [f"The capital of {b['country']} is{city}" for b, (_, city) in zip(batch, got)]
    assert "programs" in capsys.readouterr().err  # the progress bar was drawn
    plain = capital.run_batch([("France",), ("Japan", 3), ("Italy", 3)], temperature=0)  # arguments in order
    assert [st["city"] for st in plain] == [city for _, city in got]


def test_streams_join_to_the_final_text(backend):
    @sgl.function
    def story(s):
        s += "Once upon a time"
        s += sgl.gen("first", max_tokens=6, stop="\n")
        s += " Then" + sgl.gen("second", max_tokens=6, stop="\n")

    state = story.run(stream=True, temperature=0)
    pieces = list(state.text_iter())
    assert "".join(pieces) == state.text() and state.error() is None

    async def collect():
        st = story.run(stream=True, temperature=0)
        parts = [x async for x in st.text_async_iter(var_name="second", return_meta_data=True)]
        return st, parts

    st, parts = asyncio.run(collect())
    assert "".join(text for text, _ in parts) == st["second"]
    assert parts[-1][1]["completion_tokens"] == st.get_meta_info("second")["completion_tokens"]
    assert st.text() == state.text()


def test_errors_where_sglang_documents_them(backend):
    with pytest.raises(ValueError, match="text-only"):
        sgl.image("cat.png")
    with pytest.raises(ValueError, match="text-only"):
        sgl.video("clip.mp4", 8)
    with pytest.raises(ValueError, match="no API backends"):
        sgl.Anthropic("claude-3")
    with pytest.raises(ValueError, match="n=2"):  # on a runtime's backend (sgl.OpenAI takes it)
        sgl.function(lambda s: s.__iadd__("Hi" + sgl.gen("x", n=2, max_tokens=1))).run()
    with pytest.raises(ValueError, match="n=0"):
        sgl.gen("x", n=0)

    @sgl.function
    def broken(s):
        s += "Hello" + sgl.gen("x", max_tokens=2, temperature=-1.0)

    state = broken(stream=True)  # a streamed run keeps its error on the state
    assert isinstance(state.error(), ValueError) and "temperature" in str(state.error())
    with pytest.raises(ValueError, match="temperature"):
        broken()


def test_global_config_server_info_and_flush_cache(backend, capsys):
    assert sgl.global_config.default_backend is not None
    info = sgl.get_server_info()
    assert isinstance(info, dict) and info
    assert sgl.flush_cache()

    @sgl.function
    def hello(s):
        s += sgl.system_begin() + "Be brief." + sgl.system_end()
        s += "Hello," + sgl.gen("x")

    sgl.global_config.verbosity = 2  # prints each program's text after it runs
    try:
        state = hello(temperature=0, max_new_tokens=2)
    finally:
        sgl.global_config.verbosity = 0
    assert state.text() in capsys.readouterr().out
    assert state.messages() == [{"role": "system", "content": "Be brief."}]
    assert state.get_meta_info("x")["completion_tokens"] <= 2


def test_runtime_endpoint_and_bad_runtime_arguments(runtime):
    @sgl.function
    def capital(s):
        s += "The capital of France is" + sgl.gen("city", max_tokens=3)

    endpoint = sgl.RuntimeEndpoint(runtime.url)
    assert capital.run(temperature=0, backend=endpoint)["city"] == capital.run(temperature=0, backend=runtime)["city"]
    with pytest.raises(ValueError, match="no_such_flag"):
        sgl.Runtime(no_such_flag=1)  # refused before any process starts
