"""Two-hop retrieval-augmented QA: retrieve for the question, let the model write a
follow-up search query from what it read, retrieve again, then answer."""
from __future__ import annotations

from retrieval import load_corpus, retrieve

from treadle.lang import function, gen

CORPUS = load_corpus()
QUESTIONS = [
    "In which country was the inventor of the Zorblax engine born?",
    "In which city was the founder of the Quill Observatory born?",
    "Which mountains is the abbey that first made Velmora cheese in?",
]


@function
def multihop(s, question):
    s += ("Answer the question using the passages. Be brief.\n\n"
          "Passage 1: The Tower of Pisa was built by Bonanno Pisano.\n"
          "Question: Where was the builder of the Tower of Pisa born?\n"
          "Next, look up: Bonanno Pisano\n"
          "Passage 2: Bonanno Pisano was a sculptor born in Pisa, Italy.\n"
          "Answer: Pisa, Italy\n\n")
    first = retrieve(question, CORPUS, k=1)[0]
    s += f"Passage 1: {first}\nQuestion: {question}\n"
    # the follow-up query is the name to look up next: a capitalised phrase, enforced by a regex
    s += "Next, look up: " + gen("query", max_tokens=12, regex=r"[A-Z][a-z]+( [A-Z][a-z]+){0,3}")
    second = retrieve(s["query"] + " " + first, CORPUS, k=1, exclude=(first,))[0]
    s += f"\nPassage 2: {second}\nAnswer: " + gen("answer", max_tokens=16, stop=["\n"])


def main() -> None:
    from common import close, setup

    backend, _ = setup(__doc__)
    states = multihop.run_batch([{"question": q} for q in QUESTIONS], temperature=0, progress_bar=False)
    for q, st in zip(QUESTIONS, states):
        print(f"Q: {q}\n   follow-up query: {st['query'].strip()!r}\n   A: {st['answer'].strip()}")
    close(backend)


if __name__ == "__main__":
    main()
