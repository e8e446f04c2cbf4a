"""SGLang programs that import from SGLang's module paths (`from sglang.lang.api import
set_default_backend`, as its frontend tutorial writes; `sglang.global_config`,
`sglang.lang.backend.runtime_endpoint`, `sglang.lang.choices`, `sglang.lang.tracer`,
`sglang.lang.interpreter`) and that pass gen's arguments by position, in SGLang's order. Ported by
writing `treadle` for `sglang`, nothing else changed; run on the embedded model in process
(`sgl.Engine`) and, where a call is the server's, over HTTP (`sgl.Runtime`)."""
from __future__ import annotations

import asyncio
import json
import re

import pytest
import requests
from test_lang_sglang_port import engine, runtime  # noqa: F401  (an Engine per module; conftest's shared Runtime)

import treadle as sgl
from treadle.srt.server_args import ServerArgs


@pytest.fixture
def backend(engine):
    sgl.set_default_backend(engine)
    yield engine
    sgl.global_config.default_backend = None


def test_the_frontend_tutorials_imports_from_sglang_lang_api(engine):
    # SGLang's frontend tutorial: `from sglang import ...` and `from sglang.lang.api import set_default_backend`
    from treadle import assistant, function, gen, system, user
    from treadle.lang.api import set_default_backend

    @function
    def multi_turn_question(s, question_1, question_2):
        s += system("You are a helpful assistant.")
        s += user(question_1)
        s += assistant(gen("answer_1", max_tokens=6))
        s += user(question_2)
        s += assistant(gen("answer_2", max_tokens=6))

    set_default_backend(engine)
    try:
        state = multi_turn_question(question_1="What is the capital of France?", question_2="And of Italy?",
                                    temperature=0)
        assert [m["role"] for m in state.messages()] == ["system", "user", "assistant", "user", "assistant"]
        assert state["answer_2"]
    finally:
        sgl.global_config.default_backend = None
    from treadle.lang import api

    for name in ("function", "gen", "gen_int", "gen_string", "select", "system", "user", "assistant",
                 "user_begin", "user_end", "assistant_begin", "assistant_end", "system_begin", "system_end",
                 "image", "video", "separate_reasoning", "flush_cache", "get_server_info", "Runtime", "Engine"):
        assert getattr(api, name) is getattr(sgl, name), name


def test_global_config_module_is_the_object_sgl_global_config_is(backend):
    from treadle.global_config import global_config  # was: from sglang.global_config import global_config

    assert global_config is sgl.global_config
    import treadle.global_config  # noqa: F401  (the module again: sgl.global_config stays the object)

    assert sgl.global_config is global_config and sgl.global_config.default_backend is not None
    global_config.enable_precache_with_tracing = False
    try:
        assert sgl.lang.global_config.enable_precache_with_tracing is False
    finally:
        global_config.enable_precache_with_tracing = True


def test_runtime_endpoint_from_its_sglang_module_runs_a_program(runtime):
    from treadle.lang.backend.base_backend import BaseBackend
    from treadle.lang.backend.runtime_endpoint import Runtime, RuntimeEndpoint

    assert Runtime is sgl.Runtime and RuntimeEndpoint is sgl.RuntimeEndpoint
    backend = RuntimeEndpoint(runtime.url)
    assert isinstance(backend, BaseBackend)

    @sgl.function
    def text_qa(s, question):
        s += "Q: " + question + "\n"
        s += "A:" + sgl.gen("answer", stop="\n", max_tokens=8)

    state = text_qa.run(question="What is the capital of France?", temperature=0, backend=backend)
    assert "Paris" in state["answer"]
    from treadle.lang.backend.anthropic import Anthropic
    from treadle.lang.backend.openai import OpenAI

    assert OpenAI is sgl.OpenAI  # a real backend (tests/test_sglang_port_s43.py)
    with pytest.raises(ValueError, match="no API backends"):
        Anthropic("claude-3")


def test_await_runtime_get_server_info_as_sglangs_coroutine(runtime):
    async def main():
        return await runtime.get_server_info()  # SGLang's Runtime.get_server_info is async

    info = asyncio.run(main())
    assert info["model_path"].endswith(".gguf") and "version" in info
    assert runtime.get_server_info()["model_path"] == info["model_path"]  # and a plain call still works


def test_choices_methods_from_sglang_lang_choices(backend):
    from treadle.lang.choices import greedy_token_selection, unconditional_likelihood_normalized

    @sgl.function
    def capital(s):
        s += sgl.user("What is the capital of France?")
        s += sgl.assistant(sgl.gen("answer", choices=["London", "Paris", "Berlin"],
                                   choices_method=greedy_token_selection))
        s += sgl.user("And of Germany?")
        s += sgl.assistant(sgl.gen("again", choices=["London", "Paris", "Berlin"],
                                   choices_method=unconditional_likelihood_normalized))

    state = capital.run()
    assert state["answer"] == "Paris"
    assert "greedy_logprob_matrix" in state.get_meta_info("answer")
    assert "normalized_unconditional_prompt_logprobs" in state.get_meta_info("again")


FEW_SHOT = """The following are questions with answers.
Q: What is the capital of France?
A: Paris
Q: What is the capital of Germany?
A: Berlin
"""


@sgl.function
def few_shot_qa(s, question):
    s += FEW_SHOT
    s += "Q: " + question + "\n"
    s += "A:" + sgl.gen("answer", stop="\n", temperature=0, max_tokens=6)


def test_extract_prefix_by_tracing_then_cache_it(backend, engine):
    # SGLang's trace-and-cache demo: `from sglang.lang.tracer import extract_prefix_by_tracing`
    from treadle.lang.tracer import extract_prefix_by_tracing

    prefix = extract_prefix_by_tracing(few_shot_qa, backend)
    assert prefix == FEW_SHOT + "Q: "
    assert extract_prefix_by_tracing(few_shot_qa.bind(question="What is the capital of Italy?"), None) == (
        FEW_SHOT + "Q: What is the capital of Italy?\nA:")
    sgl.flush_cache()
    sgl.global_config.default_backend.cache_prefix(prefix)
    state = few_shot_qa.run(question="What is the capital of Italy?")
    assert state.get_meta_info("answer")["cached_tokens"] >= len(engine.encode(prefix)) - 1


def test_sglfunction_and_stream_executor_attributes(backend):
    @sgl.function
    def qa(s, question, hint="none"):
        s += "Q: " + question + " (hint: " + hint + ")\nA:"
        s += sgl.gen("answer", max_tokens=4, temperature=0)

    assert qa.func.__name__ == "qa" and qa.arg_names == ["question", "hint"]
    assert qa.arg_defaults == ("none",)  # SGLang's: the defaults of the last parameters
    assert qa.bind(hint="geography").bind_arguments == {"hint": "geography"}
    state = qa.run(question="What is the capital of France?")
    # SGLang's reasoning example prints state.stream_executor.variable_event.keys()
    events = state.stream_executor.variable_event
    assert list(events) == ["answer"] and events["answer"].is_set()
    assert state.stream_executor.variables["answer"] == state["answer"]
    assert state.stream_executor.meta_info["answer"]["completion_tokens"] == 4
    assert state.stream_executor.text_ == state.text()
    from treadle.lang.interpreter import ProgramState, ProgramStateGroup

    assert isinstance(state, ProgramState)

    @sgl.function
    def two(s):
        s += "Hi"
        forks = s.fork(2)
        assert isinstance(forks, ProgramStateGroup)
        forks.join()

    two.run()


def test_gen_arguments_by_position_in_sglangs_order(backend):
    # sgl.gen(name, max_tokens, min_tokens, n, stop, stop_token_ids, stop_regex, temperature, ...)
    expr = sgl.gen("answer", 8, None, None, "\n", None, None, 0.0, 0.9, 5)
    assert expr.params == {"max_tokens": 8, "stop": ["\n"], "temperature": 0.0, "top_p": 0.9, "top_k": 5}
    # ... ignore_eos, return_logprob, logprob_start_len, top_logprobs_num, return_text_in_logprobs,
    # dtype, choices, choices_method, regex, json_schema
    expr = sgl.gen("n", 4, None, None, None, None, None, 0, None, None, None, None, None, None, True, None, 2,
                   None, None, None, None, r"[0-9]+")
    assert expr.params == {"max_tokens": 4, "temperature": 0, "regex": "[0-9]+"}
    assert expr.logprob == {"return_logprob": True, "top_logprobs_num": 2}

    @sgl.function
    def count(s):
        s += "Count: 1, 2, 3, 4," + sgl.gen("next", 8, None, None, ",", None, None, 0.0)
        s += "\nA day has " + sgl.gen_int("hours", 4, None, None, None, None, 0.0) + " hours"

    state = count.run()
    assert state["next"] == " 5" and state.get_meta_info("next")["finish_reason"]["matched"] == ","
    assert re.fullmatch(r"[0-9]+", state["hours"]) and state.get_meta_info("hours")["completion_tokens"] <= 4
    # sgl.gen_int / gen_string(name, max_tokens, n, stop, stop_token_ids, stop_regex, temperature, ...)
    expr = sgl.gen_string("city", 12, None, "}", None, None, 0.5)
    assert expr.dtype is str and expr.params == {"max_tokens": 12, "stop": ["}"], "temperature": 0.5}


@sgl.function
def expand(s, tip):
    s += "Please expand the following tip into a detailed paragraph:" + tip + "\n"
    s += sgl.gen("detailed_tip", max_tokens=8)


@sgl.function
def tip_suggestion(s, topic):
    s += "Here are 2 tips for " + topic + ".\n"
    s += "1." + sgl.gen("tip_1", stop=["\n", ":", "."]) + "\n"
    s += "2." + sgl.gen("tip_2", stop=["\n", ":", "."]) + "\n"
    branch1 = expand(tip=s["tip_1"])
    branch2 = expand(tip=s["tip_2"])
    s += "Tip 1: " + branch1["detailed_tip"] + "\n"
    s += "Tip 2: " + branch2["detailed_tip"] + "\n"
    s += "In summary" + sgl.gen("summary", max_tokens=8)


def test_trace_records_the_program_without_generating(engine):
    # SGLang's tracing tests: prog.trace() with no backend, then tracer.last_node.print_graph_dfs()
    tracer = few_shot_qa.trace()
    assert tracer.last_node.print_graph_dfs().splitlines() == [
        f"%0 = Constant({FEW_SHOT!r})", "%1 = Constant('Q: {question}\\n')", "%2 = Constant('A:')",
        "%3 = Gen('answer', max_tokens=6, stop=['\\n'], temperature=0)"]
    assert tracer.text() == FEW_SHOT + "Q: {question}\nA:{answer}"
    # a program called from a traced body is traced (nothing runs: there is no backend at all), its
    # nodes in the caller's (as SGLang's graph takes in its state)
    tracer = tip_suggestion.trace(topic="staying healthy")
    assert tracer.text().endswith("Tip 1: {detailed_tip}\nTip 2: {detailed_tip}\nIn summary{summary}")
    assert [repr(n) for n in tracer.nodes if "Gen" in repr(n)] == [
        "Gen('tip_1', stop=['\\n', ':', '.'])", "Gen('tip_2', stop=['\\n', ':', '.'])",
        "Gen('detailed_tip', max_tokens=8)", "Gen('detailed_tip', max_tokens=8)", "Gen('summary', max_tokens=8)"]

    @sgl.function
    def tips(s):
        s += sgl.user("Here are two tips for staying healthy: 1. Balanced Diet. 2. Regular Exercise.")
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f"Now, expand tip {i + 1} into a paragraph:\n"
            f += sgl.gen("detailed_tip", max_tokens=16, stop="\n\n")
        forks.join()
        if s["detailed_tip"][0] == "x":  # a variable is a placeholder, equal to no answer
            s += "never"
        s += sgl.assistant(sgl.select("best", ["1", "2"]))

    # with a backend, roles render through its chat template; nothing is sent to it
    before = engine.get_server_info()["prompt_tokens"]
    tracer = tips.trace(backend=engine)
    assert [repr(n) for n in tracer.nodes] == [
        "RoleBegin('user')", "Constant('Here are two tips for staying healthy: 1. Balanced Diet. 2. Regular Exercise.')",
        "RoleEnd('user')", "ForkBranch(0)", "ForkBranch(1)", "Constant('Now, expand tip 1 into a paragraph:\\n')",
        "Gen('detailed_tip', max_tokens=16, stop=['\\n\\n'])", "Constant('Now, expand tip 2 into a paragraph:\\n')",
        "Gen('detailed_tip', max_tokens=16, stop=['\\n\\n'])", "Join('gather', 2 branches)", "RoleBegin('assistant')",
        "Select('best', choices=['1', '2'], choices_method='token_length_normalized')", "RoleEnd('assistant')"]
    assert tracer.nodes[8].print_graph_dfs().splitlines()[2:] == [  # the path through branch 1
        "%2 = RoleEnd('user')", "%3 = ForkBranch(1)", "%4 = Constant('Now, expand tip 2 into a paragraph:\\n')",
        "%5 = Gen('detailed_tip', max_tokens=16, stop=['\\n\\n'])"]
    assert tracer.text().startswith("<|im_start|>system\n") and tracer.text().endswith(
        "<|im_start|>assistant\n{best}<|im_end|>\n")
    assert engine.get_server_info()["prompt_tokens"] == before


def test_runtime_takes_sglangs_names_for_treadles_server_arguments(capfd):
    # SGLang's examples start their Runtime with its server-argument names
    from treadle.runtime.server.testing import free_port

    runtime = sgl.Runtime(port=free_port(), max_total_tokens=4096, random_seed=7, disable_cuda_graph=True,
                          disable_overlap_schedule=True, trust_remote_code=True)
    try:
        info = runtime.get_server_info()
        assert (info["seed"], info["cuda_graph"], info["overlap_schedule"]) == (7, False, "off")

        @sgl.function
        def qa(s, question):
            s += sgl.user(question)
            s += sgl.assistant(sgl.gen("answer", max_tokens=4))

        assert qa.run(question="Hi!", temperature=0, backend=runtime)["answer"]
        # runtime.server_args is SGLang's ServerArgs, with url() (it was treadle's EngineArgs,
        # which has none), and url / generate_url / endpoint are set from it as SGLang's are
        args = runtime.server_args
        assert isinstance(args, ServerArgs)
        assert args.url() == runtime.url == f"http://127.0.0.1:{args.port}"
        assert runtime.generate_url == args.url() + "/generate"
        assert requests.get(args.url() + "/health", timeout=10).status_code == 200
        assert runtime.endpoint.base_url == runtime.url and isinstance(runtime.endpoint.chat_template.name, str)
        # SGLang's default backend after set_default_backend(runtime) is the Runtime, so its
        # shutdown() stops the server; treadle's holds the Runtime's endpoint, whose shutdown()
        # was an AttributeError
        sgl.set_default_backend(runtime)
        try:
            sgl.global_config.default_backend.shutdown()
        finally:
            sgl.set_default_backend(None)
        assert runtime.pid is None
        with pytest.raises(requests.ConnectionError):
            requests.get(runtime.url + "/health", timeout=10)
    finally:
        runtime.shutdown()
    assert capfd.readouterr().out == ""  # log_level "error", SGLang's default: the server printed nothing
    # the ones treadle has no equivalent for say why, before anything starts
    with pytest.raises(ValueError, match="chat_template: roles render with the served model's own chat template"):
        sgl.Runtime(chat_template="chatml")
    with pytest.raises(ValueError, match="both name treadle's 'seed'"):
        sgl.Runtime(random_seed=1, seed=2)


def test_runtime_endpoint_and_generate_take_sglangs_parameters(runtime):
    # RuntimeEndpoint(base_url, api_key=None, verify=None, chat_template_name=None), as SGLang's
    backend = sgl.RuntimeEndpoint(base_url=runtime.url)
    assert backend.base_url == runtime.url
    backend = sgl.RuntimeEndpoint(runtime.url, None, False)  # verify, by position
    assert backend.session.verify is False and backend.timeout_s is None  # no read timeout, as SGLang's
    with pytest.raises(TypeError, match="URL once"):
        sgl.RuntimeEndpoint()

    @sgl.function
    def capital(s):
        s += "The capital of France is" + sgl.gen("city", max_tokens=2)

    assert "Paris" in capital.run(temperature=0, backend=backend)["city"]
    # Runtime.generate(prompt, sampling_params, return_logprob, logprob_start_len, top_logprobs_num, lora_path)
    out = runtime.generate("The capital of France is", {"max_new_tokens": 2, "temperature": 0}, False, None, None,
                           None)
    assert "Paris" in out
    with pytest.raises(ValueError, match="no LoRA"):
        runtime.generate("Hi", {"max_new_tokens": 1}, lora_path=["adapter"])


def test_json_decode_example_builds_its_regex_with_build_regex_from_object(backend):
    # SGLang's examples/frontend_language/usage/json_decode.py
    from enum import Enum

    from pydantic import BaseModel

    from treadle.srt.constrained import build_regex_from_object as older_path
    from treadle.srt.constrained.outlines_backend import build_regex_from_object

    assert older_path is build_regex_from_object

    class Weapon(str, Enum):
        sword = "sword"
        axe = "axe"
        mace = "mace"

    class Wizard(BaseModel):
        name: str
        age: int
        weapon: Weapon

    @sgl.function
    def pydantic_wizard_gen(s):
        s += "Give me a description about a wizard in the JSON format.\n"
        s += sgl.gen("character", max_tokens=48, temperature=0, regex=build_regex_from_object(Wizard))

    state = pydantic_wizard_gen.run()
    wizard = Wizard.model_validate_json(state["character"])
    assert wizard.weapon in Weapon
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert re.fullmatch(build_regex_from_object(schema), '{"n":12}')
    assert re.fullmatch(build_regex_from_object(json.dumps(schema), r"[ ]?"), '{ "n": 12 }')


def test_frontend_tutorials_helpers_from_sglang_utils(runtime, capsys):
    # the tutorial waits for its server, prints each result with print_highlight, and stops the server
    import subprocess
    import sys

    from treadle.utils import print_highlight, terminate_process, wait_for_server

    wait_for_server(runtime.url)
    sgl.set_default_backend(sgl.RuntimeEndpoint(runtime.url))
    try:
        @sgl.function
        def text_qa(s, question):
            s += sgl.user(question)
            s += sgl.assistant(sgl.gen("answer", stop="\n", max_tokens=6))

        states = text_qa.run_batch([{"question": "What is the capital of France?"},
                                    {"question": "What is the capital of Japan?"}], progress_bar=True, temperature=0)
        for i, state in enumerate(states):
            print_highlight(f"Answer {i + 1}: {states[i]['answer']}")
    finally:
        sgl.global_config.default_backend = None
    out = capsys.readouterr().out
    assert out.startswith("Answer 1: ") and "\nAnswer 2: " in out
    with pytest.raises(TimeoutError, match="did not become ready within 0.5 s"):
        wait_for_server("http://127.0.0.1:9", timeout=0.5)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    terminate_process(proc)
    assert proc.returncode is not None


def test_stop_and_stop_token_ids_as_tuples(backend, engine):
    # SGLang's sampling params default stop to () and send any tuple as a JSON list
    comma = engine.encode(",")[-1]

    @sgl.function
    def count(s, stop, stop_token_ids):
        s += "Count: 1, 2," + sgl.gen("a", max_tokens=8, stop=stop, stop_token_ids=stop_token_ids)

    assert count.run((",", "."), None, temperature=0)["a"] == " 3"
    assert count.run(None, (comma,), temperature=0)["a"] == " 3"
    assert count.run((), None, temperature=0).get_meta_info("a")["finish_reason"]["type"] == "length"

    @sgl.function
    def plain(s):
        s += "Count: 1, 2," + sgl.gen("a", max_tokens=8)

    # as run()'s defaults too
    assert plain.run(temperature=0, stop=(",",))["a"] == " 3"
    assert plain.run(temperature=0, stop_token_ids=(comma,))["a"] == " 3"


def test_compile_prints_the_graph_and_runs_as_the_program(backend, capsys):
    # SGLang's tracing test_multi_function: compiled = tip_suggestion.compile(); compiled.print_graph(); compiled.run(...)
    compiled = tip_suggestion.compile()
    compiled.print_graph()
    graph = capsys.readouterr().out
    assert "Gen('tip_1', stop=['\\n', ':', '.'])" in graph and graph.rstrip().endswith("Gen('summary', max_tokens=8)")
    state = compiled.run(topic="staying healthy", temperature=0, max_new_tokens=8)
    assert state.text().startswith("Here are 2 tips for staying healthy.\n1.") and state["summary"]
    states = compiled.run_batch([{"topic": "sleeping well"}, {"topic": "eating well"}], temperature=0,
                                max_new_tokens=8)
    assert [s.text().split(".\n")[0] for s in states] == ["Here are 2 tips for sleeping well",
                                                          "Here are 2 tips for eating well"]


def test_json_logprobs_example_requests_through_http_request(runtime):
    # SGLang's examples/frontend_language/usage/json_logprobs.py: srt_api_request with sglang.utils.http_request
    from treadle.utils import http_request

    character_regex = r"""\{"name": "[A-Z][a-z]{1,12}", "house": "(Gryffindor|Slytherin)"\}"""
    data = {"text": "Hermione Granger is a character in Harry Potter. Her information as JSON:\n",
            "sampling_params": {"temperature": 0, "max_new_tokens": 32, "regex": character_regex},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 3, "return_text_in_logprobs": True}
    res = http_request(runtime.url + "/generate", json=data).json()
    assert re.fullmatch(character_regex, res["text"])
    meta = res["meta_info"]
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    assert all(len(top) <= 3 for top in meta["output_top_logprobs"])
    assert http_request(runtime.url + "/health").status_code == 200
    assert http_request(runtime.url + "/generate", json={"text": "x", "sampling_params": {"top_p": 2}}).status_code == 400


def test_set_default_backend_none_clears_it(engine):
    sgl.set_default_backend(engine)
    sgl.set_default_backend(None)  # SGLang's sets global_config.default_backend = None
    assert sgl.global_config.default_backend is None
    with pytest.raises(ValueError, match="no backend"):
        few_shot_qa.run(question="What is the capital of Italy?")
    sgl.set_default_backend(None)  # and again, with none set
    assert sgl.global_config.default_backend is None


def test_roles_take_their_content_as_sglangs_expr_keyword(backend):
    @sgl.function
    def chat(s):
        s += sgl.system(expr="You are terse.")
        s.user(expr="What is the capital of France?")
        s += sgl.assistant(expr=sgl.gen("answer", max_tokens=6))

    state = chat.run(temperature=0)
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant"]
    assert state.messages()[1]["content"] == "What is the capital of France?"
    # the other keyword names of SGLang's api: function(func=...), image(expr=...)
    terse = sgl.function(func=chat.func, num_api_spec_tokens=None)
    assert terse.run(temperature=0)["answer"] == state["answer"]
    with pytest.raises(ValueError, match="text-only models"):
        sgl.image(expr="example_image.png")
