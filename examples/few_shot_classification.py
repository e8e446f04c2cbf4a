"""Few-shot sentiment classification with `select`: every review shares the same few-shot
prefix, which run_batch caches once; each label is scored from prompt logprobs."""
from __future__ import annotations

from treadle.lang import function, select

EXAMPLES = [
    ("An absolute joy from start to finish.", "positive"),
    ("I walked out halfway, it was that dull.", "negative"),
    ("The acting was superb and the story moving.", "positive"),
    ("A waste of money and two hours of my life.", "negative"),
    ("Charming, funny and beautifully shot.", "positive"),
    ("The plot made no sense and the jokes fell flat.", "negative"),
]
REVIEWS = [
    ("I laughed and cried, a wonderful film.", "positive"),
    ("Boring, predictable and far too long.", "negative"),
    ("One of the best movies I have seen this year.", "positive"),
    ("Terrible dialogue and awful acting.", "negative"),
    ("A delightful, heartwarming story.", "positive"),
    ("I hated it and want my money back.", "negative"),
    ("Brilliant performances all around.", "positive"),
    ("Painfully slow and completely forgettable.", "negative"),
]


@function
def classify(s, review):
    s += "Classify each movie review as positive or negative.\n\n"
    for text, label in EXAMPLES:
        s += f"Review: {text}\nSentiment: {label}\n\n"
    s += f"Review: {review}\nSentiment:"
    s += select("label", [" positive", " negative"])


def main() -> None:
    from common import close, setup

    backend, _ = setup(__doc__)
    states = classify.run_batch([{"review": r} for r, _ in REVIEWS], progress_bar=False)
    correct = 0
    for (review, gold), st in zip(REVIEWS, states):
        label = st["label"].strip()
        correct += label == gold
        print(f"{label:9s} (gold {gold:9s}) {review}")
    print(f"accuracy: {correct}/{len(REVIEWS)}")
    close(backend)


if __name__ == "__main__":
    main()
