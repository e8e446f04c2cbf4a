"""EngineBackend: run programs on an in-process `treadle.runtime.Engine`."""
from __future__ import annotations

from typing import Any, Iterator

from treadle.lang.backend import Backend, sglang_server_info
from treadle.lang.chat_template import ChatTemplate, registered_template_for

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

        # a matching function the program registered for the model's path, as a RuntimeEndpoint's
        source = getattr(getattr(self.engine, "runner", None), "source", None)
        registered = registered_template_for(getattr(source, "path", None) or "")
        if registered is not None:
            return registered

        tok = self.engine.tokenizer
        if tok is None:
            raise ValueError("this model has no tokenizer, so roles (system/user/assistant) cannot be rendered")
        return ChatTemplate.from_renderer(lambda msgs, gen_prompt: apply_chat_template(tok, msgs, gen_prompt))

    def cache_prefix(self, text: str) -> dict:
        return self.engine.generate(text, dict(_ZERO))["meta_info"]

    def generate(self, text: str, params: dict, logprob: dict | None = None) -> tuple[str, dict]:
        out = self.engine.generate(text, dict(params), **(logprob or {}))
        return out["text"], out["meta_info"]

    def generate_stream(self, text: str, params: dict, logprob: dict | None = None) -> Iterator[tuple[str, dict]]:
        # the engine's chunks hold the text so far (SGLang's), or what is new with its
        # incremental_streaming_output; the interpreter takes what is new
        incremental = getattr(getattr(self.engine, "args", None), "incremental_streaming_output", False)
        sent = 0
        for chunk in self.engine.generate(text, dict(params), stream=True, **(logprob or {})):
            if incremental:
                yield chunk["text"], chunk["meta_info"]
            else:
                yield chunk["text"][sent:], chunk["meta_info"]
                sent = len(chunk["text"])

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [self.engine.encode(t) for t in texts]

    def context_token(self) -> int | None:
        tok = self.engine.tokenizer
        if tok is None:  # Engine(skip_tokenizer_init=True): no BOS / EOS to read, no text to score
            raise ValueError("scoring a select needs the model's tokenizer; this Engine was started with "
                             "skip_tokenizer_init=True")
        return tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id

    def prompt_logprobs(self, seqs: list[list[int]], start: int) -> list[dict]:
        outs = self.engine.generate(input_ids=seqs, sampling_params=[dict(_ZERO) for _ in seqs],
                                    return_logprob=start > 0, logprob_start_len=start if start > 0 else None,
                                    return_text_in_logprobs=start > 0)
        return [o["meta_info"] for o in outs]

    def get_server_info(self) -> dict:
        source = getattr(getattr(self.engine, "runner", None), "source", None)  # the model it loaded
        return sglang_server_info(self.engine.get_server_info(), getattr(source, "path", None), None)

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def shutdown(self) -> None:
        """Stop the engine if this backend started it."""
        if self._owned:
            self.engine.shutdown()

