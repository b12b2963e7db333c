"""`pagedcore serve [MODEL]`: the flags (vLLM's names where vLLM has them) and their checks."""

from __future__ import annotations

import argparse
import os

from pagedcore.config import parse_memory_size
from pagedcore.entrypoints.engine_args import add_engine_args, engine_config_from_args
from pagedcore.serving.transport_args import add_transport_args, check_transport_args
from pagedcore.structured_output.limits import DEFAULT_COMPILE_TIMEOUT_S
from pagedcore.structured_output.limits import DEFAULT_MAX_BYTES as DEFAULT_MAX_CONSTRAINT_BYTES

DEFAULT_PORT = 8000
DEFAULT_GRPC_PORT = 8033
DEFAULT_MAX_BODY = 4 << 20


def _byte_size(text: str) -> int:
    value = parse_memory_size(text)
    if isinstance(value, float):
        raise argparse.ArgumentTypeError(f"{text!r} is a fraction; give bytes or a size like 4MiB")
    return value


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve", help="serve a model over the OpenAI HTTP API and TGIS gRPC",
        description="Serve one model over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, "
                    "/v1/models, /tokenize, /detokenize, /health, /metrics, /version) and the TGIS gRPC protocol "
                    "(fmaas.GenerationService), from one process and one engine. SIGTERM or Ctrl-C drains: "
                    "requests in flight finish, new ones get 503, then the server exits 0.")
    p.add_argument("model", nargs="?", default=None,
                   help="HF folder or .gguf file; leave out for the bundled SmolLM2-135M-Instruct")
    p.add_argument("--model", dest="model_option", default=None, metavar="MODEL",
                   help="the same as the positional MODEL (vLLM accepts both)")
    add_engine_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to listen on, HTTP and gRPC (default 127.0.0.1: this machine only; 0.0.0.0 or :: for others)")
    g.add_argument("--port", type=int, default=DEFAULT_PORT, help="HTTP port of the OpenAI-compatible API (default 8000)")
    g.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT, help="gRPC (TGIS) port (default 8033); 0 turns gRPC off")
    g.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="model name(s) clients send in 'model'; the first is reported in responses "
                        "(default: the model argument, or the bundled model's file name)")
    g.add_argument("--api-key", action="extend", nargs="+", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize and gRPC calls; "
                        "several keys: --api-key K1 K2, --api-key K1 --api-key K2 or K1,K2 (vLLM's forms); "
                        "PAGEDCORE_API_KEY adds more. "
                        "/health, /metrics and /version stay open")
    g.add_argument("--lora-modules", nargs="+", action="extend", default=None, metavar="NAME=PATH",
                   help="LoRA adapters to serve (with --enable-lora): name=path, or vLLM's JSON form "
                        '\'{"name": "sql", "path": "/adapters/sql", "base_model_name": "..."}\'; clients pick one '
                        "by sending its name as 'model' (OpenAI) or 'adapter_id' (gRPC)")
    g.add_argument("--chat-template", default=None, metavar="FILE_OR_JINJA",
                   help="chat template for /v1/chat/completions: a file, or the Jinja text itself "
                        "(default: the model's own)")
    g.add_argument("--max-queued-requests", type=int, default=1024,
                   help="most requests waiting for a place in the batch (default 1024); past it new requests "
                        "get 429 (gRPC: RESOURCE_EXHAUSTED)")
    g.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds that requests in flight get to finish after SIGTERM/SIGINT before they are aborted "
                        "(default 30)")
    g.add_argument("--max-request-body-bytes", type=_byte_size, default=DEFAULT_MAX_BODY, metavar="BYTES",
                   help="largest HTTP request body accepted, in bytes or a size like 8MiB (default 4MiB); larger "
                        "gets 413")
    g.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"],
                   help="log level of the HTTP server (default info, which logs every request)")
    g.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='let chat requests use tool_choice "auto" (the default when tools are given): the model '
                        "decides whether to call a tool, and the reply is parsed by --tool-call-parser")
    g.add_argument("--tool-call-parser", default=None, choices=["hermes"],
                   help="how tool calls are found in the reply with --enable-auto-tool-choice: hermes = "
                        "<tool_call>{...}</tool_call> (Hermes, Qwen2.5, and models trained on that format)")
    g.add_argument("--structured-outputs-max-bytes", type=_byte_size, default=DEFAULT_MAX_CONSTRAINT_BYTES,
                   metavar="BYTES",
                   help="largest constraint (JSON schema, regex, grammar, choices; tools with tool_choice required "
                        "or named) a request may send, in bytes or a size like 256KiB (default 128KiB); larger "
                        "gets 400 / INVALID_ARGUMENT")
    g.add_argument("--structured-outputs-compile-timeout", type=float, default=DEFAULT_COMPILE_TIMEOUT_S,
                   metavar="SECONDS",
                   help="longest a constraint may take to compile (default 10); one that takes longer gets 400 / "
                        "INVALID_ARGUMENT and is refused from then on")
    # On by default: the live simulator at / is what a person opens first. The ring is bounded (4096
    # steps) and the cost is measured by bench/bench_trace.py (docs/simulator.md).
    g.add_argument("--enable-trace", dest="enable_trace", action="store_true", default=True,
                   help="record the engine's per-step trace for the live simulator page at / (the default)")
    g.add_argument("--disable-trace", dest="enable_trace", action="store_false",
                   help="record no per-step trace: the simulator page then only replays trace files and runs "
                        "simulations")
    g.add_argument("--trace-file", default=None, metavar="FILE",
                   help="also write the per-step trace as JSONL to FILE; the simulator page can replay it")
    add_transport_args(p.add_argument_group("transport security and CORS"))
    p.set_defaults(func=cmd_serve)
    return p


def parse_lora_modules(values: list[str] | None) -> list:
    """--lora-modules entries -> LoRARequests with ids 1..n, in the order given."""
    import json

    from pagedcore.lora import LoRARequest

    requests = []
    for i, value in enumerate(values or [], start=1):
        if value.lstrip().startswith("{"):
            try:
                spec = json.loads(value)
            except ValueError as e:
                raise ValueError(f"--lora-modules {value!r} is not valid JSON ({e})") from None
            if not isinstance(spec, dict) or not spec.get("name") or not spec.get("path"):
                raise ValueError(f"--lora-modules {value!r}: the JSON form needs \"name\" and \"path\"")
            requests.append(LoRARequest(spec["name"], i, spec["path"], spec.get("base_model_name")))
        else:
            name, sep, path = value.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"--lora-modules {value!r}: write name=path (or the JSON form)")
            requests.append(LoRARequest(name, i, path))
    names = [r.lora_name for r in requests]
    if len(set(names)) != len(names):
        raise ValueError(f"--lora-modules names an adapter twice: {names}")
    return requests


def served_names(args, model: str | None) -> list[str]:
    if args.served_model_name:
        return list(args.served_model_name)
    if model is not None:
        return [model]
    from pagedcore.loader import default_model_path

    return [os.path.splitext(os.path.basename(default_model_path()))[0]]


def cmd_serve(args) -> int:
    from pagedcore.serving import server
    from pagedcore.serving.auth import parse_api_keys
    from pagedcore.serving.openai.chat_template import load_chat_template
    from pagedcore.serving.state import ServerState
    from pagedcore.structured_output.limits import ConstraintLimits

    if args.model and args.model_option and args.model != args.model_option:
        raise ValueError(f"two models given ({args.model!r} and --model {args.model_option!r}); give one")
    model = args.model or args.model_option
    for flag, value in (("--port", args.port), ("--grpc-port", args.grpc_port)):
        if not 0 <= value <= 65535:
            raise ValueError(f"{flag} {value} is not a TCP port; use 1..65535 (0: any free port)")
    if args.max_queued_requests < 1:
        raise ValueError(f"--max-queued-requests must be >= 1, got {args.max_queued_requests}")
    if args.shutdown_timeout < 0:
        raise ValueError(f"--shutdown-timeout must be >= 0 seconds, got {args.shutdown_timeout}")
    if args.trace_file and not args.enable_trace:
        raise ValueError("--trace-file needs the trace: drop --disable-trace")
    config = engine_config_from_args(args, model=model, enable_trace=args.enable_trace)
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser (hermes)")
    try:
        limits = ConstraintLimits(args.structured_outputs_max_bytes, args.structured_outputs_compile_timeout)
    except ValueError:
        raise ValueError("--structured-outputs-max-bytes and --structured-outputs-compile-timeout must be positive, "
                         f"got {args.structured_outputs_max_bytes} and {args.structured_outputs_compile_timeout}") \
            from None
    cors = check_transport_args(args)
    state = ServerState(served_model_names=served_names(args, model), cors=cors,
                        max_request_body_bytes=args.max_request_body_bytes, api_keys=parse_api_keys(args.api_key),
                        enable_auto_tool_choice=args.enable_auto_tool_choice,
                        tool_call_parser=args.tool_call_parser, constraint_limits=limits,
                        lora_modules=parse_lora_modules(args.lora_modules))
    if state.lora_modules and not config.enable_lora:
        raise ValueError("--lora-modules needs --enable-lora")
    try:
        return server.run(args, config, state, load_chat_template(args.chat_template))
    except OSError as error:
        raise ValueError(str(error)) from None
