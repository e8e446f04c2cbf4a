"""Session 46's porting checks of treadle.lang (SGLang programs with `import treadle.lang as sgl`),
over conftest's shared Runtime (a real server subprocess of the embedded model)."""
from __future__ import annotations

import subprocess
import sys

import pytest

import treadle.lang as sgl


def test_runtime_does_not_take_another_servers_health_for_its_own(sgl_runtime):
    """A Runtime picks a free port, then its server loads the model and binds it; another
    process may take the port meanwhile (seen here: a test's server started on the same port a
    second earlier). Its /health answered 200, the Runtime took it for its own server and ran the
    program on the other one (its own exited on 'address already in use'). Here: a child that
    never serves (it exits after a second) while the shared Runtime's server answers the URL."""
    rt = sgl.Runtime.__new__(sgl.Runtime)
    rt.server_args, rt.url = sgl_runtime.server_args, sgl_runtime.url
    rt._proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
    try:
        with pytest.raises(RuntimeError, match=r"served by another process \(pid \d+\)"):
            rt._wait_healthy(60)
    finally:
        rt._proc.wait()
        rt._proc = None


def test_runtime_on_an_ipv6_host_finds_a_free_port_and_brackets_its_url():
    """`sgl.Runtime(host="::1")` (and `treadle.utils.launch_server_cmd(cmd, host="::1")`) raised
    'no free port in 30000..39999 on ::1': the port scan bound an IPv4 socket to an IPv6 address,
    which fails on every port; and the Runtime's URL was http://::1:port. (Checked by hand: such a
    Runtime then serves a program at http://[::1]:port.) A port taken on ::1 is still skipped."""
    import socket

    from treadle.lang.runtime_process import _free_port_from
    from treadle.lang.utils import _free_port

    port = _free_port_from(31000, "::1")  # was the RuntimeError
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as held:
        held.bind(("::1", port))  # free indeed
        held.listen(1)
        assert _free_port_from(port, "::1") > port  # taken: skipped
    assert 30000 <= _free_port("::1") < 40000

    from treadle.lang.runtime_process import _local_url

    assert _local_url("::1", port) == f"http://[::1]:{port}"
    assert _local_url("::", 8000) == _local_url("0.0.0.0", 8000) == "http://127.0.0.1:8000"
    assert _local_url("localhost", 8000) == "http://localhost:8000"


@pytest.mark.parametrize("stream_reasoning", [True, False])
def test_reasoning_parser_reads_a_closing_tag_streamed_in_pieces(stream_reasoning):
    """SGLang's ReasoningParser.parse_stream_chunk, fed a model's deltas token by token. A model
    whose tokenizer spells the tags in several tokens (the embedded SmolLM2's: '</', 'think', '>')
    streams '</think>' in three deltas; the parser held back a delta only while the whole text
    since the last emit might begin a tag, so it never saw the closing tag: the answer ('Paris')
    came out as reasoning, or, with stream_reasoning=False, never came out at all."""
    from treadle.srt.parser.reasoning_parser import ReasoningParser

    deltas = ["<", "think", ">", "\n", "The", " plan", ".", "\n", "</", "think", ">", "\n", "\n", "Paris"]
    parser = ReasoningParser(model_type="qwen3", stream_reasoning=stream_reasoning)
    parts = [parser.parse_stream_chunk(d) for d in deltas]
    reasoning, answer = "".join(r for r, _ in parts), "".join(a for _, a in parts)
    assert reasoning.strip() == "The plan." and answer.strip() == "Paris", parts
    forced = ReasoningParser(model_type="deepseek-r1", stream_reasoning=stream_reasoning)  # starts inside
    parts = [forced.parse_stream_chunk(d) for d in ["a<", "b</th", "ink", ">c"]]
    assert ("".join(r for r, _ in parts), "".join(a for _, a in parts)) == ("a<b", "c"), parts


# Mistral-7B-Instruct-v0.1's and Gemma-it's chat templates (as their tokenizer_config.json has them):
# neither renders a system message, and both raise on one
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}")


@pytest.mark.parametrize("template", [MISTRAL_TEMPLATE, GEMMA_TEMPLATE], ids=["mistral", "gemma"])
def test_roles_render_with_a_model_template_that_refuses_a_system_message(sgl_runtime, template):
    """A served Mistral-Instruct or Gemma model: its template raises on a system message, and the
    backend rendered one to derive every role's strings, so any program with roles failed
    ("'raise_exception' is undefined" over HTTP). Now user and assistant messages render as the
    template renders them, and a system message is a ValueError saying the template has none."""
    from treadle.lang.chat_template import ChatTemplate, jinja_renderer

    render = jinja_renderer(template, "<s>", "</s>")
    endpoint = sgl.RuntimeEndpoint(sgl_runtime.url)
    endpoint.chat_template = ChatTemplate.from_renderer(render)  # what a Mistral server's endpoint derives

    @sgl.function
    def chat(s, system):
        if system:
            s += sgl.system("Be brief.")
        s += sgl.user("Hi") + sgl.assistant("Hello.") + sgl.user("Name a fruit.")
        s += sgl.assistant(sgl.gen("fruit", max_tokens=2, temperature=0))

    state = chat.run(system=False, backend=endpoint)
    assert state.text() == render(state.messages(), False)
    with pytest.raises(ValueError, match="cannot render a system message"):
        chat.run(system=True, backend=endpoint)


def test_popen_launch_server_does_not_take_a_server_left_on_its_port(sgl_runtime):
    """SGLang's test helper (treadle.test.test_utils.popen_launch_server) returned its process as
    soon as /health_generate answered at the URL, so with a server left running on that port (a
    fixed DEFAULT_URL_FOR_TEST, an earlier run's) the tests ran on that one while the new server
    failed to bind. Here the new process fails at once (an unknown flag) while the shared
    Runtime's server answers the URL: a RuntimeError naming the other server, not a return."""
    from treadle.test.test_utils import popen_launch_server

    with pytest.raises(RuntimeError, match=r"exited with status 2 .*served by another process, pid \d+"):
        popen_launch_server("HuggingFaceTB/SmolLM2-135M-Instruct", sgl_runtime.url, timeout=60,
                            other_args=["--no-such-flag"], return_stdout_stderr=(subprocess.DEVNULL,) * 2)


def test_run_batch_progress_bar_stays_at_the_end_as_sglangs(sgl_runtime, capsys):
    """`run_batch(progress_bar=True)`: SGLang's tqdm bar stays on screen when the batch ends,
    showing n/n; treadle's cleared itself (leave=False), so a ported script's output ended with
    no bar, or with one stuck short of the total where its last draw was."""
    @sgl.function
    def one(s, i):
        s += f"{i}." + sgl.gen("x", max_tokens=1, temperature=0)

    states = one.run_batch([{"i": i} for i in range(3)], backend=sgl_runtime.endpoint, progress_bar=True)
    assert all(st.error() is None for st in states)
    last_draw = capsys.readouterr().err.rstrip("\n").split("\r")[-1]
    assert "3/3" in last_draw, repr(last_draw)


def test_fork_group_has_sglangs_states_and_src_state(sgl_runtime):
    """SGLang's ProgramStateGroup (what `s.fork(n)` returns) keeps its branches as `.states` and
    the forking state as `.src_state`; a program reading them (`for f in forks.states`) got an
    AttributeError here."""
    @sgl.function
    def branches(s):
        s += "Colors:"
        forks = s.fork(2)
        assert forks.src_state is s and [f is g for f, g in zip(forks.states, forks)] == [True, True]
        for i, f in enumerate(forks.states):
            f += f" {i}" + sgl.gen("c", max_tokens=1, temperature=0)
        forks.join()

    state = branches.run(backend=sgl_runtime.endpoint)
    assert len(state["c"]) == 2


def test_runtime_endpoint_without_a_scheme_says_so():
    """`sgl.RuntimeEndpoint("localhost:30000")` (or set_default_backend of it) failed with requests'
    'No connection adapters were found for 'localhost:30000/get_model_info'', which names
    neither the argument nor the fix."""
    with pytest.raises(ValueError, match=r"RuntimeEndpoint\('localhost:30000'\).*did you mean 'http://localhost:30000'"):
        sgl.RuntimeEndpoint("localhost:30000")
    with pytest.raises(ValueError, match=r"http://host:port"):
        sgl.set_default_backend("ftp://127.0.0.1:30000")


# Qwen3's chat template, its message and generation-prompt parts (tools left out): a finished last
# reply renders after a thinking block (an empty one when it has none); the generation prompt is
# "<|im_start|>assistant\n" (thinking on), with the empty block only for enable_thinking=False
QWEN3_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' %}{%- set ns.multi_step_tool = false %}"
    "{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}{%- set content = message.content %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}{%- set reasoning_content = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}"
    "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n'"
    " + content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}")


def test_an_assistant_gen_sees_the_templates_generation_prompt(sgl_runtime):
    """A served Qwen3: roles took the assistant prefix from a rendered last reply, which Qwen3's
    template writes after an (empty) thinking block, so every `sgl.assistant(sgl.gen(...))` began
    after '<think>\\n\\n</think>\\n\\n': the model could not think, and SGLang's separate_reasoning
    example got no reasoning. A gen in an assistant message now follows the template's generation
    prompt, as a chat request to the server sends it."""
    from treadle.lang.chat_template import ChatTemplate, jinja_renderer

    render = jinja_renderer(QWEN3_TEMPLATE, "", "<|im_end|>")
    endpoint = sgl.RuntimeEndpoint(sgl_runtime.url)
    endpoint.chat_template = ChatTemplate.from_renderer(render)  # what a Qwen3 server's endpoint derives

    @sgl.function
    def qa(s):
        s += sgl.system("Be brief.") + sgl.user("Hi")
        s += sgl.assistant(sgl.gen("answer", max_tokens=2, temperature=0))

    state = qa.run(backend=endpoint)
    chat_prompt = render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], True)
    assert state.text() == chat_prompt + state["answer"] + "<|im_end|>\n"
