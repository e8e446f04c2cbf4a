"""SGLang's own tests, as its test/lang and test/srt files write them (unittest classes on
sglang.test.test_utils' harness), with only `sglang` changed to `treadle`: the model, URL and base
class of a test, `popen_launch_server` and `kill_process_tree` were missing (ImportError before
any test ran) (session 41)."""
from __future__ import annotations

import subprocess

import pytest
import requests

import treadle as sgl
from treadle.test.test_utils import (DEFAULT_MODEL_NAME_FOR_TEST, DEFAULT_SMALL_MODEL_NAME_FOR_TEST,
                                     DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH, DEFAULT_URL_FOR_TEST, CustomTestCase,
                                     popen_launch_server)
from treadle.srt.utils import kill_process_tree


# SGLang's test/lang/test_bind_cache.py
class TestBind(CustomTestCase):
    backend = None

    @classmethod
    def setUpClass(cls):
        cls.backend = sgl.Runtime(model_path=DEFAULT_MODEL_NAME_FOR_TEST)
        sgl.set_default_backend(cls.backend)

    @classmethod
    def tearDownClass(cls):
        sgl.set_default_backend(None)
        cls.backend.shutdown()

    def test_bind(self):
        @sgl.function
        def few_shot_qa(s, prompt, question):
            s += prompt
            s += "Q: What is the capital of France?\n"
            s += "A: Paris\n"
            s += "Q: " + question + "\n"
            s += "A:" + sgl.gen("answer", stop="\n", max_tokens=16)

        few_shot_qa_2 = few_shot_qa.bind(prompt="The following are questions with answers.\n\n")

        tracer = few_shot_qa_2.trace()
        print(tracer.last_node.print_graph_dfs() + "\n")
        state = few_shot_qa_2.run(question="What is the capital of Italy?", temperature=0)
        self.assertTrue(state.text().startswith("The following are questions with answers.\n\nQ: What"))

    def test_cache(self):
        @sgl.function
        def few_shot_qa(s, prompt, question):
            s += prompt
            s += "Q: What is the capital of France?\n"
            s += "A: Paris\n"
            s += "Q: " + question + "\n"
            s += "A:" + sgl.gen("answer", stop="\n", max_tokens=16)

        few_shot_qa_2 = few_shot_qa.bind(prompt="Answer the following questions as if you were a 5-year-old kid.\n\n")
        prefix = few_shot_qa_2.cache(self.backend)
        self.assertTrue(prefix.startswith("Answer the following questions") and prefix.endswith("Q: "))


# SGLang's test/srt pattern: a server per class, started and stopped with the harness
class TestServerLaunch(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = DEFAULT_SMALL_MODEL_NAME_FOR_TEST
        cls.base_url = DEFAULT_URL_FOR_TEST
        cls.process = popen_launch_server(
            cls.model,
            cls.base_url,
            timeout=DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH,
            api_key="sk-test",
            other_args=["--log-level", "warning", "--max-total-tokens", "1024"],
        )

    @classmethod
    def tearDownClass(cls):
        from treadle.lang.testing import _alive, _descendants

        # the server runs its scheduler and detokenizer as child processes: all of them stop (the
        # server first by SIGTERM, so it cleans up), none left running
        workers = _descendants(cls.process.pid)
        assert workers, "the server has no worker processes to stop"
        kill_process_tree(cls.process.pid)
        cls.process.wait(timeout=30)
        assert not any(_alive(pid) for pid in workers)

    def test_generate(self):
        response = requests.post(
            self.base_url + "/generate",
            json={"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8}},
            headers={"Authorization": "Bearer sk-test"},
        )
        self.assertEqual(response.status_code, 200, response.text)
        self.assertIsInstance(response.json()["text"], str)

    def test_api_key(self):
        response = requests.post(self.base_url + "/generate", json={"text": "Hi"})
        self.assertEqual(response.status_code, 401)

    def test_server_info_has_sglangs_scheduler_keys(self):
        """SGLang's get_server_info has its scheduler's max_total_num_tokens (the KV pool, in
        tokens) and max_req_input_len at the top level; treadle's had neither (KeyError)."""
        info = sgl.get_server_info(sgl.RuntimeEndpoint(self.base_url, api_key="sk-test"))
        self.assertEqual(info["max_total_num_tokens"], 1024)  # --max-total-tokens
        self.assertEqual(info["max_req_input_len"], min(info["context_length"], 1024) - 1)
        # the longest prompt it names is taken, one token more is refused
        tokens = [1] * info["max_req_input_len"]
        ok = requests.post(self.base_url + "/generate", headers={"Authorization": "Bearer sk-test"},
                           json={"input_ids": tokens, "sampling_params": {"max_new_tokens": 1}})
        self.assertEqual(ok.status_code, 200, ok.text)
        too_long = requests.post(self.base_url + "/generate", headers={"Authorization": "Bearer sk-test"},
                                 json={"input_ids": tokens + [1], "sampling_params": {"max_new_tokens": 1}})
        self.assertEqual(too_long.status_code, 400, too_long.text)

    def test_program_over_runtime_endpoint(self):
        @sgl.function
        def qa(s, question):
            s += sgl.user(question)
            s += sgl.assistant(sgl.gen("answer", max_tokens=8))

        state = qa.run(question="Name a color.", backend=sgl.RuntimeEndpoint(self.base_url, api_key="sk-test"),
                       temperature=0)
        self.assertEqual(state.messages()[-1]["role"], "assistant")


def test_a_server_that_cannot_start_is_an_error_at_once():
    from treadle.runtime.server.testing import free_port

    # the exit is seen while waiting: a RuntimeError naming it, not a TimeoutError after 300 s
    with pytest.raises(RuntimeError, match="exited with status"):
        popen_launch_server(DEFAULT_MODEL_NAME_FOR_TEST, f"http://127.0.0.1:{free_port()}", timeout=300,
                            other_args=["--no-such-flag"], return_stdout_stderr=(subprocess.DEVNULL, subprocess.DEVNULL))
    with pytest.raises(ValueError, match="base_url"):
        popen_launch_server(DEFAULT_MODEL_NAME_FOR_TEST, "localhost", timeout=5)
