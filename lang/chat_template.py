"""Chat templates: how roles render into a program's text.

A backend's template is, by default, derived from the model's own chat template: it is rendered
with a placeholder as the message content and the output is split around it, giving each role's
prefix and suffix. `s += user("hi")` then appends prefix("user") + "hi" + suffix("user"), so a
program's text equals what the tokenizer's `apply_chat_template` would produce for the same
messages.

SGLang's module (`from sglang.lang.chat_template import get_chat_template`) is here too: its
`ChatTemplate` fields and methods, `ChatTemplateStyle`, and a registry of named templates
(`get_chat_template("llama-2-chat")`, `register_chat_template(...)`) that a backend takes in
place of the model's own (`backend.chat_template = get_chat_template("chatml")`, or
`RuntimeEndpoint(url, chat_template_name="chatml")`). A named template's `stop_str` is added to
every gen's stop strings, as SGLang does; the model-derived one has none (the model ends its
message with its end-of-turn token).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Callable

from treadle.lang.ir import ROLES

_PH = "TREADLEPLACEHOLDER7291"
_PH_USER = "TREADLEUSERHOLDER4607"
_FILL = "TREADLEFILLER5813"

# render(messages, add_generation_prompt) -> prompt text
Renderer = Callable[[list[dict], bool], str]


class ChatTemplateStyle(Enum):
    """SGLang's: PLAIN templates give each role a fixed prefix and suffix; LLAMA2 puts a leading
    system message inside the first user turn ("[INST] <<SYS>>...<</SYS>>\\n\\n...")."""

    PLAIN = auto()
    LLAMA2 = auto()


@dataclass
class ChatTemplate:
    """SGLang's ChatTemplate, field for field and in its order, plus treadle's `implicit_prefix`:
    the text a model's own template puts before a conversation that does not open with a
    system message (e.g. its default system prompt), and `refused_roles`. SGLang's `default_system_prompt` is added
    as a system message instead (it shows in `s.messages()`, as in SGLang)."""

    name: str
    default_system_prompt: str | None
    role_prefix_and_suffix: dict[str, tuple[str, str]]
    stop_str: list[str] | tuple[str, ...] = ()
    image_token: str = "<image>"
    audio_token: str = "<audio>"
    style: ChatTemplateStyle = ChatTemplateStyle.PLAIN
    implicit_prefix: str = ""
    # role -> why the model's own template refuses it (Mistral's and Gemma's raise on a system
    # message): a program that opens such a message gets a ValueError saying so
    refused_roles: dict[str, str] = field(default_factory=dict)
    # the model's own template puts a leading system message inside the first user message
    # (Llama-2's "[INST] <<SYS>>\n...\n<</SYS>>\n\n", Mistral v0.3's "[INST] ...\n\n"), as
    # SGLang's LLAMA2 style: the system role's strings are what goes around its text there
    system_in_first_user: bool = False

    def get_prefix_and_suffix(self, role: str, hist_messages: list[dict]) -> tuple[str, str]:
        """The text before and after a `role` message that follows `hist_messages`, as SGLang's."""
        if role in self.refused_roles:
            raise ValueError(f"this model's chat template cannot render a {role} message on its own "
                             f"({self.refused_roles[role]}); put its text in the first user message instead")
        prefix, suffix = self.role_prefix_and_suffix.get(role, ("", ""))
        if self.system_in_first_user:
            return self._folded(role, hist_messages, prefix, suffix)
        if self.style == ChatTemplateStyle.LLAMA2:
            if role == "system" and not hist_messages:
                user_prefix, _ = self.role_prefix_and_suffix.get("user", ("", ""))
                system_prefix, system_suffix = self.role_prefix_and_suffix.get("system", ("", ""))
                return user_prefix + system_prefix, system_suffix
            if role == "user" and len(hist_messages) == 1 and hist_messages[0]["content"] is not None:
                return "", suffix
        return prefix, suffix

    def _folded(self, role: str, hist_messages: list[dict], prefix: str, suffix: str) -> tuple[str, str]:
        """get_prefix_and_suffix of a template that renders a leading system message inside the
        first user message (`system_in_first_user`)."""
        after_system = bool(hist_messages) and hist_messages[-1]["role"] == "system"
        if role == "system":
            if hist_messages:
                raise ValueError("this model's chat template renders a system message only as the first message "
                                 "(inside the first user message); put its text in a user message instead")
            return self.implicit_prefix + self.role_prefix_and_suffix.get("user", ("", ""))[0] + prefix, suffix
        if after_system and role != "user":
            raise ValueError(f"this model's chat template renders the system message inside the first user "
                             f"message: a user message must follow it, not a {role} message")
        return ("" if after_system else prefix), suffix

    def get_prompt(self, messages: list[dict]) -> str:
        """The text of a whole conversation, as SGLang's: a system message whose content is None
        takes the default system prompt (and is left out when there is none)."""
        prompt = ""
        for i, message in enumerate(messages):
            role, content = message["role"], message["content"]
            if role == "system" and content is None:
                content = self.default_system_prompt
                if content is None:
                    continue
            prefix, suffix = self.get_prefix_and_suffix(role, messages[:i])
            prompt += f"{prefix}{content}{suffix}"
        return prompt

    def role_begin(self, role: str) -> str:
        _check_role(role)
        return self.role_prefix_and_suffix.get(role, ("", ""))[0]

    def role_end(self, role: str) -> str:
        _check_role(role)
        return self.role_prefix_and_suffix.get(role, ("", ""))[1]

    @classmethod
    def from_renderer(cls, render: Renderer, name: str = "model") -> "ChatTemplate":
        """Derive the role strings by rendering placeholder conversations. A template that
        renders no system message alone (it raises, as Mistral v0.1's and Gemma's do, or moves
        it into a user message, as Llama-2's and Mistral v0.3's) renders user and assistant
        messages after a history without one; a leading system message then goes inside the
        first user message where the template puts it there (`system_in_first_user`, as
        SGLang's LLAMA2 style), else its system role is refused (`refused_roles`).
        An assistant message opens with the template's generation prompt (add_generation_prompt),
        so a gen there sees the prompt a chat request would send."""
        import jinja2

        def system(content: str) -> list[dict]:
            return [{"role": "system", "content": content}]

        parts: dict[str, tuple[str, str]] = {}
        refused: dict[str, str] = {}
        try:
            parts["system"] = _split(render(system(_PH), False), "system")
        except (jinja2.TemplateError, ValueError) as e:  # no system message, or not where it was put
            refused["system"] = str(e)
        # user / assistant: render after a fixed history, and keep only the added tail
        fill_user = [{"role": "user", "content": _FILL}]
        exchange = fill_user + [{"role": "assistant", "content": _FILL}]
        histories = {"user": [system(_FILL), exchange], "assistant": [system(_FILL) + fill_user, fill_user]}
        chosen: dict[str, list[dict]] = {}
        for role, candidates in histories.items():
            for history in [h for h in candidates if "system" not in refused or h[0]["role"] != "system"]:
                try:
                    base = render(history, False)
                    full = render(history + [{"role": role, "content": _PH}], False)
                except jinja2.TemplateError as e:
                    error = e
                    continue
                if not full.startswith(base):
                    raise ValueError(f"the chat template re-renders earlier messages when a {role} message is "
                                     "added; roles cannot be rendered incrementally with this template")
                before, after = _split(full[len(base):], role)
                if _FILL not in before + after:
                    parts[role], chosen[role] = (before, after), history
                    break
                error = ValueError(f"the {role} message takes in the text of the messages before it")
            else:
                raise ValueError(f"cannot render a {role} message with this chat template: {error}")
        # an assistant message opens with the template's generation prompt, what a chat request
        # sends the model before its reply: Qwen3's renders a finished last reply after an empty
        # thinking block, which as the prefix of a gen would keep the model from thinking
        history = chosen["assistant"]
        base = render(history, False)
        try:
            with_prompt = render(history, True)
        except jinja2.TemplateError:
            with_prompt = base
        if with_prompt.startswith(base) and len(with_prompt) > len(base):  # else it has none: keep the message's
            parts["assistant"] = (with_prompt[len(base):], parts["assistant"][1])
        first_user = render([{"role": "user", "content": _PH}], False)
        idx = first_user.find(parts["user"][0] + _PH)
        implicit = first_user[:idx] if idx > 0 else ""
        folded = _system_in_first_user(render, implicit, parts["user"]) if "system" in refused else None
        if folded is not None:
            parts["system"] = folded
            del refused["system"]
        return cls(name, None, parts, implicit_prefix=implicit, refused_roles=refused,
                   system_in_first_user=folded is not None)

    @classmethod
    def empty(cls) -> "ChatTemplate":
        """Roles that render as nothing (a trace without a backend)."""
        return cls("empty", None, {r: ("", "") for r in ROLES})


def _system_in_first_user(render: Renderer, implicit: str, user: tuple[str, str]) -> tuple[str, str] | None:
    """The text before and after a leading system message's content inside the first user
    message, from a template that renders no system message alone (Llama-2's, Mistral v0.3's):
    a system plus a user message renders as implicit + user prefix + before + system + after +
    user + user suffix. None when it does not (the template raises, or puts it elsewhere)."""
    import jinja2

    messages = [{"role": "system", "content": _PH}, {"role": "user", "content": _PH_USER}]
    try:
        text = render(messages, False)
    except (jinja2.TemplateError, ValueError):
        return None
    lead, tail = implicit + user[0], _PH_USER + user[1]
    if text.count(_PH) != 1 or text.count(_PH_USER) != 1 or not text.startswith(lead) or not text.endswith(tail):
        return None
    before, after = text[len(lead):-len(tail)].split(_PH)
    return (before, after) if _PH_USER not in before else None


def _split(text: str, role: str) -> tuple[str, str]:
    if text.count(_PH) != 1:
        raise ValueError(f"cannot find the {role} message content in the rendered chat template: {text!r}")
    before, after = text.split(_PH)
    return before, after


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")


def jinja_renderer(template: str, bos_token: str = "", eos_token: str = "") -> Renderer:
    """A renderer for a raw Jinja chat template (used over HTTP, where no tokenizer is loaded)."""
    import jinja2  # installed with transformers; only needed when roles are used over HTTP

    # as transformers renders it on the server: its loop controls, and its raise_exception and
    # strftime_now (a template's own errors, "Only user and assistant roles are supported!",
    # are then jinja2.TemplateErrors with its message, not "'raise_exception' is undefined")
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def strftime_now(fmt: str) -> str:
        import datetime

        return datetime.datetime.now().strftime(fmt)

    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    compiled = env.from_string(template)

    def render(messages: list[dict], add_generation_prompt: bool) -> str:
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token)

    return render


# ---------------------------------------------------------------- SGLang's registry

chat_template_registry: dict[str, ChatTemplate] = {}
matching_function_registry: list[Callable[[str], str | None]] = []


def register_chat_template(template: ChatTemplate) -> None:
    """Add (or replace) a named template, as SGLang's."""
    chat_template_registry[template.name] = template


def register_chat_template_matching_function(func: Callable[[str], str | ChatTemplate | None]
                                             ) -> Callable[[str], str | ChatTemplate | None]:
    """Add a function from a model path to a template name (or None), as SGLang's; a decorator.
    It may return the template itself (`get_chat_template(name)`), as older SGLang's did. A
    function a program registers also picks the template a RuntimeEndpoint or Engine backend
    renders roles with, when it is the first to match the served model's path
    (`registered_template_for`)."""
    matching_function_registry.append(func)
    return func


def get_chat_template(name: str) -> ChatTemplate:
    """The registered template of that name; a KeyError (as SGLang's) naming the known ones."""
    try:
        return chat_template_registry[name]
    except KeyError:
        raise KeyError(f"no chat template named {name!r}; registered: {', '.join(sorted(chat_template_registry))}"
                       ) from None


def get_chat_template_by_model_path(model_path: str) -> ChatTemplate:
    """The template the first matching function names for `model_path`, else "default", as
    SGLang's. (treadle's backends render roles with the model's own template, not this.)"""
    for matching_func in matching_function_registry:
        found = matching_func(model_path)
        if found is not None:
            return _template_of(found, matching_func)
    return get_chat_template("default")


def registered_template_for(model_path: str) -> ChatTemplate | None:
    """The template a matching function the program registered picks for `model_path`, when it
    is the first function of the registry to match (as SGLang's RuntimeEndpoint picks); None when
    none matches or SGLang's own function for the model's family does first: treadle's backends
    then render roles with the model's own template, which SGLang's named ones approximate."""
    for matching_func in matching_function_registry:
        found = matching_func(model_path)
        if found is not None:
            return None if matching_func in _SGLANG_MATCHERS else _template_of(found, matching_func)
    return None


def _template_of(found: str | ChatTemplate, matching_func: Callable) -> ChatTemplate:
    """What a matching function returned: a template name (SGLang's), or the template itself
    (older SGLang's functions return `get_chat_template(name)`)."""
    if isinstance(found, ChatTemplate):
        return found
    if not isinstance(found, str):
        raise TypeError(f"chat template matching function {getattr(matching_func, '__name__', matching_func)!r} "
                        f"returned {found!r}: it returns a template name, a ChatTemplate or None")
    return get_chat_template(found)


def _chatml() -> dict[str, tuple[str, str]]:
    return {r: (f"<|im_start|>{r}\n", "<|im_end|>\n") for r in ROLES}


def _llama3(start: str, end: str, eot: str) -> dict[str, tuple[str, str]]:
    return {r: (f"{start}{r}{end}\n\n", eot) for r in ROLES}


# SGLang's named templates (sglang/lang/chat_template.py), those of text models and their strings
for _t in (
    ChatTemplate("default", None, {"system": ("SYSTEM:", "\n"), "user": ("USER:", "\n"),
                                   "assistant": ("ASSISTANT:", "\n")}),
    ChatTemplate("chatgpt", None, {"system": ("", ""), "user": ("", ""), "assistant": ("", "")}),
    ChatTemplate("claude", None, {"system": ("", ""), "user": ("\n\nHuman: ", ""),
                                  "assistant": ("\n\nAssistant:", "")}),
    ChatTemplate("chatml", None, _chatml(), stop_str=("<|im_end|>",)),
    ChatTemplate("chatml-llava", "You are a helpful assistant.", _chatml(), stop_str=("<|im_end|>",),
                 image_token="<image>\n"),
    ChatTemplate("qwen", "You are a helpful assistant.", _chatml(), stop_str=("<|im_end|>",)),
    ChatTemplate("qwen2-vl", "You are a helpful assistant.", _chatml(), stop_str=("<|im_end|>",),
                 image_token="<|vision_start|><|image_pad|><|vision_end|>"),
    ChatTemplate("vicuna_v1.1",
                 "A chat between a curious user and an artificial intelligence assistant. "
                 "The assistant gives helpful, detailed, and polite answers to the user's questions.",
                 {"system": ("", " "), "user": ("USER:", " "), "assistant": ("ASSISTANT:", "</s>")},
                 image_token=" <image>\n"),
    ChatTemplate("llama-2-chat", None, {"system": ("<<SYS>>\n", "\n<</SYS>>\n\n"), "user": ("[INST] ", " [/INST]"),
                                        "assistant": ("", " </s><s>")}, style=ChatTemplateStyle.LLAMA2),
    ChatTemplate("mistral", None, {"system": ("[SYSTEM_PROMPT] ", " [/SYSTEM_PROMPT]"), "user": ("[INST] ", " [/INST]"),
                                   "assistant": ("", " </s><s>")}, stop_str=("</s>",), image_token="[IMG]"),
    ChatTemplate("llama-3-instruct", None, _llama3("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
                 stop_str=("<|eot_id|>",), image_token="<|image|>"),
    ChatTemplate("llama-3-instruct-llava", None, _llama3("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
                 stop_str=("<|eot_id|>",), image_token="<image>\n"),
    ChatTemplate("llama-4", None, _llama3("<|header_start|>", "<|header_end|>", "<|eot|>"),
                 stop_str=("<|eot|>",), image_token="<|image|>"),
    ChatTemplate("gemma-it", None, {"system": ("", ""), "user": ("<start_of_turn>user\n", "<end_of_turn>\n"),
                                    "assistant": ("<start_of_turn>model\n", "<end_of_turn>\n")}),
    ChatTemplate("yi-1.5", None, {"system": ("", ""),
                                  "user": ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"),
                                  "assistant": ("", "<|im_end|>\n")}, stop_str=("<|im_end|>",)),
    ChatTemplate("deepseek-v3", None, {"system": ("", ""), "user": ("<｜User｜>", ""),
                                       "assistant": ("<｜Assistant｜>", "<｜end▁of▁sentence｜>")},
                 stop_str=("<｜end▁of▁sentence｜>",)),
    ChatTemplate("c4ai-command-r", None,
                 {"system": ("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
                  "user": ("<|START_OF_TURN_TOKEN|><|USER_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
                  "assistant": ("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>")}),
    ChatTemplate("glm-4", None, {"system": ("<|system|>\n", ""), "user": ("<|user|>\n", ""),
                                 "assistant": ("<|assistant|>\n", "")},
                 stop_str=["<|user|>", "<|endoftext|>", "<|observation|>"]),
):
    register_chat_template(_t)


def _matcher(pattern: str, name: str, unless: str | None = None) -> Callable[[str], str | None]:
    def match(model_path: str) -> str | None:
        if not re.search(pattern, model_path, re.IGNORECASE):
            return None
        return None if unless and re.search(unless, model_path, re.IGNORECASE) else name

    match.__name__ = f"match_{name.replace('-', '_').replace('.', '_')}"
    return match


# SGLang's matching functions for the templates above, in its order
for _args in ((r"deepseek-(v3|r1)", "deepseek-v3", r"base"), (r"tinyllama", "chatml"), (r"qwen.*vl", "qwen2-vl"),
              (r"qwen.*(chat|instruct)", "qwen", r"llava"),
              (r"llava-v1\.6-34b|llava-v1\.6-yi-34b|llava-next-video-34b|llava-onevision-qwen2", "chatml-llava"),
              (r"llama-2.*chat|codellama.*instruct", "llama-2-chat"),
              (r"pixtral|(mistral|mixtral).*instruct", "mistral"),
              (r"llama-3.*instruct", "llama-3-instruct"), (r"llama-4", "llama-4"),
              (r"vicuna|llava-v1\.5|llava-next-video-7b", "vicuna_v1.1"), (r"gemma.*it", "gemma-it"),
              (r"c4ai-command-r", "c4ai-command-r"), (r"yi-1\.5.*chat", "yi-1.5")):
    register_chat_template_matching_function(_matcher(*_args))
_SGLANG_MATCHERS = tuple(matching_function_registry)  # SGLang's own: the model's template stands for theirs

__all__ = ["ChatTemplate", "ChatTemplateStyle", "chat_template_registry", "get_chat_template",
           "get_chat_template_by_model_path", "jinja_renderer", "matching_function_registry",
           "register_chat_template", "register_chat_template_matching_function", "registered_template_for"]
