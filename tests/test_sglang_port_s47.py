"""Session 47's porting checks: SGLang programs run with `import treadle as sgl` and nothing else
changed, over conftest's shared Runtime (a real server subprocess of the embedded model). Where a
program depends on a served model's chat template (DeepSeek-R1's, Llama-2's, Mistral v0.3's), the
endpoint renders roles with that template (as its tokenizer_config.json has it), as a server of
that model would give it."""
from __future__ import annotations

import pytest

import treadle as sgl
from treadle.lang.chat_template import ChatTemplate, jinja_renderer

# DeepSeek-R1's chat template (its tools part left out): the generation prompt opens the thinking
# block, and a reply in the history is rendered without its reasoning
DEEPSEEK_R1_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(system_prompt='') %}{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{ bos_token }}{{ ns.system_prompt }}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}"
    "{%- endif %}{%- if message['role'] == 'assistant' %}{% set content = message['content'] %}"
    "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}{%- endif %}{%- endfor -%}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}")


def _endpoint(runtime, template: str, bos: str = "", eos: str = ""):
    render = jinja_renderer(template, bos, eos)
    endpoint = sgl.RuntimeEndpoint(runtime.url)
    endpoint.chat_template = ChatTemplate.from_renderer(render)  # what the model's server endpoint derives
    return endpoint, render


def test_separate_reasoning_takes_the_think_tag_of_deepseek_r1s_generation_prompt(sgl_runtime):
    """SGLang's separate_reasoning example on DeepSeek-R1: the template's generation prompt ends
    with "<think>\\n", so the model's reply starts inside the block. The answer and reasoning were
    split, but the text kept "<｜Assistant｜><think>\\n" before the answer (SGLang's text, and the
    template's own rendering of the reply, have "<｜Assistant｜>answer"), and the next turn's prompt
    with it."""
    endpoint, render = _endpoint(sgl_runtime, DEEPSEEK_R1_TEMPLATE)
    layout = r"A plan\.\n</think>\n\nParis\."  # R1's layout of a reply after its prompt's "<think>\n"

    @sgl.function
    def basic_qa_separate_reasoning(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.separate_reasoning(sgl.gen("answer", max_tokens=32, regex=layout),
                                                  model_type="deepseek-r1"))
        s += sgl.user("And of Spain?")

    state = basic_qa_separate_reasoning.run("What is the capital of France?", temperature=0, backend=endpoint)
    answer = state["answer"]
    assert (answer, state["answer_reasoning_content"]) == ("Paris.", "A plan.\n"), (answer, state["answer_reasoning_content"])
    assert state.messages()[1] == {"role": "assistant", "content": answer}
    assert state.text() == render(state.messages(), False)
    assert "think>" not in state.text()


# Llama-2-chat's and Mistral-7B-Instruct-v0.3's chat templates (as their tokenizer_config.json has
# them; Mistral's tools part left out): neither renders a system message alone, both put it inside
# a user message
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
MISTRAL_V03_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('After the optional system message, conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{%- endif %}{%- endfor %}{{- bos_token }}"
    "{%- for message in loop_messages %}{%- if message['role'] == 'user' %}"
    "{%- if loop.last and system_message is defined %}"
    "{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content']|trim + eos_token }}"
    "{%- else %}{{- raise_exception('Only user and assistant roles are supported!') }}{%- endif %}{%- endfor %}")


@pytest.mark.parametrize("template", [LLAMA2_TEMPLATE, MISTRAL_V03_TEMPLATE], ids=["llama-2", "mistral-v0.3"])
def test_a_system_message_goes_inside_the_first_user_message_as_the_template_puts_it(sgl_runtime, template):
    """SGLang's multi-turn chat example opens with `sgl.system(...)`; on a served Llama-2-chat or
    Mistral v0.3 model it was a ValueError ('cannot render a system message on its own'), where
    SGLang's named templates (llama-2-chat's LLAMA2 style) put it inside the first user message, as
    these templates do. Now the text is the template's own rendering of the conversation."""
    endpoint, render = _endpoint(sgl_runtime, template, "<s>", "</s>")

    @sgl.function
    def multi_turn_question(s, question_1):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user(question_1)
        s += sgl.assistant(sgl.gen("answer_1", max_tokens=4, regex="Paris"))  # no space the template would strip

    state = multi_turn_question.run(question_1="What is the capital of France?", temperature=0, backend=endpoint)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    asked = render(messages[:2], False)  # what a chat request of the system and user messages sends
    assert "You are a helpful assistant." in asked and state.text().startswith(asked)
    if template is LLAMA2_TEMPLATE:  # Mistral v0.3's renders the system message with the last user message only
        assert state.text() == render(messages, False)


def test_print_graph_has_the_nodes_of_the_programs_the_body_calls():
    """SGLang's compiled graph takes in the states of the programs a traced body calls
    (`sub(x=...)` is traced, its tracer state a child of the caller's); treadle traced the call
    but print_graph() and the trace's nodes left its expressions out."""
    @sgl.function
    def expand(s, topic):
        s += "Expand on " + topic + ":" + sgl.gen("detail", max_tokens=16)

    @sgl.function
    def outline(s, topic):
        s += "Outline of " + topic + ":" + sgl.gen("points", max_tokens=8)
        expand(topic="the first point")
        s += "Done." + sgl.gen("end", max_tokens=2)

    compiled = outline.compile()
    graph = compiled.print_graph()
    assert compiled.trace.last_node.print_graph_dfs().splitlines() == [
        "%0 = Constant('Outline of {topic}:')", "%1 = Gen('points', max_tokens=8)", "%2 = Constant('Done.')",
        "%3 = Gen('end', max_tokens=2)"]
    assert graph.splitlines() == ["%0 = Constant('Outline of {topic}:')", "%1 = Gen('points', max_tokens=8)",
                                  "%2 = Constant('Expand on the first point:')", "%3 = Gen('detail', max_tokens=16)",
                                  "%4 = Constant('Done.')", "%5 = Gen('end', max_tokens=2)"], graph


def test_sglangs_openai_backend_test_imports_its_programs_and_the_image_one_says_why_it_cannot_run(sgl_runtime):
    """SGLang's test/lang/test_openai_backend.py imports test_image_qa, test_completion_speculative
    and test_chat_completion_speculative with the rest of sglang.test.test_programs; the import
    was an ImportError, so the ported file did not load. test_image_qa raises sgl.image's
    ValueError (text-only models) before sending anything."""
    from treadle.test.test_programs import (test_chat_completion_speculative, test_completion_speculative,  # noqa: F401
                                            test_decode_int, test_image_qa, test_mt_bench)

    before = sgl.global_config.default_backend
    sgl.set_default_backend(sgl_runtime)  # nothing is sent: the image is refused first
    try:
        with pytest.raises(ValueError, match="text-only models"):
            test_image_qa()
    finally:
        sgl.set_default_backend(before)


def test_build_regex_from_object_allows_a_space_between_json_tokens_as_sglangs():
    """SGLang's build_regex_from_object passes whitespace_pattern=None to outlines, which puts an
    optional space (`[ ]?`) between JSON tokens, so `{"name": "Merlin", "age": 30}` matches (and a
    model constrained by it may write it so); treadle's None allowed no whitespace at all."""
    import json
    import re

    from pydantic import BaseModel

    from treadle.srt.constrained.outlines_backend import build_regex_from_object

    class Wizard(BaseModel):
        name: str
        age: int

    for source in (Wizard, Wizard.model_json_schema(), json.dumps(Wizard.model_json_schema())):
        regex = build_regex_from_object(source)
        assert re.fullmatch(regex, '{"name": "Merlin", "age": 30}') and re.fullmatch(regex, '{"name":"Merlin","age":30}')
        assert not re.fullmatch(regex, '{"name":  "Merlin","age":30}')  # one space at most, as outlines'
    assert not re.fullmatch(build_regex_from_object(Wizard, whitespace_pattern=""), '{"name": "Merlin", "age": 30}')
