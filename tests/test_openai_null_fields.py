"""Fields sent as JSON null through the real `openai` client, against a real server
subprocess running the embedded SmolLM2: an optional field that is null means what leaving
it out means, as vLLM's and SGLang's servers (their request models type these fields
Optional) take it. Frameworks that write every field of a request model send such nulls."""
from __future__ import annotations

import openai
import pytest

from treadle.runtime.server.testing import ServerProcess

pytestmark = pytest.mark.slow
T = 300  # a hang guard, not a speed check

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(["--max-total-tokens", "4096", "--log-level", "warning"])
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=T, max_retries=0)


def test_null_parallel_tool_calls_is_the_default(client):
    """parallel_tool_calls: null (vLLM and SGLang: Optional[bool]) was a 400 "must be a
    boolean"; it is the default, true: the same calls as leaving it out."""
    kw = dict(model="default", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=60, temperature=0)
    left_out = client.chat.completions.create(**kw)
    null = client.chat.completions.create(**kw, parallel_tool_calls=None)
    calls = [(c.function.name, c.function.arguments) for c in null.choices[0].message.tool_calls]
    assert calls == [(c.function.name, c.function.arguments) for c in left_out.choices[0].message.tool_calls]
    assert null.choices[0].finish_reason == "tool_calls" and calls[0][0] == "get_weather"
    # without tools, as with any other unset option
    plain = client.chat.completions.create(model="default", messages=ASK, max_tokens=3, temperature=0,
                                           parallel_tool_calls=None)
    assert plain.choices[0].message.content and plain.usage.completion_tokens == 3
