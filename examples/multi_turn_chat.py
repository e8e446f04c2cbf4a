"""A multi-turn chat: roles rendered through the model's chat template; each turn's prompt
extends the previous one, so the radix cache serves the whole history."""
from __future__ import annotations

from treadle.lang import assistant, function, gen, system, user


@function
def chat(s, questions):
    s += system("You are a helpful assistant. Answer in one short sentence.")
    for i, q in enumerate(questions):
        s += user(q)
        s += assistant(gen(f"answer_{i}", max_tokens=24, stop="\n"))


QUESTIONS = ["What is the capital of Italy?", "What is a famous food from there?", "Is it healthy?"]


def main() -> None:
    from common import close, setup

    backend, _ = setup(__doc__)
    st = chat.run(questions=QUESTIONS, temperature=0)
    for m in st.messages():
        print(f"{m['role']:>9}: {m['content']}")
    last = st.get_meta_info(f"answer_{len(QUESTIONS) - 1}")
    print(f"last turn: {last['cached_tokens']} of {last['prompt_tokens']} prompt tokens came from the cache")
    close(backend)


if __name__ == "__main__":
    main()
