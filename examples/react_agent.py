"""A ReAct agent: at each step the model picks an action with `select`, fills the tool's
arguments as schema-constrained JSON, and reads the tool's observation."""
from __future__ import annotations

import json
import re

from retrieval import load_corpus, retrieve

from treadle.lang import function, gen, select

CORPUS = load_corpus()
ARGS_SCHEMA = {"type": "object", "properties": {"input": {"type": "string", "maxLength": 40}}, "required": ["input"]}


def run_tool(action: str, arg: str) -> str:
    if action == "search":
        return retrieve(arg, CORPUS, k=1)[0]
    if action == "calculate":
        if not re.fullmatch(r"[0-9+\-*/(). ]{1,40}", arg):
            return "error: only arithmetic is allowed"
        return str(eval(arg, {"__builtins__": {}}))  # restricted to digits and operators above
    raise ValueError(f"unknown action {action!r}")


@function
def agent(s, question, max_steps=3):
    s += ("Answer the question. Tools: search (look up a fact), calculate (arithmetic), finish (give the answer).\n"
          "Each step: Action: <tool> Args: {\"input\": ...}\n\n"
          "Question: How tall is Mount Kilimanjaro in km?\n"
          "Action: search Args: {\"input\": \"Mount Kilimanjaro height\"}\n"
          "Observation: Mount Kilimanjaro in Tanzania is the highest mountain in Africa, rising about 5,895 metres.\n"
          "Action: calculate Args: {\"input\": \"5895 / 1000\"}\n"
          "Observation: 5.895\n"
          "Action: finish Args: {\"input\": \"about 5.9 km\"}\n\n")
    s += f"Question: {question}\n"
    for step in range(max_steps):
        s += "Action: " + select(f"action_{step}", ["search", "calculate", "finish"])
        s += " Args: " + gen(f"args_{step}", json_schema=ARGS_SCHEMA, max_tokens=24)
        arg = json.loads(s[f"args_{step}"])["input"]
        if s[f"action_{step}"] == "finish":
            return
        s += f"\nObservation: {run_tool(s[f'action_{step}'], arg)}\n"


QUESTIONS = ["Who invented the Zorblax engine?", "What is 17 * 23?"]


def main() -> None:
    from common import close, setup

    backend, _ = setup(__doc__)
    for q, st in zip(QUESTIONS, agent.run_batch([{"question": q} for q in QUESTIONS], temperature=0,
                                                progress_bar=False)):
        print(st.text().split("\n\n")[-1])
        print("-" * 40)
    close(backend)


if __name__ == "__main__":
    main()
