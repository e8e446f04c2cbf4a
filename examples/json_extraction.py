"""Structured extraction: gen(json_schema=...) makes the runtime emit JSON that matches
the schema, so json.loads never fails."""
from __future__ import annotations

import json

from treadle.lang import assistant, function, gen, user

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "age", "city"],
}
TEXTS = [
    "Maria Lopez, 34, moved to Madrid last spring to work as a nurse.",
    "At 52, Kenji Watanabe still runs his noodle shop in Osaka every day.",
    "Tom Baker is 19 and studies physics in Boston.",
]


@function
def extract(s, text):
    s += user(f"Extract the person's name, age and city as JSON.\nText: {text}")
    s += assistant(gen("person", json_schema=SCHEMA, max_tokens=48))


def main() -> None:
    from common import close, setup

    backend, _ = setup(__doc__)
    for text, st in zip(TEXTS, extract.run_batch([{"text": t} for t in TEXTS], temperature=0, progress_bar=False)):
        print(text, "->", json.loads(st["person"]))
    close(backend)


if __name__ == "__main__":
    main()
