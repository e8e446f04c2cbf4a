"""RuntimeEndpoint: run programs against a treadle server over HTTP (`/generate`)."""
from __future__ import annotations

import json
import os
from typing import Any, Iterator

import requests

from treadle.lang.backend import Backend, sglang_server_info
from treadle.lang.chat_template import ChatTemplate, get_chat_template, jinja_renderer, registered_template_for

_ZERO = {"max_new_tokens": 0}
# HTTP connections an endpoint keeps open for reuse: more than run_batch's threads ("auto": at most
# max(64, 4 x CPUs)) times a few fork branches each
_POOL_SIZE = 1024
# seconds a request waits to connect to the server when RuntimeEndpoint has no timeout_s (its
# reply is waited for as long as it takes, as SGLang's)
CONNECT_TIMEOUT_S = 30.0


class RuntimeEndpoint(Backend):
    """Backend over a running server at `base_url` (e.g. "http://127.0.0.1:30000").

    SGLang's parameters, in its order: `api_key`; `verify` is requests' TLS verification (a CA
    bundle path, or False); `chat_template_name` names one of SGLang's templates
    (treadle.lang.chat_template) to render roles with, its stop strings added to every gen, as
    SGLang's; without it roles render through the served model's own chat template, read from
    /get_model_info (SGLang guesses a named one from the model path). Treadle's
    own are keyword-only: `timeout_s`, and `url` as another name for `base_url`. As SGLang's, a
    request waits for its reply as long as it takes (a long gen is no error); `timeout_s` bounds
    each wait for the server (to connect, and between the bytes of a reply) and a request past it
    is a TimeoutError naming it. Without it, connecting is bounded by CONNECT_TIMEOUT_S alone.
    Raises ConnectionError naming the URL when the server cannot be reached."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, verify: Any = None,
                 chat_template_name: str | None = None, *, url: str | None = None,
                 timeout_s: float | None = None) -> None:
        if (base_url is None) == (url is None):
            raise TypeError("RuntimeEndpoint() takes the server's URL once: RuntimeEndpoint(base_url)")
        url = base_url if url is None else url
        if not isinstance(url, str) or not url.lower().startswith(("http://", "https://")):
            hint = f"; did you mean 'http://{url}'?" if isinstance(url, str) and "://" not in url else ""
            raise ValueError(f"RuntimeEndpoint({url!r}): the server's URL is http://host:port (or https://){hint}")
        self.url = self.base_url = url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.session = requests.Session()
        # one connection per request in flight: run_batch's threads and fork branches share this
        # session, and requests' default pool keeps 10 (urllib3 drops each connection past that,
        # logging "Connection pool is full" per request)
        pool = requests.adapters.HTTPAdapter(pool_maxsize=_POOL_SIZE)
        self.session.mount("http://", pool)
        self.session.mount("https://", pool)
        if verify is not None:
            self.session.verify = verify
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.model_info = self._get("/get_model_info")
        if chat_template_name is not None:  # SGLang's named template (a KeyError naming the known ones)
            self.chat_template = get_chat_template(chat_template_name)
        # how the server streams /generate: the whole output so far (SGLang's default) or what is new
        self._incremental = bool(self.model_info.get("incremental_streaming_output"))
        self._owner: Any = None  # a weakref to the Runtime whose server this is (runtime_process)

    def shutdown(self) -> None:
        """SGLang's BaseBackend.shutdown. The endpoint of a `Runtime` (what
        `set_default_backend(runtime)` holds, where SGLang's default backend is the Runtime
        itself) stops that Runtime's server; one made from a URL leaves the server running."""
        owner = self._owner() if self._owner is not None else None
        if owner is not None:
            owner.shutdown()

    def get_model_name(self) -> str:
        """The served model's path, as SGLang's RuntimeEndpoint.get_model_name."""
        return self.model_info.get("model_path") or ""

    # ------------------------------------------------------------ HTTP helpers

    def _request(self, method: str, path: str, **kw: Any) -> requests.Response:
        try:
            timeout = (CONNECT_TIMEOUT_S, None) if self.timeout_s is None else self.timeout_s
            resp = self.session.request(method, self.url + path, timeout=timeout, **kw)
        except requests.ConnectionError as e:  # a connect timeout too
            raise ConnectionError(f"cannot reach the treadle server at {self.url}: {e}") from e
        except requests.Timeout as e:
            raise TimeoutError(f"{method} {self.url}{path}: no reply within RuntimeEndpoint's timeout_s="
                               f"{self.timeout_s} (leave it unset to wait as long as the request takes)") from e
        if resp.status_code >= 400:
            try:
                body = resp.json()
                msg = body.get("error", {}).get("message") if isinstance(body.get("error"), dict) else body
            except ValueError:
                msg = resp.text
            err = ValueError if resp.status_code < 500 else RuntimeError
            raise err(f"{method} {self.url}{path} failed with HTTP {resp.status_code}: {msg}")
        return resp

    def _get(self, path: str) -> dict:
        return self._request("GET", path).json()

    def _generate(self, payload: dict, stream: bool = False) -> Any:
        return self._request("POST", "/generate", json=payload, stream=stream)

    # ------------------------------------------------------------ Backend interface

    def _load_chat_template(self) -> ChatTemplate:
        # a matching function the program registered for this model's path, as SGLang's picks it
        registered = registered_template_for(self.model_info.get("model_path") or "")
        if registered is not None:
            return registered
        template = self.model_info.get("chat_template") or _template_from_path(self.model_info.get("tokenizer_path"))
        if not template:
            raise ValueError(f"the server at {self.url} reports no chat_template in /get_model_info (nor a local "
                             "tokenizer_path holding one), so roles (system/user/assistant) cannot be rendered")
        render = jinja_renderer(template, self.model_info.get("bos_token") or "",
                                self.model_info.get("eos_token") or "")
        return ChatTemplate.from_renderer(render)

    def cache_prefix(self, text: str) -> dict:
        return self._generate({"text": text, "sampling_params": dict(_ZERO)}).json()["meta_info"]

    def generate(self, text: str, params: dict, logprob: dict | None = None) -> tuple[str, dict]:
        out = self._generate({"text": text, "sampling_params": dict(params), **(logprob or {})}).json()
        return out["text"], out["meta_info"]

    def generate_stream(self, text: str, params: dict, logprob: dict | None = None) -> Iterator[tuple[str, dict]]:
        resp = self._generate({"text": text, "sampling_params": dict(params), "stream": True, **(logprob or {})},
                              stream=True)
        sent = 0
        with resp:
            for line in resp.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    return
                chunk = json.loads(data)
                if "error" in chunk:
                    raise ValueError(f"the server at {self.url} failed the request: {chunk['error']}")
                if self._incremental:
                    yield chunk["text"], chunk["meta_info"]
                else:
                    yield chunk["text"][sent:], chunk["meta_info"]
                    sent = len(chunk["text"])

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self._request("POST", "/tokenize", json={"prompt": texts}).json()["tokens"]

    def context_token(self) -> int | None:
        info = self.model_info
        return info["bos_token_id"] if info.get("bos_token_id") is not None else info.get("eos_token_id")

    def prompt_logprobs(self, seqs: list[list[int]], start: int) -> list[dict]:
        payload: dict[str, Any] = {"input_ids": seqs, "sampling_params": [dict(_ZERO) for _ in seqs]}
        if start > 0:
            payload.update(return_logprob=True, logprob_start_len=start, return_text_in_logprobs=True)
        outs = self._generate(payload).json()
        for i, o in enumerate(outs):
            # a part that failed mid-run comes back in the 200 list with its own error and no
            # scores (docs/serving.md): scoring it as an empty sum would pick a choice silently
            err = o.get("error")
            if err:
                msg = err.get("message") if isinstance(err, dict) else err
                kind = ValueError if isinstance(err, dict) and err.get("type") == "invalid_request_error" else RuntimeError
                raise kind(f"the server at {self.url} failed part {i} of a scoring batch: {msg}")
        return [o["meta_info"] for o in outs]

    def get_server_info(self) -> dict:
        info = self._get("/get_server_info")
        if "version" not in info:  # the server's own version, where it has /version (a router has not)
            try:
                info["version"] = self._get("/version")["version"]
            except (ValueError, RuntimeError, KeyError, TypeError):
                pass
        return sglang_server_info(info, self.model_info.get("model_path"), None)

    def flush_cache(self) -> bool:
        self._request("POST", "/flush_cache")
        return True


def _template_from_path(path: str | None) -> str | None:
    """The chat template stored at the server's tokenizer_path, when that path is visible
    from here (same machine): tokenizer_config.json in a directory, or GGUF metadata."""
    if not path or not os.path.exists(path):
        return None
    if os.path.isdir(path):
        cfg = os.path.join(path, "tokenizer_config.json")
        if not os.path.isfile(cfg):
            return None
        with open(cfg, encoding="utf-8") as f:
            template = json.load(f).get("chat_template")
        return template if isinstance(template, str) else None
    if path.endswith(".gguf"):
        import gguf  # only for a GGUF model served on this machine

        field = gguf.GGUFReader(path).fields.get("tokenizer.chat_template")
        return None if field is None else bytes(field.parts[field.data[0]]).decode("utf-8")
    return None
