"""Session 43's porting checks: SGLang's `sgl.OpenAI` backend (a ValueError "no API backends"
before), run on the real `openai` client against treadle's own server (the shared plain_server)
through `base_url`, and compared with the same program on a RuntimeEndpoint of that server."""
from __future__ import annotations

import json

import pytest

import treadle as sgl


@pytest.fixture(scope="module")
def url(plain_server):
    return plain_server.url


def chat_backend(url: str, **kw) -> sgl.OpenAI:
    return sgl.OpenAI("default", base_url=url + "/v1", api_key="none", max_retries=0, **kw)


@sgl.function
def multi_turn_question(s, question_1, question_2):
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(question_1)
    s += sgl.assistant(sgl.gen("answer_1", max_tokens=16))
    s += sgl.user(question_2)
    s += sgl.assistant(sgl.gen("answer_2", max_tokens=16))


def test_chat_program_as_sglangs_readme_gives_the_runtime_endpoints_answers(url):
    """SGLang's multi-turn example on `sgl.OpenAI(model, base_url=...)`: each gen is a chat
    completion of the messages before it, so greedy answers equal the RuntimeEndpoint's (which
    renders the same messages with the model's own template), and usage is counted."""
    args = dict(question_1="What is the capital of France?", question_2="Name one museum there.", temperature=0)
    backend = chat_backend(url)
    state = multi_turn_question.run(backend=backend, **args)
    ref = multi_turn_question.run(backend=sgl.RuntimeEndpoint(url), **args)
    assert state["answer_1"] and state["answer_1"] == ref["answer_1"] and state["answer_2"] == ref["answer_2"]
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant", "user", "assistant"]
    assert state.messages()[2]["content"] == state["answer_1"].strip()
    meta = state.get_meta_info("answer_2")
    assert meta["completion_tokens"] > 0 and meta["finish_reason"]["type"] in ("stop", "length")
    assert backend.token_usage.prompt_tokens > meta["prompt_tokens"] > 0  # both requests counted
    # streamed: the variable's deltas join to the same answer
    streamed = multi_turn_question.run(backend=backend, stream=True, **args)
    parts = list(streamed.text_iter("answer_1"))
    assert len(parts) > 1 and "".join(parts) == state["answer_1"]


def test_gen_n_gives_the_list_of_samples_as_sglangs_openai_example_n(url):
    """SGLang's openai_example_n.py: gen(n=2) on sgl.OpenAI is a list of two answers, and the
    conversation goes on with the first (on other backends it is refused at run)."""

    @sgl.function
    def multi_turn_question(s, question_1, question_2):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user(question_1)
        s += sgl.assistant(sgl.gen("answer_1", max_tokens=8, n=2))
        s += sgl.user(question_2)
        s += sgl.assistant(sgl.gen("answer_2", max_tokens=8))

    state = multi_turn_question.run(question_1="Name a color.", question_2="Another one?", temperature=0,
                                    backend=chat_backend(url))
    first = state["answer_1"]
    assert isinstance(first, list) and len(first) == 2 and first[0] == first[1]  # greedy: the same twice
    assert state.messages()[2]["content"] == first[0].strip() and isinstance(state["answer_2"], str)
    with pytest.raises(ValueError, match="n=2"):
        multi_turn_question.run(question_1="a", question_2="b", backend=sgl.RuntimeEndpoint(url))


def test_num_api_spec_tokens_runs_an_assistant_message_as_one_request(url):
    """SGLang's speculative execution (its openai_chat_speculative.py): with num_api_spec_tokens,
    an assistant message with text and several gens is one chat request, whose reply is split
    into the gens at their stop strings. It was a ValueError (a gen must start the message)."""

    @sgl.function(num_api_spec_tokens=32)
    def fruits(s):
        s += sgl.user("List three fruits, one per line.")
        s += sgl.assistant("1." + sgl.gen("a", stop="\n") + "\n2." + sgl.gen("b", stop="\n") + "\n3." +
                           sgl.gen("c", stop="\n"))
        return s["c"]  # read in the body: waits for the message's request

    backend = chat_backend(url)
    state = fruits.run(backend=backend, temperature=0)
    import openai

    reply = openai.OpenAI(base_url=url + "/v1", api_key="none").chat.completions.create(
        model="default", messages=[{"role": "user", "content": "List three fruits, one per line."}],
        max_tokens=32, temperature=0)
    text = reply.choices[0].message.content
    assert text == f"1.{state['a']}\n2.{state['b']}\n3.{state['c']}" and state.ret_value == state["c"]
    assert all("\n" not in state[k] and state[k].strip() for k in "abc")
    assert state.messages()[-1] == {"role": "assistant", "content": text}
    assert backend.token_usage.completion_tokens == reply.usage.completion_tokens  # one request
    with pytest.raises(ValueError, match="num_api_spec_tokens"):  # without it, as SGLang's
        sgl.function(fruits.func).run(backend=backend, temperature=0)


def test_num_api_spec_tokens_on_a_completion_model_reuses_the_speculated_text(url):
    """SGLang's completion-model speculation (its test_completion_speculative): a gen with a stop
    string asks for num_api_spec_tokens without it, and the program's next text and gens take
    the rest while it matches: the greedy values of three requests, from one."""

    def fruits(s):
        s += "A list of fruits:\n1." + sgl.gen("a", 8, stop="\n") + "\n2." + sgl.gen("b", 8, stop="\n")
        s += "\n3." + sgl.gen("c", 8, stop="\n") + "\n"

    backend = chat_backend(url, is_chat_model=False)
    plain = sgl.function(fruits).run(backend=backend, temperature=0)
    usage_plain = backend.token_usage.prompt_tokens
    backend.token_usage.reset()
    spec = sgl.function(num_api_spec_tokens=24)(fruits).run(backend=backend, temperature=0)
    assert [spec[k] for k in "abc"] == [plain[k] for k in "abc"] and all(plain[k].strip() for k in "abc")
    assert spec.text() == plain.text()
    assert backend.token_usage.prompt_tokens < usage_plain / 2  # one request's prompt, not three


def test_the_client_reads_openai_base_url_and_a_json_schema_is_enforced(url, monkeypatch):
    """`sgl.OpenAI("...")` with OPENAI_BASE_URL / OPENAI_API_KEY set (how a program written for
    OpenAI is pointed elsewhere); gen(json_schema=...) goes as response_format, return_logprob as
    the API's logprobs."""
    monkeypatch.setenv("OPENAI_BASE_URL", url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "none")
    sgl.set_default_backend(sgl.OpenAI("SmolLM2-135M-Instruct"))
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}

    @sgl.function
    def city(s):
        s += sgl.user("Give the capital of France as JSON.")
        s += sgl.assistant(sgl.gen("json", max_tokens=24, json_schema=schema, return_logprob=True,
                                   top_logprobs_num=2))

    try:
        state = city.run(temperature=0)
    finally:
        sgl.set_default_backend(None)
    assert isinstance(json.loads(state["json"])["city"], str)
    meta = state.get_meta_info("json")
    toks = meta["output_token_logprobs"]
    assert len(toks) == meta["completion_tokens"] and all(lp <= 0 for lp, _, _ in toks)
    assert "".join(t for _, _, t in toks).startswith(state["json"][:4])
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])

    @sgl.function
    def story(s):  # no max_tokens: SGLang's 128, not the API's "until the context is full"
        s += sgl.user("Write a long story about a dragon.")
        s += sgl.assistant(sgl.gen("story", ignore_eos=True))

    meta = story.run(backend=sgl.OpenAI("default"), temperature=0).get_meta_info("story")
    assert meta["completion_tokens"] == 128 and meta["finish_reason"]["type"] == "length"


def test_completion_model_select_scores_as_the_runtime_endpoint(url):
    """`is_chat_model=False`: the program's text is the prompt; select scores each choice from the
    prompt logprobs of an echo request, the same numbers as the RuntimeEndpoint's select;
    regex / dtype constraints are enforced by the server, not dropped."""

    @sgl.function
    def quiz(s, q):
        s += "Q: " + q + "\nA:" + sgl.gen("a", max_tokens=8, stop="\n")
        s += "\nIs that a city? " + sgl.select("yn", ["yes", "no", "maybe not"])
        s += "\nIts population in millions: " + sgl.gen("n", dtype=int, max_tokens=6)
        s += "\nCode: " + sgl.gen("code", regex="[A-Z]{3}", max_tokens=6)

    backend = sgl.OpenAI("default", is_chat_model=False, base_url=url + "/v1", api_key="none", max_retries=0)
    ref = quiz.run(q="What is the capital of France?", temperature=0, backend=sgl.RuntimeEndpoint(url))
    states = quiz.run_batch([{"q": "What is the capital of France?"}] * 2, temperature=0, backend=backend,
                            num_threads=2, progress_bar=True)
    for state in states:
        assert state["a"] == ref["a"] and state["yn"] == ref["yn"]
        mine, theirs = state.get_meta_info("yn"), ref.get_meta_info("yn")
        assert mine["normalized_prompt_logprobs"] == pytest.approx(theirs["normalized_prompt_logprobs"], abs=1e-3)
        assert [[t for _, _, t in es] for es in mine["input_token_logprobs"]] == \
            [[t for _, _, t in es] for es in theirs["input_token_logprobs"]]
        assert state["n"].isdigit() and len(state["code"]) == 3 and state["code"].isupper()
    greedy = sgl.function(lambda s: s.__iadd__("The sky is " + sgl.select(
        "c", ["blue", "green"], choices_method=sgl.greedy_token_selection))).run(backend=backend)
    assert greedy["c"] in ("blue", "green") and "greedy_logprob_matrix" in greedy.get_meta_info("c")


def test_what_the_openai_backend_refuses_it_names(url, monkeypatch):
    backend = chat_backend(url)

    @sgl.function
    def inline(s):
        s += sgl.user("Hi")
        s += sgl.assistant("Sure: " + sgl.gen("x", max_tokens=4))

    with pytest.raises(ValueError, match="first thing of an assistant message"):
        inline.run(backend=backend)

    @sgl.function
    def pick(s):
        s += sgl.user("Yes or no?")
        s += sgl.assistant(sgl.select("x", ["yes", "no"]))

    with pytest.raises(ValueError, match="needs a completion model"):
        pick.run(backend=backend)
    completion = chat_backend(url, is_chat_model=False)

    @sgl.function
    def uncond(s):
        s += "Pick: " + sgl.select("x", ["a", "b"], choices_method=sgl.unconditional_likelihood_normalized)

    with pytest.raises(ValueError, match="unconditional_likelihood_normalized"):
        uncond.run(backend=completion)

    @sgl.function
    def bad_regex(s):
        s += sgl.user("Hi")
        s += sgl.assistant(sgl.gen("x", max_tokens=4, ebnf="root ::= ("))

    state = bad_regex.run(backend=backend, stream=True)  # the server's 400, kept on the state
    assert isinstance(state.error(), ValueError) and "HTTP 400" in str(state.error())
    gpt = sgl.OpenAI("gpt-4o-mini", base_url=url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(ValueError, match="does not exist"):  # a model the server does not serve
        multi_turn_question.run(question_1="a", question_2="b", backend=gpt)
    # SGLang's templates for OpenAI's names: "chatgpt" (roles add no text); the instruct model completes
    instruct = sgl.OpenAI("gpt-3.5-turbo-instruct", base_url=url + "/v1", api_key="none")
    assert gpt.chat_template.name == instruct.chat_template.name == "chatgpt" and gpt.is_chat_model
    assert not instruct.is_chat_model and backend.chat_template.name == "default"
    # the frontend's server calls on an API backend go on, as SGLang's (its BaseBackend's do nothing)
    assert sgl.flush_cache(backend) is False and sgl.get_server_info(backend) is None
    backend.shutdown()
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ValueError, match="base_url"):  # no key: how to point it at another server
        sgl.OpenAI("gpt-4o-mini")
