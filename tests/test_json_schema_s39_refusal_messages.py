"""A refusal names what the user wrote: a password rule (four lookaheads, one for each class of
character, a common `pattern`) whose automaton is too large to write back as a regex is refused
as the string's pattern, not as "a key set" the schema never had."""

from __future__ import annotations

import pytest

from treadle.constrained import GrammarSpec

PASSWORD = r"^(?=.*[a-z])(?=.*[A-Z])(?=.*\d)(?=.*[@$!%*?&])[A-Za-z\d@$!%*?&]{8,}$"


@pytest.mark.parametrize("schema", [{"type": "string", "pattern": PASSWORD},
                                    {"type": "object", "properties": {"password": {"type": "string", "pattern": PASSWORD,
                                                                                   "maxLength": 64}}}])
def test_a_value_pattern_too_long_to_write_is_refused_as_that_pattern(schema):
    with pytest.raises(ValueError) as err:
        GrammarSpec.from_params(json_schema=schema).to_regex(holes=True)
    msg = str(err.value)
    assert "keyword 'pattern'" in msg
    assert "key set" not in msg, msg
    assert "20000 characters" in msg or "20,000 characters" in msg, msg
