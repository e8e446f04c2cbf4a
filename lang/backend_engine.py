"""EngineBackend: run programs on an in-process `treadle.runtime.Engine`."""
from __future__ import annotations

from typing import Any, Iterator

from treadle.lang.backend import Backend, ChoiceScores, choice_start
from treadle.lang.chat_template import ChatTemplate

_ZERO = {"max_new_tokens": 0}


class EngineBackend(Backend):
    """Backend over an Engine in this process. `EngineBackend()` starts one with the
    embedded model; `EngineBackend(engine)` wraps an existing one (not shut down here)."""

    def __init__(self, engine: Any = None, **engine_args: Any) -> None:
        if engine is None:
            from treadle.runtime import Engine  # lazy: lang depends on runtime only through here

            engine = Engine(**engine_args)
            self._owned = True
        else:
            if engine_args:
                raise ValueError("pass either an engine or engine arguments, not both")
            self._owned = False
        self.engine = engine

    def _load_chat_template(self) -> ChatTemplate:
        from treadle.runtime.tokenizer import apply_chat_template

        tok = self.engine.tokenizer
        if tok is None:
            raise ValueError("this model has no tokenizer, so roles (system/user/assistant) cannot be rendered")
        return ChatTemplate.from_renderer(lambda msgs, gen_prompt: apply_chat_template(tok, msgs, gen_prompt))

    def cache_prefix(self, text: str) -> dict:
        return self.engine.generate(text, dict(_ZERO))["meta_info"]

    def generate(self, text: str, params: dict) -> tuple[str, dict]:
        out = self.engine.generate(text, dict(params))
        return out["text"], out["meta_info"]

    def generate_stream(self, text: str, params: dict) -> Iterator[tuple[str, dict]]:
        for chunk in self.engine.generate(text, dict(params), stream=True):
            yield chunk["text"], chunk["meta_info"]

    def choice_logprobs(self, text: str, choices: list[str]) -> ChoiceScores:
        """Tokenize prefix and each prefix+choice, find where each choice starts (see
        `choice_start`), and read the choices' prompt logprobs from one batched request."""
        prefix_ids = self.engine.encode(text)
        fulls = [self.engine.encode(text + c) for c in choices]
        starts = [choice_start(prefix_ids, ids) for ids in fulls]
        if prefix_ids:  # the choices share this prefix: compute it once
            self.engine.generate(input_ids=prefix_ids, sampling_params=dict(_ZERO))
        first = min(starts)
        outs = self.engine.generate(input_ids=fulls, sampling_params=[dict(_ZERO) for _ in fulls],
                                    return_logprob=True, logprob_start_len=first)
        logprobs = []
        for out, start in zip(outs, starts):
            lps = out["meta_info"]["input_token_logprobs"][start - first:]  # aligned with ids[first:]
            assert all(lp is not None for lp in lps), "scoring starts past position 0"
            logprobs.append([float(lp) for lp in lps])
        return ChoiceScores(logprobs, _sum_meta([o["meta_info"] for o in outs]))

    def get_server_info(self) -> dict:
        return self.engine.get_server_info()

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def shutdown(self) -> None:
        """Stop the engine if this backend started it."""
        if self._owned:
            self.engine.shutdown()


def _sum_meta(metas: list[dict]) -> dict:
    return {"prompt_tokens": sum(m["prompt_tokens"] for m in metas),
            "cached_tokens": sum(m.get("cached_tokens", 0) for m in metas),
            "completion_tokens": 0, "finish_reason": None}
