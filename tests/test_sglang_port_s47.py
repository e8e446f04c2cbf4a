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
