"""A travel guide written against SGLang's frontend API: it runs unchanged on SGLang and on
treadle, only the import line differs.

    import sglang as sgl           # on SGLang
    import treadle as sgl          # on treadle

It uses roles, select, gen_int, gen with a stop string, fork/join, var_scope, a direct call
with sampling keywords, run_batch with a progress bar, and streaming. With no arguments it
starts a server with sgl.Runtime (on treadle, the embedded SmolLM2-135M-Instruct; on SGLang,
pass --model-path) and shuts it down at the end; --url uses a running server instead.

    cd examples && ../.venv/bin/python sglang_travel_guide.py [--url http://127.0.0.1:30000]
"""
import argparse

import treadle as sgl  # on SGLang: import sglang as sgl


@sgl.function
def city_guide(s, city):
    s += sgl.system("You are a concise travel guide. Answer in one short sentence.")
    s += sgl.user(f"Is {city} in Europe or in Asia?")
    s += sgl.assistant(sgl.select("continent", ["Europe", "Asia"]))
    s += sgl.user(f"How many days should a first visit to {city} last? Answer with a number.")
    s += sgl.assistant(sgl.gen_int("days", max_tokens=4))
    s += sgl.user(f"Name one thing to see in {city}.")
    forks = s.fork(2)  # two suggestions, sharing the conversation so far
    forks += sgl.assistant(sgl.gen("sight", max_tokens=24, stop="\n", temperature=0.8))
    forks.join()  # s["sight"] is now a list of two
    with s.var_scope("tip"):
        s += sgl.user(f"One tip for a visitor to {city}?")
        s += sgl.assistant(sgl.gen("tip_text", max_tokens=24, stop="\n"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="a running server (default: start one with sgl.Runtime)")
    parser.add_argument("--model-path", default=None, help="the model sgl.Runtime serves")
    args = parser.parse_args()
    runtime = None
    if args.url:
        sgl.set_default_backend(sgl.RuntimeEndpoint(args.url))
    else:
        runtime = sgl.Runtime(model_path=args.model_path)
        sgl.set_default_backend(runtime)
    try:
        state = city_guide("Paris", temperature=0)  # a direct call runs the program
        print(f"Paris: {state['continent']}, {state['days']} days; sights: {state['sight']}")
        print(f"tip span: {state['tip']!r}")

        states = city_guide.run_batch([{"city": c} for c in ("Tokyo", "Rome", "Seoul")], temperature=0,
                                      progress_bar=True)
        for city, st in zip(("Tokyo", "Rome", "Seoul"), states):
            print(f"{city}: {st['continent']}, {st['days']} days; tip: {st['tip_text'].strip()}")

        print("streamed:")
        state = city_guide.run(city="Lisbon", stream=True, temperature=0)
        for chunk in state.text_iter("tip_text"):
            print(chunk, end="", flush=True)
        print()
    finally:
        if runtime is not None:
            runtime.shutdown()


if __name__ == "__main__":
    main()
