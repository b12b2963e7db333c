"""The `pagedcore` command: generate, chat, serve, bench."""

from __future__ import annotations

import argparse
import logging
import sys

from pagedcore.entrypoints.engine_args import add_engine_args, engine_config_from_args


def _sampling_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--sampling-seed", type=int, default=None, help="seed of this request's sampling")


def _params(args):
    from pagedcore.sampling_params import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.sampling_seed)


def cmd_generate(args) -> int:
    from pagedcore.entrypoints.llm import LLM

    llm = LLM.from_config(engine_config_from_args(args))
    for output in llm.generate(args.prompt, _params(args), use_tqdm=False):
        print(output.outputs[0].text)
    return 0


def cmd_chat(args) -> int:
    from pagedcore.entrypoints.llm import LLM

    llm = LLM.from_config(engine_config_from_args(args))
    messages = [{"role": "system", "content": args.system}] if args.system else []
    print("pagedcore chat: an empty line or Ctrl-D ends the conversation.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        messages.append({"role": "user", "content": line})
        reply = llm.chat(messages, _params(args), use_tqdm=False)[0].outputs[0].text
        print(reply)
        messages.append({"role": "assistant", "content": reply})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pagedcore", description="pagedcore: a paged-KV LLM inference engine")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="generate text for one or more prompts")
    p.add_argument("prompt", nargs="+", help="prompt text (several prompts are batched)")
    p.add_argument("--model", default=None, help="HF folder or .gguf file (default: the bundled SmolLM2-135M-Instruct)")
    add_engine_args(p)
    _sampling_args(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="an interactive chat through the model's chat template")
    p.add_argument("--model", default=None, help="HF folder or .gguf file (default: the bundled model)")
    p.add_argument("--system", default=None, help="a system prompt")
    add_engine_args(p)
    _sampling_args(p)
    p.set_defaults(func=cmd_chat)

    # Imported here, not at the top, so `import pagedcore.cli` stays cheap; each module holds only
    # argparse code. All are in-tree: a broken import is a bug and must surface, not hide a command.
    from pagedcore.benchmarks.cli import add_bench_parser
    from pagedcore.serving.cli import add_serve_parser
    from pagedcore.simulator.cli import add_simulate_parser

    add_serve_parser(sub)
    add_simulate_parser(sub)
    add_bench_parser(sub)

    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
