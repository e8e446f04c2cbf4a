"""vLLM's chat `echo` and chat `best_of`, through the real `openai` client (extra_body),
against a real server subprocess running the embedded SmolLM2.

vLLM's /v1/chat/completions takes `echo`: the reply starts with the last message's content
when that message has the reply's role (the assistant's, or any with
add_generation_prompt false), the way a client continuing a prefilled assistant message gets
the whole message back. treadle accepted the field and ignored it (the reply lacked the
prefill). `best_of` other than `n` is a 400 on chat as on completions (it was ignored)."""
from __future__ import annotations

import openai
import pytest

from treadle.runtime.server.testing import ServerProcess

pytestmark = pytest.mark.slow
T = 300  # a hang guard, not a speed check

PREFILL = "The three primary colours are"
CONTINUE = [{"role": "user", "content": "Name the primary colours."}, {"role": "assistant", "content": PREFILL}]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(["--max-total-tokens", "4096", "--log-level", "warning"])
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=T, max_retries=0)


def _streamed(client, **kw) -> tuple[str, str | None]:
    text, finish = "", None
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    return text, finish


@pytest.mark.parametrize("n", [1, 2])
def test_echo_returns_the_continued_message_whole(client, n):
    cont = dict(model="default", messages=CONTINUE, max_tokens=6, temperature=0, n=n,
                extra_body={"add_generation_prompt": False, "continue_final_message": True})
    plain = client.chat.completions.create(**cont)
    tail = plain.choices[0].message.content
    assert tail and not tail.startswith(PREFILL)
    echoed = client.chat.completions.create(**{**cont, "extra_body": {**cont["extra_body"], "echo": True}})
    assert [c.message.content for c in echoed.choices] == [PREFILL + tail] * n
    assert [c.index for c in echoed.choices] == list(range(n))
    assert echoed.usage.completion_tokens == plain.usage.completion_tokens  # the echo is prompt, not output
    text, finish = _streamed(client, **{**cont, "n": 1, "extra_body": {**cont["extra_body"], "echo": True}})
    assert text == PREFILL + tail and finish == "length"


def test_echo_with_a_generation_prompt_needs_an_assistant_message_last(client):
    """add_generation_prompt true: the reply's role is the assistant's, so only a last
    assistant message is echoed (vLLM's rule); a last user message is not."""
    ask = dict(model="default", messages=CONTINUE[:1], max_tokens=4, temperature=0)
    assert (client.chat.completions.create(**ask, extra_body={"echo": True}).choices[0].message.content
            == client.chat.completions.create(**ask).choices[0].message.content)
    after = dict(model="default", messages=CONTINUE, max_tokens=4, temperature=0)
    new = client.chat.completions.create(**after).choices[0].message.content
    assert client.chat.completions.create(**after, extra_body={"echo": True}).choices[0].message.content == PREFILL + new
    text, _ = _streamed(client, **after, extra_body={"echo": True})
    assert text == PREFILL + new


def test_chat_best_of_other_than_n_is_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="default", messages=CONTINUE[:1], max_tokens=2, extra_body={"best_of": 3})
    assert e.value.status_code == 400 and e.value.body["param"] == "best_of"
    ok = client.chat.completions.create(model="default", messages=CONTINUE[:1], max_tokens=2, n=2,
                                        extra_body={"best_of": 2})
    assert len(ok.choices) == 2
