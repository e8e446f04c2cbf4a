"""Role rendering through the model's own chat template.

The template is rendered with a placeholder as the message content and the output is split
around it, giving each role's begin and end strings. `s += user("hi")` then appends
begin("user") + "hi" + end("user"), so a program's text equals what the tokenizer's
`apply_chat_template` would produce for the same messages.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from treadle.lang.ir import ROLES

_PH = "TREADLEPLACEHOLDER7291"
_FILL = "TREADLEFILLER5813"

# render(messages, add_generation_prompt) -> prompt text
Renderer = Callable[[list[dict], bool], str]


@dataclass(frozen=True)
class ChatTemplate:
    """Begin/end strings per role, plus `implicit_prefix`: the text the template puts
    before a conversation that does not open with a system message (e.g. a default
    system prompt), inserted when a program's first role is not "system"."""

    begin: dict[str, str]
    end: dict[str, str]
    implicit_prefix: str

    @classmethod
    def from_renderer(cls, render: Renderer) -> "ChatTemplate":
        """Derive the role strings by rendering placeholder conversations."""
        begin: dict[str, str] = {}
        end: dict[str, str] = {}
        begin["system"], end["system"] = _split(render([{"role": "system", "content": _PH}], False), "system")
        # user / assistant: render after a fixed history, and keep only the added tail
        histories = {"user": [{"role": "system", "content": _FILL}],
                     "assistant": [{"role": "system", "content": _FILL}, {"role": "user", "content": _FILL}]}
        for role, history in histories.items():
            base = render(history, False)
            full = render(history + [{"role": role, "content": _PH}], False)
            if not full.startswith(base):
                raise ValueError(f"the chat template re-renders earlier messages when a {role} message is added; "
                                 "roles cannot be rendered incrementally with this template")
            begin[role], end[role] = _split(full[len(base):], role)
        first_user = render([{"role": "user", "content": _PH}], False)
        idx = first_user.find(begin["user"] + _PH)
        implicit = first_user[:idx] if idx > 0 else ""
        return cls(begin, end, implicit)

    def role_begin(self, role: str) -> str:
        _check_role(role)
        return self.begin[role]

    def role_end(self, role: str) -> str:
        _check_role(role)
        return self.end[role]


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

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    compiled = env.from_string(template)

    def render(messages: list[dict], add_generation_prompt: bool) -> str:
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token)

    return render
