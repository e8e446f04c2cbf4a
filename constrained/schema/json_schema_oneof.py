"""``anyOf`` / ``oneOf`` in the JSON-schema translation: a mixin of ``_Converter`` (json_schema.py).

``anyOf`` is an alternation of its branches' regexes (``_alt``), each branch written with the
rest of its schema merged in; in spec mode beside ``unevaluated*`` also the conjunctions of
up to ``ANYOF_COMBINED_MAX`` branches (``_combined_branches``). ``oneOf`` is written as
``anyOf`` only where no value can satisfy two branches: ``_check_exclusive`` proves it from
types, listed tags (``_tags``) and keys one branch requires and another forbids (``_keys``);
else ``_made_exclusive`` narrows each branch to where the others fail, with the breakers
json_schema_logic.complement lists (at most ``EXCLUSIVE_CHOICES`` ways, ``EXCLUSIVE_BRANCHES``
branches, ``EXCLUSIVE_ROUNDS`` rounds), or refuses naming ``oneOf``. A branch that cannot be
written is left out while another can (strict mode); none written is ``_no_branch``'s refusal.

The methods call back into the converter's ``_convert`` / ``_follow``; this module does not
import json_schema.py.
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

from treadle.constrained.schema.json_schema_logic import Apart, closed_forbids, complement, complement_exact, repeated
from treadle.constrained.schema.json_schema_parts import (CannotWrite, NoOutput, Unsatisfiable, UnsupportedSchemaError,
                                                        schema_types)
from treadle.constrained.schema.listed_values import scalar_key as _scalar_key

# oneOf made exclusive: at most this many ways for one branch to fail all the others
EXCLUSIVE_CHOICES = 4
# ... and branches of one such oneOf at most (each pair is compared)
EXCLUSIVE_BRANCHES = 64
# ... and rounds of proving the others again after a branch was narrowed (strict mode)
EXCLUSIVE_ROUNDS = 3
# spec mode: anyOf beside unevaluated* also generates the conjunctions of 2+ branches (a
# property evaluated by a second matching branch is then evaluated), up to this many branches.
ANYOF_COMBINED_MAX = 4


def _no_branch(kind: str, path: str, errors: list[NoOutput], literal: bool = False) -> NoOutput:
    """The refusal of an anyOf / oneOf none of whose branches has an output: it names the keyword
    and each branch's reason (the first branch's alone read as if that branch were the schema);
    ``literal``: a oneOf of listed values, each filtered by the other branches.
    ``Unsatisfiable`` only where every branch is (one past the recursion depth proves nothing)."""
    whys = "; ".join(str(e).removeprefix("json_schema: ") for e in errors[:4])
    whys += f"; and {len(errors) - 4} more" if len(errors) > 4 else ""
    cls = Unsatisfiable if all(isinstance(e, Unsatisfiable) for e in errors) else NoOutput
    also = ", each listed value being valid for another branch too" if literal else ""
    return cls(f"json_schema: keyword '{kind}' at {path}: no branch has a value treadle can write{also} ({whys})")


def _alt(parts: list[str]) -> str:
    uniq = list(dict.fromkeys(parts))
    return uniq[0] if len(uniq) == 1 else "(?:" + "|".join(uniq) + ")"


def _forbids_none(key: str) -> bool:
    return False


class _AlternativesMixin:
    """How ``_Converter`` writes ``anyOf`` and ``oneOf`` (see the module docstring)."""

    # ------------------------------------------------------------ anyOf / oneOf
    def _alternatives(self, schema: dict, path: str) -> str:
        kind = "anyOf" if "anyOf" in schema else "oneOf"
        branches = schema[kind]
        if not isinstance(branches, list) or not branches:
            raise UnsupportedSchemaError(f"json_schema: '{kind}' at {path} must be a non-empty list")
        rest = {k: v for k, v in schema.items() if k != kind}
        try:
            literal_only = kind == "oneOf" and self._check_exclusive(branches, rest, path)
        except UnsupportedSchemaError as exc:  # branches may overlap
            return self._made_exclusive(branches, rest, path, exc)
        out, first_error, empty = [], None, []
        for i, branch in enumerate(branches):
            # Literal oneOf branches are filtered value by value: not valid for any other.
            others = [{"not": b} for j, b in enumerate(branches) if j != i] if literal_only else None
            try:
                if others is None and self._annotations_only(rest):  # the branch alone ($refs stay refs)
                    out.append(self.convert(branch, f"{path}.{kind}[{i}]"))
                    continue
                merged = self.merger.merge_all(rest, [branch], f"{path}.{kind}[{i}]", others, named=True)
                out.append(self.convert(merged, f"{path}.{kind}[{i}]"))
            except NoOutput as exc:
                first_error = first_error or exc  # a branch with no output only narrows the choice
                empty.append(exc)
            except UnsupportedSchemaError as exc:
                # strict mode writes a subset: an anyOf branch it cannot write (an external $ref,
                # a pattern it cannot read) is left out, and another branch's values satisfy the
                # anyOf whatever that one says. Not in spec mode, nor for a oneOf proven apart by
                # _check_exclusive: a oneOf of tags names each of its kinds (the server's tool
                # calls are a oneOf of the tools' names: a tool it cannot write is a 400 naming
                # the tool, never a tool silently left out)
                if kind == "oneOf" or not self.leave_out_branches:
                    raise
                first_error = first_error or exc
        if kind == "anyOf" and self.spec:
            out.extend(self._combined_branches(branches, rest, path))
        if not out:
            assert first_error is not None
            if len(empty) == len(branches) and len(branches) > 1:  # every branch: name the union and each why
                raise _no_branch(kind, path, empty, literal_only) from first_error
            raise first_error
        return _alt(out)

    def _made_exclusive(self, branches: list, rest: dict, path: str, overlap: UnsupportedSchemaError) -> str:
        """oneOf whose branches may overlap: each branch written where every other one fails.

        Per other branch, nothing is added where ``Apart.apart`` proves that no value written
        for this branch satisfies it (by validity; in strict mode also because objects are
        written with their declared properties only, so a key the other branch requires and
        this one never declares is never written). Otherwise the branch is written with a
        schema of the other's ``complement`` (json_schema_logic.py): in spec mode any of them,
        up to ``EXCLUSIVE_CHOICES`` combinations; in strict mode those ``Apart.breakers`` keeps
        (they can hold beside the branch; a closed other branch is also broken by a key it
        forbids, made required), the ones that narrow it least first, cut to
        ``EXCLUSIVE_CHOICES`` combinations (a subset: sound). The strict proofs are then made
        again for the branch with those schemas (one may write a key another branch requires),
        up to ``EXCLUSIVE_ROUNDS`` times; a branch still not proven is left out.

        A branch whose exclusion cannot be said (no such schema, or too many combinations in
        spec mode) is left out in strict mode (that only narrows) and refuses the oneOf in spec
        mode; a branch that cannot be converted is left out in both. With none left, the first
        error met converting a branch is raised, else ``overlap``."""
        self._no_unevaluated(rest, "oneOf", path)
        resolve = lambda ref: self.merger.resolve(ref, path)  # noqa: E731
        everything = [i for i, b in enumerate(branches) if self._accepts_all(b)]
        if len(everything) > 1:  # every value is valid under both: none under exactly one (exact)
            raise Unsatisfiable(f"json_schema: keyword 'oneOf' at {path}: branches {everything[0]} and "
                                f"{everything[1]} accept every value, so no value satisfies exactly one branch")
        # a branch standing twice (the same assertions) is valid for no value: never written, and the
        # others are written where it fails (exact)
        twice = repeated(branches, resolve, self.annotations)
        if len(twice) == len(branches):
            raise Unsatisfiable(f"json_schema: keyword 'oneOf' at {path}: each branch stands twice, so no value "
                                "satisfies exactly one")
        if len(branches) > EXCLUSIVE_BRANCHES:  # each pair is compared
            raise overlap
        apart = Apart(self.merger, self.validator_for, strict=not self.spec)
        broken: dict[int, list] = {}
        out, first_error, refused, unwritable = [], None, False, None
        for i, branch in enumerate(branches):
            where = f"{path}.oneOf[{i}]"
            if i in twice:
                continue
            try:
                mine = self.merger.merge_all(rest, [branch], where, named=True)
                needs: list[list] = []
                for j, other in enumerate(branches):
                    if j == i or apart.apart(mine, other):
                        continue
                    if self.spec:
                        if j not in broken:
                            broken[j] = complement(other, resolve)
                        # the ways to fail ``other`` that this branch's values can take (exact: a
                        # way no value of the branch takes adds none; ansible-lint's rulebook
                        # throttle, a oneOf of required sets that all require one key: "that key
                        # absent" fails each, but no value of any branch; 6 combinations -> 2)
                        open_ = [c for c in broken[j] if not apart.apart(mine, c)]
                        needs.append(open_ or broken[j])
                    else:
                        needs.append(apart.breakers(mine, other, resolve))
                    if not needs[-1]:
                        break
                if needs and not needs[-1] and self.spec and self._accepts_all(other):
                    continue  # every value of this branch satisfies that one: none is written (exact)
                needs = list({json.dumps(n, sort_keys=True, default=str): n for n in needs}.values())
                if not all(needs) or self.spec and math.prod(len(n) for n in needs) > EXCLUSIVE_CHOICES:
                    # no schema says where another branch fails (or too many: each choice converts the
                    # branch again, a pod spec 64 times ran out of memory): strict mode leaves the
                    # branch out (a subset), spec mode refuses what it would write only in part
                    if self.spec:
                        refused = True
                        break
                    continue
                final = self._with_breakers(branch, rest, needs, where)
                if not self.spec:
                    # The proofs by what strict mode writes hold for the branch as it was; a schema
                    # added to fail one branch may write a key another requires ("y" present with a
                    # value one branch rejects): prove those again, adding their breakers, or leave
                    # the branch out.
                    broken_by = {j for j in range(len(branches)) if j != i and not apart.apart(mine, branches[j])}
                    for _ in range(EXCLUSIVE_ROUNDS + 1):
                        late = [j for j in range(len(branches))
                                if j != i and j not in broken_by and not apart.apart(final, branches[j])]
                        if not late:
                            break
                        more = [apart.breakers(final, branches[j], resolve) for j in late]
                        if not all(more):
                            break
                        broken_by.update(late)
                        needs = list({json.dumps(n, sort_keys=True, default=str): n for n in needs + more}.values())
                        final = self._with_breakers(branch, rest, needs, where)
                    if late:
                        continue
                out.append(self.convert(final, where))
            except UnsupportedSchemaError as exc:
                first_error = first_error or exc
                if not isinstance(exc, NoOutput):
                    unwritable = unwritable or exc
        if refused:
            raise overlap
        if out:
            return _alt(out)
        if unwritable is not None:
            # a branch treadle cannot write, whatever the others' errors: no proof that no value
            # satisfies exactly one (ansible-lint's rule names, a oneOf of a list and a pattern
            # whose difference was too long to write, was "Unsatisfiable" and its keys left out)
            raise unwritable
        if isinstance(first_error, NoOutput):
            # a proof only where each branch was written exactly where the others fail: the spec
            # mode's complements, each listing every way to fail (strict mode's breakers are cut)
            exact = self.spec and all(complement_exact(b, resolve, self.annotations) for b in branches)
            raise (Unsatisfiable if exact else CannotWrite)(
                f"json_schema: keyword 'oneOf' at {path}: no value treadle can write satisfies exactly one branch "
                f"({first_error})") from first_error
        raise first_error or overlap

    def _with_breakers(self, branch: Any, rest: dict, needs: list[list], where: str) -> dict:
        """``rest``, ``branch`` and, per list of ``needs``, any of its schemas; past
        ``EXCLUSIVE_CHOICES`` combinations the last of the longest list go (a subset)."""
        needs = [list(n) for n in needs]
        while math.prod(len(n) for n in needs) > EXCLUSIVE_CHOICES:  # the least narrowing kept
            max(needs, key=len).pop()
        parts = [branch] + [n[0] if len(n) == 1 else {"anyOf": n} for n in needs]
        return self.merger.merge_all(rest, parts, where)

    def _accepts_all(self, branch: Any) -> bool:
        """Whether ``branch`` is ``true`` or annotations only (after pure refs): every value is valid."""
        node = self._follow(branch, "$")
        return node is True or isinstance(node, dict) and self._annotations_only(node)

    def _combined_branches(self, branches: list, rest: dict, path: str) -> list[str]:
        """spec mode: outputs that satisfy two or more anyOf branches at once.

        Only where unevaluated* sits beside the anyOf: there a member that a second
        matching branch evaluates is valid, which no single branch generates. Each
        combination is an allOf of those branches (sound: they all pass, and branches
        not in it that pass too only evaluate more). One that cannot be built is skipped.
        """
        if not any(k in rest for k in ("unevaluatedProperties", "unevaluatedItems")):
            return []
        if not 2 <= len(branches) <= ANYOF_COMBINED_MAX:
            return []
        out = []
        for n in range(2, len(branches) + 1):
            for chosen in itertools.combinations(range(len(branches)), n):
                where = f"{path}.anyOf{list(chosen)}"
                try:
                    merged = self.merger.merge_all(rest, [branches[i] for i in chosen], where)
                    out.append(self.convert(merged, where))
                except UnsupportedSchemaError:
                    continue
        return out

    def _check_exclusive(self, branches: list, rest: dict, path: str) -> bool:
        """oneOf is anyOf only when no value can satisfy two branches: prove it by types, or
        for objects by a required property whose listed values differ (a discriminated union,
        ``_tags``).

        Returns True when the branches are all literals (enum/const), which are then
        checked value by value instead."""
        if len(branches) == 1:
            return False
        seen: set[str] = set()
        tagged: list[dict[str, frozenset]] = []  # the object branches so far: their tags
        keyed: list[tuple[frozenset, Any]] = []  # ... and their required keys and the keys they forbid
        for i, branch in enumerate(branches):
            types = schema_types(self.merger, branch) & schema_types(self.merger, rest)
            tags = self._tags(branch) if "object" in types else {}
            keys = self._keys(branch) if "object" in types else (frozenset(), _forbids_none)
            overlap = types & seen
            if overlap == {"object"} and all(any(k in t and not (t[k] & v) for k, v in tags.items())
                                             or any(keys[1](k) for k in req) or any(forbids(k) for k in keys[0])
                                             for t, (req, forbids) in zip(tagged, keyed)):
                # a discriminated union: a required tag tells the objects apart, or a key one of
                # the two requires that the other (closed, additionalProperties false) forbids
                overlap = set()
            if overlap:
                if all(isinstance(b, dict) and ("enum" in b or "const" in b) for b in branches):
                    return True
                raise UnsupportedSchemaError(
                    f"json_schema: keyword 'oneOf' at {path} is not supported: branch {i} may overlap "
                    "an earlier branch (only branches of disjoint types, or objects told apart by a "
                    "required property's const/enum values or by a required key the other branch's "
                    "additionalProperties: false forbids, are supported)"
                )
            seen |= types
            if "object" in types:
                tagged.append(tags)
                keyed.append(keys)
        return False

    def _branch_node(self, branch: Any) -> Any:
        """An object branch as ``_keys`` and ``_tags`` read it: pure ``$ref``s followed, and so is
        a ``$ref`` with only ``required`` beside it, those keys added to its target's own (exact:
        the two hold together). ``_tag_required`` writes one of those for each ``$ref`` branch of
        a union beside a ``discriminator`` (an annotation, which must not make a oneOf whose
        targets are told apart by their tags look unproven, and be refused beside
        unevaluatedProperties)."""
        if isinstance(branch, dict) and "$ref" in branch and isinstance(branch.get("required"), list) \
                and self._annotations_only({k: v for k, v in branch.items() if k not in ("$ref", "required")}):
            node = self._follow({"$ref": branch["$ref"]}, "$")
            own = node.get("required", []) if isinstance(node, dict) else None
            if isinstance(own, list):
                return {**node, "required": list(dict.fromkeys([*own, *branch["required"]]))}
            return node
        return self._follow(branch, "$")

    def _keys(self, branch: Any) -> tuple[frozenset, Any]:
        """An object branch's own required keys, and a test of the keys no object valid under it
        can hold (json_schema_logic.closed_forbids). Refs are followed; other branches give nothing."""
        node = self._branch_node(branch)
        if not isinstance(node, dict):
            return frozenset(), _forbids_none
        required = node.get("required", [])
        required = frozenset(k for k in required if isinstance(k, str)) if isinstance(required, list) else frozenset()
        return required, closed_forbids(node)

    def _tags(self, branch: Any) -> dict[str, frozenset]:
        """Required properties of an object branch whose values are listed (const / enum of
        scalars): name -> their ``_scalar_key``s. Refs are followed; anything else gives no tags."""
        node = self._branch_node(branch)
        if not isinstance(node, dict) or not isinstance(node.get("properties"), dict):
            return {}
        out = {}
        for name in node.get("required", []):
            prop = self._follow(node["properties"].get(name), "$")
            if isinstance(prop, dict) and ("const" in prop or "enum" in prop):
                values = [prop["const"]] if "const" in prop else prop["enum"]
                keys = [_scalar_key(v) for v in values] if isinstance(values, list) else [None]
                if None not in keys:
                    out[name] = frozenset(keys)
        return out
