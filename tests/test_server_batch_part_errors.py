"""A native /generate batch whose parts fail mid-run one by one: each part's outcome is its
own. The real server runs with test-only fault injection (runtime/fault_injection.py): a
prompt holding MARKER makes every batch step that computes its tokens fail (``MARKER@1``: once
it has a token), so that part ends with its `error` (docs/serving.md, "/generate"), a 400 of
its own, while a part that finished before keeps its result, streamed or not. Before, the
whole batch was a 500 and the good results were dropped."""
from __future__ import annotations

import json

import pytest
import requests

from treadle.runtime.server.testing import ServerProcess, wait_idle

T = 120
MARKER = "zq-poison-marker"
# part 0 ends with the token its prefill samples; part 1 needs decode steps after that
PARAMS = [{"max_new_tokens": 1, "temperature": 0}, {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}]
TEXTS = ["The capital of France is", f"Count to ten ({MARKER}@1): one, two,"]
GOOD_TEXTS = [TEXTS[0], "Count to ten: one, two,"]


@pytest.fixture(scope="module")
def srv():
    with ServerProcess(["--max-total-tokens", "8192", "--log-level", "warning"],
                       env={"TREADLE_FAULT_POISON_MARKER": MARKER}) as s:
        yield s


def assert_failed_part(res: dict) -> None:
    err = res["error"]
    assert err["type"] == "invalid_request_error" and "made its batch step fail" in err["message"], err
    assert "injected fault" in err["message"], err
    assert res["meta_info"]["finish_reason"]["type"] == "abort", res


def test_a_batch_part_failing_mid_run_keeps_the_other_parts_results(srv):
    r = requests.post(srv.url + "/generate", json={"text": TEXTS, "sampling_params": PARAMS}, timeout=T)
    assert r.status_code == 200, r.text
    good, bad = r.json()
    assert "error" not in good and "error" not in good["meta_info"], good
    assert good["meta_info"]["finish_reason"] == {"type": "length", "length": 1}, good
    assert good["meta_info"]["completion_tokens"] == 1 and len(good["output_ids"]) == 1 and good["text"], good
    assert_failed_part(bad)

    # streamed: part 0's events run to their end, part 1's last event is its error, then [DONE]
    events = []
    with requests.post(srv.url + "/generate", json={"text": TEXTS, "sampling_params": PARAMS, "stream": True},
                       stream=True, timeout=T) as s:
        assert s.status_code == 200, s.text
        for line in s.iter_lines(decode_unicode=True):
            if line.startswith("data: "):
                events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    assert events[-1] == "[DONE]", events
    by_part = {i: [e for e in events[:-1] if e.get("index") == i] for i in (0, 1)}
    assert len(by_part[0]) + len(by_part[1]) == len(events) - 1, events  # every event names its part
    assert by_part[0][-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 1}, by_part[0]
    assert not any("error" in e for e in by_part[0]), by_part[0]
    assert_failed_part(by_part[1][-1])

    # the server serves on, every KV slot back
    ok = requests.post(srv.url + "/generate", json={"text": GOOD_TEXTS, "sampling_params": PARAMS}, timeout=T)
    assert ok.status_code == 200 and [x["meta_info"]["completion_tokens"] for x in ok.json()] == [1, 8], ok.text
    assert not any("error" in x for x in ok.json()), ok.text
    info = wait_idle(srv.url)
    assert info["free_slots"] + info["evictable_slots"] == info["total_slots"] and info["protected_slots"] == 0, info


def test_a_select_over_http_raises_when_its_scoring_batch_fails(srv):
    # select scores its choices in one /generate batch; its parts fail (a 400 each: its choices hold
    # the marker), so every part comes back with its error and no scores. Before, each choice
    # summed to 0 and the first won.
    from treadle.lang import RuntimeEndpoint, function, select

    @function
    def pick(s):
        s += "The sky is " + select("colour", choices=[f"blue {MARKER}", f"green {MARKER}"])

    with pytest.raises(ValueError, match="failed part 0 of a scoring batch: .*injected fault"):
        pick.run(backend=RuntimeEndpoint(srv.url))["colour"]
    wait_idle(srv.url)
