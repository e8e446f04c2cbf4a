"""Grammar limits over HTTP (#31 item 5, #32 item 9): a grammar too large to compile is a 400
naming the cap, answered before any compile work; the grammar cache is bounded in bytes and
/get_server_info says what it holds."""

from __future__ import annotations

import pytest
import requests

from treadle.runtime.server.testing import ServerProcess

CACHE_BYTES = 64 << 20


@pytest.fixture(scope="module")
def url():
    srv = ServerProcess(["--max-total-tokens", "4096", "--log-level", "warning",
                         "--grammar-cache-bytes", str(CACHE_BYTES)])
    yield srv.url
    srv.close()


def _generate(url: str, extra: dict) -> requests.Response:
    return requests.post(url + "/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 4, **extra}},
                         timeout=120)


def test_too_large_grammars_are_a_400_naming_the_cap(url):
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(10_000)}}
    regex = "(" + "|".join(f"zz{i}[a-z]{{0,5}}" for i in range(5000)) + ")"
    for extra in ({"json_schema": schema}, {"regex": regex}):
        r = _generate(url, extra)  # before the cap: a worker ran a minute, or to 3.9 GB and its death
        assert r.status_code == 400, r.text
        assert "max_grammar_size" in r.text and "too large to compile" in r.text, r.text
    ok = _generate(url, {"regex": "(yes|no)"})  # the server and its workers serve on
    assert ok.status_code == 200 and ok.json()["text"] in ("yes", "no")


def test_server_info_says_what_the_grammar_cache_holds(url):
    assert _generate(url, {"regex": "[0-9]{1,3}"}).status_code == 200
    cache = requests.get(url + "/get_server_info", timeout=30).json()["grammar_cache"]
    assert cache["cap_bytes"] == CACHE_BYTES
    assert cache["entries"] >= 1 and cache["compiled"] >= 1 and 0 < cache["bytes"] <= CACHE_BYTES, cache
