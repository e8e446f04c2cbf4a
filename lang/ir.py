"""Expression nodes of the DSL: what a program appends to its state.

A program builds these with the primitives (`gen`, `select`, `user`, ...) and `s += expr`
hands them to the state's executor, which runs them in order. Nodes are plain data; all
behaviour lives in the interpreter, so a backend never sees them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

ROLES = ("system", "user", "assistant")

# SGLang's regexes for typed generation (sglang.lang.ir has them under these names; programs
# import them from there or from the top level). The trailing `[ \n]*` of the numbers is how
# a model ends one: gen(dtype=int) also stops at " " or "\n", so "24 hours" gives "24".
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""


class Expr:
    """Base of every node. `a + b` concatenates, so `s += "Q: " + gen("a")` works."""

    def __add__(self, other: Any) -> "Concat":
        return Concat([self, to_expr(other)])

    def __radd__(self, other: Any) -> "Concat":
        return Concat([to_expr(other), self])


@dataclass(eq=False)
class Constant(Expr):
    """Literal text appended to the prompt."""

    text: str


@dataclass(eq=False)
class Concat(Expr):
    """A sequence of nodes run one after the other."""

    parts: list[Expr]


@dataclass(eq=False)
class Gen(Expr):
    """One generation call; `params` holds only the sampling fields the user set."""

    name: str | None
    params: dict[str, Any]
    dtype: type | None = None
    logprob: dict[str, Any] = field(default_factory=dict)  # return_logprob etc., as the runtime takes them


@dataclass(eq=False)
class Select(Expr):
    """Pick one of `choices` by the model's logprobs of each continuation."""

    name: str | None
    choices: list[str]
    method: str = "token_length_normalized"


@dataclass(eq=False)
class RoleBegin(Expr):
    role: str


@dataclass(eq=False)
class RoleEnd(Expr):
    role: str


@dataclass(eq=False)
class Role(Expr):
    """`user("hi")`: a whole message, i.e. RoleBegin + content + RoleEnd."""

    role: str
    content: list[Expr] = field(default_factory=list)


@dataclass(eq=False)
class Join(Expr):
    """Bring fork branches back into their parent (built by `ForkGroup.join`).

    mode "gather": each variable the branches created becomes a list in the parent;
    mode "concat": each branch's text after the fork point is appended in order."""

    branches: list[Any]  # the branches' StreamExecutors, all finished
    mode: str


@dataclass(eq=False)
class SetVar(Expr):
    """`s["name"] = value` / `s.set_var(name, value)`: set a variable in program order."""

    name: str
    value: Any


@dataclass(eq=False)
class VarScopeBegin(Expr):
    """`with s.var_scope(name):` opens: the variable will hold the text written from here."""

    name: str


@dataclass(eq=False)
class VarScopeEnd(Expr):
    """The scope closes: variable `name` is set to the text written since its VarScopeBegin."""

    name: str


@dataclass(eq=False)
class SeparateReasoning(Expr):
    """After gen/select `name`: split its thinking block off (lang/reasoning.py). Variable
    `name` keeps the answer, `name`_reasoning_content gets the reasoning, and the block leaves
    the prompt text."""

    name: str
    model_type: str


def to_expr(x: Any) -> Expr:
    """Coerce text (or a list of parts) to a node; anything else is a TypeError."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, str):
        return Constant(x)
    if isinstance(x, (list, tuple)):
        return Concat([to_expr(p) for p in x])
    raise TypeError(f"cannot add a {type(x).__name__} to a program state; use a str or a DSL expression "
                    f"(gen, select, user, ...), e.g. s += str(value)")


def flatten(expr: Expr) -> Iterator[Expr]:
    """Expand Concat and Role into the primitive sequence the executor runs."""
    if isinstance(expr, Concat):
        for p in expr.parts:
            yield from flatten(p)
    elif isinstance(expr, Role):
        yield RoleBegin(expr.role)
        for p in expr.content:
            yield from flatten(p)
        yield RoleEnd(expr.role)
    else:
        yield expr
