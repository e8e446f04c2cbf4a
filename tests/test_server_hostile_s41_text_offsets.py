"""Completions logprobs' text_offset where a token's bytes leave a character unfinished, against
a real server (session 41): prompt ids that end mid-character (the first byte token of an emoji)
echo that piece as U+FFFD, and the next token's offset pointed at the U+FFFD (0) instead of
where its own text begins (1); lm-eval style clients cut the continuation by these offsets."""
from __future__ import annotations

import pytest
import requests

from treadle.runtime.server.testing import sse_events, wait_idle

T = 120


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: this test leaves it idle
    return plain_server


def tokens(srv, text: str) -> list[int]:
    return requests.post(srv.url + "/tokenize", json={"prompt": text}, timeout=T).json()["tokens"]


def check_offsets(text: str, lp: dict) -> None:
    offs, toks = lp["text_offset"], lp["tokens"]
    assert offs == sorted(offs) and all(0 <= o <= len(text) for o in offs), (text, offs)
    for o, tok in zip(offs, toks):  # a token of whole characters reads at its offset
        if not tok.startswith("bytes:"):
            assert text[o:o + len(tok)] == tok, (text, toks, offs)


def test_a_token_after_an_unfinished_character_has_the_offset_of_its_own_text(srv):
    emoji, hi = tokens(srv, "\U0001F600"), tokens(srv, "Hi")
    assert len(emoji) > 1 and len(hi) == 1  # the emoji is several byte tokens
    for prompt, starts, want in ((emoji[:1] + hi, "\ufffdHi", [0, 1]), (emoji + hi, "\U0001F600Hi", [0] * len(emoji) + [1])):
        body = {"model": "default", "prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 4, "temperature": 0}
        r = requests.post(srv.url + "/v1/completions", json=body, timeout=T)
        assert r.status_code == 200, r.text[:300]
        choice = r.json()["choices"][0]
        assert choice["text"].startswith(starts), choice["text"]
        assert choice["logprobs"]["text_offset"][:len(prompt)] == want, choice["logprobs"]  # was [0, 0]
        check_offsets(choice["text"], choice["logprobs"])
        events = [e for e in sse_events(requests.post(srv.url + "/v1/completions", json={**body, "stream": True},
                                                      timeout=T, stream=True)) if isinstance(e, dict)]
        streamed = [o for e in events for c in e["choices"] if c["logprobs"] for o in c["logprobs"]["text_offset"]]
        assert streamed == choice["logprobs"]["text_offset"], (streamed, choice["logprobs"])
    wait_idle(srv.url)
