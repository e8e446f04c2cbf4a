"""treadle.lang: the structured-generation DSL.

    from treadle.lang import function, gen, select, user, assistant, set_default_backend

    @function
    def qa(s, question):
        s += user(question)
        s += assistant(gen("answer", max_tokens=32))

    set_default_backend(engine_or_url)
    print(qa.run(question="Why is the sky blue?", temperature=0)["answer"])
"""
from __future__ import annotations

from treadle.lang.backend import Backend, get_default_backend, set_default_backend
from treadle.lang.backend_engine import EngineBackend
from treadle.lang.backend_http import RuntimeEndpoint
from treadle.lang.chat_template import ChatTemplate
from treadle.lang.primitives import (assistant, assistant_begin, assistant_end, gen, gen_int, gen_string,
                                     greedy_token_selection, select, system, system_begin, system_end,
                                     token_length_normalized, unconditional_likelihood_normalized, user,
                                     user_begin, user_end)
from treadle.lang.program import Program, function
from treadle.lang.state import ForkGroup, ProgramState

__all__ = ["Backend", "ChatTemplate", "EngineBackend", "ForkGroup", "Program", "ProgramState", "RuntimeEndpoint",
           "assistant", "assistant_begin", "assistant_end", "function", "gen", "gen_int", "gen_string",
           "get_default_backend", "greedy_token_selection", "select", "set_default_backend", "system",
           "system_begin", "system_end", "token_length_normalized", "unconditional_likelihood_normalized", "user",
           "user_begin", "user_end"]
