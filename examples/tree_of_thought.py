"""Tree of thought with nested forks: two plans, two continuations of each, every leaf
judged with `select`. Forks share their parent's KV through the radix cache."""
from __future__ import annotations

from treadle.lang import function, gen, select


INSTRUCTIONS = (
    "You are a careful math tutor. For each question, first write a short plan that names the quantities "
    "involved and the operation that combines them. Then write a solution that follows the plan and ends "
    "with the final number. Keep every line short. Check units, do not skip steps, and prefer simple "
    "arithmetic over guessing. A judge then reads each solution and says whether it is correct.\n"
    "Example question: A box holds 6 eggs. How many eggs are in 5 boxes?\n"
    "Plan: multiply eggs per box by the number of boxes.\n"
    "Solution: 6 * 5 = 30 eggs.\n"
    "Is this solution correct? yes\n\n"
)


@function
def tree_of_thought(s, question, width=2):
    s += INSTRUCTIONS
    s += f"Question: {question}\nLet's think step by step.\n"
    plans = s.fork(width)
    for i, p in enumerate(plans):
        p += f"Plan {i + 1}:" + gen("plan", max_tokens=16, stop="\n") + "\n"
        steps = p.fork(width)
        for st in steps:
            st += "Solution:" + gen("solution", max_tokens=16, stop="\n")
            st += "\nIs this solution correct? " + select("verdict", ["yes", "no"])
        p += steps.join()
    s += plans.join()


QUESTION = "A farmer has 3 pens with 4 sheep each. How many sheep are there?"


def main() -> None:
    from common import close, setup

    backend, _ = setup(__doc__)
    st = tree_of_thought.run(question=QUESTION, temperature=0.8)
    for plan, solutions, verdicts in zip(st["plan"], st["solution"], st["verdict"]):
        print(f"plan:{plan}")
        for sol, ok in zip(solutions, verdicts):
            print(f"   [{ok:3s}] {sol.strip()}")
    close(backend)


if __name__ == "__main__":
    main()
