"""Schemas as clients send them for models of installed packages: ``Model.model_json_schema()``
in both modes and ``openai.lib._pydantic.to_strict_json_schema(Model)`` (what the openai client's
``.parse`` sends), built here at test time from the packages' own models. Each compiles with
the embedded model's vocabulary, and random walks of its grammar end in JSON that jsonschema's
2020-12 validator (with its format checker) accepts.

Session 46's sweep (every Pydantic model of openai.types, openai.lib, fastapi.openapi.models,
pydantic and treadle.lang, 2,841 models, 3,394 distinct schemas over the three variants; and a
model per public Pydantic type) found one refusal of a satisfiable schema: a base64 format
(Pydantic's ``bytes`` under ``val_json_bytes="base64"``, ``Base64Bytes``, ``Base64UrlStr``)
under a ``maxLength`` below 8 was a 400, "only bounds that cut none of them off are"; a
minLength / maxLength no base64 string has (5..7) too, though no validator checks the format."""

from __future__ import annotations

import json
import os
import random
import sys
import zlib
from typing import Annotated, Optional

import jsonschema
import pytest
from pydantic import Base64Bytes, Base64UrlStr, BaseModel, ConfigDict, Field

from treadle.constrained import GrammarSpec, allocate_token_bitmask

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from grammar_walks import random_text  # noqa: E402

V = 49152


class Blob(BaseModel):
    """bytes as base64 in JSON, with lengths Pydantic writes on the encoded string."""
    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")
    tag: Annotated[bytes, Field(max_length=6)]
    nonce: Annotated[bytes, Field(min_length=5, max_length=7)]
    digest: Optional[Annotated[bytes, Field(max_length=3)]] = None


class Token(BaseModel):
    key: Annotated[Base64Bytes, Field(max_length=6)]
    short: Annotated[Base64UrlStr, Field(max_length=4)]


def _variants(model) -> list[tuple[str, dict]]:
    from openai.lib._pydantic import to_strict_json_schema

    return [("validation", model.model_json_schema()),
            ("serialization", model.model_json_schema(mode="serialization")),
            ("strict", to_strict_json_schema(model))]


def _walk(compiler, schema: dict, seed: str, walks: int, steps: int = 400) -> list[str]:
    """Finished walks' texts of ``schema``'s grammar, each checked against the schema."""
    g = compiler.compile(GrammarSpec.from_params(json_schema=schema))
    cls = jsonschema.Draft202012Validator
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    bm = allocate_token_bitmask(1, V)
    rng = random.Random(zlib.crc32(seed.encode()))
    texts = []
    for _ in range(walks):
        text = random_text(g.matcher(), bm, g.token_bytes, g.eos_token_ids[0], rng, steps=steps)
        if text is not None:
            errors = [e.message for e in validator.iter_errors(json.loads(text))]
            assert not errors, (seed, text[:300], errors[:1])
            texts.append(text)
    return texts


@pytest.mark.parametrize("model", [Blob, Token], ids=["bytes-base64", "Base64Bytes"])
def test_base64_under_short_max_length_compiles(smollm2_compiler, model):
    """Was a 400 (format 'base64url' with minLength/maxLength 0..6 is not supported). Now: a
    base64 string of those lengths where one exists (0 or 4 characters under 6: Pydantic reads it
    back), any string of them where none does (5..7: no validator checks the format)."""
    for variant, schema in _variants(model):
        texts = _walk(smollm2_compiler, schema, f"{model.__name__}/{variant}", walks=8)
        assert len(texts) >= 4, (variant, texts)
        for text in texts:
            value = json.loads(text)
            if model is Token:
                model.model_validate_json(text)
            else:
                assert len(value["tag"]) in (0, 4), value  # base64 of 0 or 3 bytes
                Blob.model_validate_json(json.dumps({"tag": value["tag"], "nonce": "AAAAAAA="}))


def _package_models() -> list:
    from fastapi.openapi.models import Schema
    from openai.types.batch import Batch
    from openai.types.chat import ChatCompletion
    from openai.types.fine_tuning import FineTuningJob

    return [(ChatCompletion, ("validation", "strict")), (Batch, ("serialization",)),
            (FineTuningJob, ("strict",)), (Schema, ("validation",))]


def test_package_models_compile_and_walks_validate(smollm2_compiler):
    """A few real models' schemas (a chat completion with its Optional and Literal members, a
    batch, a fine-tuning job in OpenAI's strict form, FastAPI's recursive OpenAPI Schema): each
    compiles and its finished walks validate. (Coverage of the sweep's result: this passes on the
    code before session 46's fix too.)"""
    done = 0
    for model, variants in _package_models():
        for variant, schema in _variants(model):
            if variant in variants:
                done += len(_walk(smollm2_compiler, schema, f"{model.__name__}/{variant}", walks=2, steps=600))
    assert done >= 3, done
