"""Session 45's porting checks: SGLang programs run with `import treadle.lang as sgl` (the import
line the brief and treadle.lang's docstring give) and nothing else changed. Over conftest's
shared Runtime (a real server subprocess of the embedded model) where a model is needed."""
from __future__ import annotations

import subprocess
import sys

import pytest

import treadle.lang as sgl
from treadle.lang.chat_template import (ChatTemplate, ChatTemplateStyle, chat_template_registry, get_chat_template,
                                        get_chat_template_by_model_path, matching_function_registry,
                                        register_chat_template, register_chat_template_matching_function)


def test_treadle_lang_as_sgl_has_sglangs_top_level_names():
    """`sgl.__version__`, `sgl.ServerArgs` and `sgl.lang.ir.REGEX_INT` (import sglang as sgl has
    them) were AttributeErrors on treadle.lang; `import treadle as sgl` had them. In a fresh
    interpreter, so no earlier import of treadle.lang.ir hides the lookup."""
    probe = ("import treadle.lang as sgl, treadle\n"
             "assert sgl.__version__ == treadle.__version__ and isinstance(sgl.__version__, str)\n"
             "assert sgl.ServerArgs is treadle.ServerArgs\n"
             "assert sgl.lang is sgl and sgl.lang.ir.REGEX_INT == '[-+]?[0-9]+[ \\\\n]*'\n"
             "assert {'ServerArgs', '__version__', 'Engine', 'OpenAI'} <= set(dir(sgl))\n"
             "assert set(treadle.__all__) <= set(dir(sgl)), set(treadle.__all__) - set(dir(sgl))\n"
             "print('ok')")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.fixture
def registry_restored():
    """The chat-template registry as it was, after a test that registers its own."""
    templates, matchers = dict(chat_template_registry), list(matching_function_registry)
    yield
    chat_template_registry.clear()
    chat_template_registry.update(templates)
    matching_function_registry[:] = matchers


def _my_template(name: str) -> ChatTemplate:
    return ChatTemplate(name=name, default_system_prompt=None,
                        role_prefix_and_suffix={"system": ("<|im_start|>system\n", "<|im_end|>\n"),
                                                "user": ("<|im_start|>user\n", "<|im_end|>\n"),
                                                "assistant": ("<|im_start|>assistant\n", "<|im_end|>\n")},
                        stop_str=("\n",), style=ChatTemplateStyle.PLAIN)


def test_a_matching_function_may_return_the_template_as_older_sglangs_do(registry_restored):
    """Older SGLang's matching functions return `get_chat_template(name)`; treadle looked the
    returned template up as a name (TypeError: unhashable type: 'ChatTemplate')."""
    register_chat_template(_my_template("my-template"))

    @register_chat_template_matching_function
    def match_mine(model_path: str):
        if "my-model" in model_path.lower():
            return get_chat_template("my-template")

    assert get_chat_template_by_model_path("/models/My-Model-7B").name == "my-template"
    assert get_chat_template_by_model_path("HuggingFaceTB/SmolLM2-135M-Instruct").name == "default"


@sgl.function
def qa(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=16))


def test_a_registered_matching_function_picks_the_endpoints_template(sgl_runtime, registry_restored):
    """A program that registers a template and a matching function for its model: SGLang's
    RuntimeEndpoint renders roles with it (and adds its stop strings to every gen); treadle
    ignored it and rendered the model's own template. A model no function of the program's
    matches keeps the model's own template (SGLang's own functions stand for it)."""
    assert sgl.RuntimeEndpoint(sgl_runtime.url).chat_template.implicit_prefix.startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM")  # the model's own
    register_chat_template(_my_template("my-template"))

    @register_chat_template_matching_function
    def match_mine(model_path: str):
        return "my-template" if "smollm2" in model_path.lower() else None

    endpoint = sgl.RuntimeEndpoint(sgl_runtime.url)
    state = qa.run(question="Write three lines of a poem.", backend=endpoint, temperature=0)
    assert state.text().startswith("<|im_start|>user\nWrite three lines of a poem.<|im_end|>\n"
                                   "<|im_start|>assistant\n")  # no default system prompt: the template's
    # its stop string "\n" ended the answer (the same gen without it writes a second line)
    assert state.get_meta_info("answer")["finish_reason"] == {"type": "stop", "matched": "\n"}


def test_select_takes_a_numpy_array_of_choices(sgl_runtime):
    """`sgl.select(name, np.array([...]))` (choices read from a data frame or array) runs in
    SGLang; treadle raised numpy's 'The truth value of an array ... is ambiguous' ValueError,
    which names neither the select nor its choices."""
    import numpy as np

    @sgl.function
    def pick(s, choices):
        s += "The sky is " + sgl.select("color", np.array(choices)) + ". "
        s += "Grass is " + sgl.gen("grass", choices=np.array(choices))

    state = pick.run(choices=["blue", "green"], backend=sgl_runtime.endpoint)
    assert type(state["color"]) is str and state["color"] in ("blue", "green")
    assert type(state["grass"]) is str and state["grass"] in ("blue", "green")


def _within(fn, timeout_s: float = 60):
    """fn()'s result, or a failure naming the hang (a blocked call must not hang pytest)."""
    import threading

    box: list = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), f"still blocked after {timeout_s} s"
    return box[0]


def test_text_iter_in_the_programs_own_body_gives_the_text_so_far(sgl_runtime):
    """Not streamed, SGLang's `s.text_iter()` yields `s.text()`, so a body may read its own text
    (or a fork branch's, before the join) that way; treadle's waited for the program (or the
    branch) to end, which it never did: the run hung."""
    @sgl.function
    def prog(s):
        s += "Fruits:" + sgl.gen("x", max_tokens=2, temperature=0)
        s["so_far"] = "".join(s.text_iter())
        forks = s.fork(2)
        forks += " and" + sgl.gen("y", max_tokens=2, temperature=0)
        s["branches"] = ["".join(f.text_iter()) for f in forks]
        forks.join()

    state = _within(lambda: prog.run(backend=sgl_runtime.endpoint))
    assert state["so_far"] == "Fruits:" + state["x"]
    assert state["branches"] == ["Fruits:" + state["x"] + " and" + y for y in state["y"]]  # each branch's text()
    assert "".join(state.text_iter()) == state.text()  # after the run: the whole text


def test_runtime_takes_the_first_free_port_from_the_one_given():
    """SGLang's Runtime scans from its port (30000 by default) for a free one, so a program that
    passes port=30000 while a server launched earlier holds it still starts; treadle's started its
    server on the taken port, which then failed. Seen through the URL in the launch timeout's
    message (the server is stopped then, so no model is loaded here)."""
    import re
    import socket

    from treadle.lang.runtime_process import _free_port_from

    taken = _free_port_from(31000, "127.0.0.1")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        with pytest.raises(TimeoutError, match="did not become healthy") as err:
            sgl.Runtime(port=taken, launch_timeout=0.01)
    port = int(re.search(r"http://127\.0\.0\.1:(\d+)", str(err.value)).group(1))
    assert port > taken


def test_a_role_of_none_is_an_empty_message_as_sglangs_default():
    """SGLang's `system(expr=None)` (and user, assistant): None, the default, is an empty message,
    so a program passing an optional system prompt (`sgl.system(system_prompt)`, None when not
    given) runs; treadle's default was "" and None a TypeError. Traced with SGLang's chatml."""
    from treadle.lang.backend.base_backend import BaseBackend

    @sgl.function
    def chat(s, question, system_prompt=None):
        s += sgl.system(system_prompt)
        s += sgl.user(question)
        s += sgl.assistant(None)

    backend = BaseBackend()
    backend.chat_template = get_chat_template("chatml")
    assert chat.trace(question="Hi", backend=backend).text() == (
        "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n")
