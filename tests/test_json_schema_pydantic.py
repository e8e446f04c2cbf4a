"""Schemas as Pydantic writes them (the usual source of a user's JSON schema): discriminated
unions, recursive models (list[Node], Optional[Node]), dicts keyed by Literal, sets of an
Enum, tuples, Any,
formats (date-time, duration, uuid, URLs with their lengths, ...). Each must compile, and random walks of its grammar
over the SmolLM2 vocabulary must end in text that jsonschema accepts and Pydantic parses back
into the model. (Not Decimal: Pydantic's schema for it, anyOf number or any string, admits
strings its own parser refuses.)"""

from __future__ import annotations

import datetime
import json
import random
import uuid
import zlib
from enum import Enum
from typing import Annotated, Any, Literal, Optional, Union

import jsonschema
import pytest
from pydantic import AnyUrl, BaseModel, Field, HttpUrl, IPvAnyAddress

from treadle.constrained import GrammarSpec, allocate_token_bitmask, build_compiled_grammar, token_bytes_table
from treadle.constrained.index.json_any import JsonPushdown

from json_checks import random_walk

EOS = 2
V = 49152


class Kind(str, Enum):
    a = "a"
    b = "b"


class Cat(BaseModel):
    pet_type: Literal["cat"]
    meows: int


class Dog(BaseModel):
    pet_type: Literal["dog"]
    barks: float


class Owner(BaseModel):
    pet: Union[Cat, Dog] = Field(discriminator="pet_type")
    pets: list[Annotated[Union[Cat, Dog], Field(discriminator="pet_type")]] = []


class Misc(BaseModel):
    when: datetime.datetime
    day: datetime.date
    dur: datetime.timedelta
    id: uuid.UUID
    kind: Kind
    kinds: set[Kind]
    scores: dict[Literal["x", "y"], int]
    code: str = Field(pattern=r"^[A-Z]{3}$")
    score: Annotated[int, Field(ge=0, le=100)]
    anything: Any
    maybe: Optional[int] = None
    pair: tuple[int, str]
    nested: dict[str, list[int]]


class Node(BaseModel):
    name: str
    children: list[Node] = []
    parent: Optional[Node] = None


class Links(BaseModel):
    """Keywords Pydantic writes that were 400s: a URL's format with minLength (maxLength 2083
    for HttpUrl), a non-empty dict's minProperties 1, a float bound past 1e9, format ipvanyaddress."""
    home: HttpUrl
    docs: AnyUrl
    tags: Annotated[dict[str, int], Field(min_length=1)]
    at_ms: Annotated[float, Field(ge=1e12, le=4e12)]
    addr: IPvAnyAddress


MODELS = {"discriminated": Owner, "misc": Misc, "recursive": Node, "links": Links}


@pytest.fixture(scope="module")
def vocab(smol):
    table = token_bytes_table(smol)
    return table, JsonPushdown(table, len(table), V, (EOS,))


@pytest.mark.parametrize("name", list(MODELS))
def test_pydantic_schemas_compile_and_walks_parse_back(smol, vocab, name):
    table, pda = vocab
    model = MODELS[name]
    schema = model.model_json_schema()
    spec = GrammarSpec.from_params(json_schema=schema)
    g = build_compiled_grammar(spec.to_regex(holes=True), smol, [EOS], vocab_size=V, spec=spec, pda=pda)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    rng = random.Random(zlib.crc32(name.encode()))
    bm = allocate_token_bitmask(1, V)
    finished = 0
    for _ in range(6):
        m = g.matcher()
        out = random_walk(m, bm, table, EOS, rng, steps=500, stop_p=0.3, free_steps=60, steer_after=120)
        if m.is_terminated():
            text = out.decode()
            validator.validate(json.loads(text))
            model.model_validate_json(text)  # Pydantic reads it back
            finished += 1
    assert finished >= 3, finished
