"""``ardea serve MODEL_DIR``: a model directory or a run's checkpoint behind the
OpenAI-compatible server, recording every call; the trajectories go to a file on exit.

The server binds 127.0.0.1 unless ``--host`` says otherwise. History defaults to
``keep_tokens`` here: agent frameworks rewrite their own turns in many ways, and that policy
keeps every conversation one row of exactly the tokens the model saw and produced. On
Ctrl-C (or SIGTERM) the server stops and writes one JSON object per trajectory: its
segments (kind, token ids, text; generated ones with log-probs, version and turn), reward,
group id, ``no_eos`` and ``rewritten_turns`` (turns whose text the agent replaced before
sending them back, trained as the model generated them).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ardea.errors import ArdeaError


def add_serve_parser(sub) -> None:
    from ardea.config.agent import EXPORT_STYLES, HISTORY_POLICIES

    serve = sub.add_parser(
        "serve",
        help="serve a model over the OpenAI API, recording every call as trajectories",
        description="Serve a run, checkpoint or model directory on an OpenAI-compatible "
        "endpoint (/v1/chat/completions, /v1/responses, /v1/models, /v1/rewards); on "
        "Ctrl-C write the recorded trajectories to --out.",
    )
    serve.add_argument("path", help="run, checkpoint or Hugging Face model directory")
    serve.add_argument("args", nargs="*", help="config overrides, e.g. rollout.engine=vllm "
                       "(with --tinker: rollout.vllm.* only)")  # fmt: skip
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    serve.add_argument("--port", type=int, default=8000, help="port (0: any free one)")
    serve.add_argument("--out", default="trajectories.jsonl", help="where trajectories go on exit")
    serve.add_argument(
        "--history",
        default="keep_tokens",
        choices=HISTORY_POLICIES,
        help="what a request whose history was rewritten does (agent.history)",
    )
    serve.add_argument("--export", default="conversation", choices=EXPORT_STYLES,
                       help="one row per conversation or per call")  # fmt: skip
    serve.add_argument("--tool-parser", default="auto",
                       help="the model's tool-call format (agent.tool_parser); auto: from its "
                       "chat template")  # fmt: skip
    serve.add_argument("--max-tokens", type=int, default=256, help="default max_tokens of a reply")
    serve.add_argument("--temperature", type=float, default=1.0, help="default temperature")
    _add_safety(serve)
    _add_tinker(serve)


def _add_safety(serve) -> None:
    safety = serve.add_argument_group("who may call, and how much (both APIs)")
    safety.add_argument("--api-key", default=os.environ.get("ARDEA_API_KEY"),
                        help="require this key (X-API-Key or Authorization: Bearer); default "
                        "$ARDEA_API_KEY; needed to bind beyond loopback")  # fmt: skip
    safety.add_argument("--max-request-mb", type=float, default=None,
                        help="largest request body, after decompression (default 8; 64 with "
                        "--tinker)")  # fmt: skip
    safety.add_argument(
        "--max-in-flight",
        type=int,
        default=256,
        help="requests served at once; more are answered 429 (retry)",
    )


def _add_tinker(serve) -> None:
    from ardea.config.schema import COMPUTE_DTYPES, DTYPES

    tinker = serve.add_argument_group("the Tinker API (--tinker)")
    tinker.add_argument("--tinker", action="store_true",
                        help="serve the Tinker training API (tinker SDK, tinker-cookbook) "
                        "instead of the OpenAI one: LoRA training clients on this base model")  # fmt: skip
    tinker.add_argument("--name", default=None,
                        help="the base_model name clients ask for (default: the directory's "
                        "name; its path is always accepted too)")  # fmt: skip
    tinker.add_argument("--state-dir", default="tinker-state",
                        help="where save_state and save_weights_for_sampler write (kept "
                        "across restarts: load_state reads them back)")  # fmt: skip
    tinker.add_argument("--device", default="auto",
                        help="where LoRA training and sampling run: auto (cuda when there "
                        "is one), cpu, cuda, cuda:N")  # fmt: skip
    tinker.add_argument("--engine", default="in_process",
                        help="the rollout.engine samplers decode on: in_process (an engine "
                        "per set of sampler weights, in this process) or vllm (a vLLM "
                        "server the samplers share, LoRA adapters synced alone; "
                        "rollout.vllm.* overrides as in ardea train, a server launched "
                        "unless rollout.vllm.urls names yours)")  # fmt: skip
    tinker.add_argument("--dtype", default=None, choices=DTYPES,
                        help="parameter dtype (model.dtype; default: the run's, else "
                        "float32)")  # fmt: skip
    tinker.add_argument("--compute-dtype", default=None, choices=COMPUTE_DTYPES,
                        help="the dtype forwards compute in (model.compute_dtype; default: "
                        "the run's, else auto: measured at start)")  # fmt: skip
    tinker.add_argument("--samplers", type=int, default=3,
                        help="sampler weights kept loaded at once (oldest unloaded first)")  # fmt: skip
    tinker.add_argument(
        "--max-sample-tokens",
        type=int,
        default=2**18,
        help="num_samples x max_tokens of one sample request",
    )
    tinker.add_argument(
        "--max-sampling-in-flight",
        type=int,
        default=2**20,
        help="num_samples x max_tokens summed over unfinished sample requests",
    )
    tinker.add_argument(
        "--max-queued",
        type=int,
        default=32,
        help="requests of one training model waiting or running",
    )


def serve(args: argparse.Namespace) -> int:
    from ardea.cli.commands import _load_for_inference

    _check(args)
    if args.tinker:
        return serve_tinker(args)
    _, model_dir, tokenizer, engine = _load_for_inference(args.path, list(args.args))
    from ardea.agent import RecordingClient
    from ardea.agent.server import ChatServer

    parser = args.tool_parser
    if parser == "auto":
        from ardea.agent.tool_parsers import detect_tool_parser

        try:
            parser = detect_tool_parser(tokenizer)
        except ArdeaError as exc:
            parser = "hermes"
            print(f"ardea serve: {exc}; using hermes (--tool-parser to choose)", file=sys.stderr)
    client = RecordingClient(
        engine, tokenizer, max_tokens=args.max_tokens, temperature=args.temperature,
        history=args.history, tool_parser=parser,
    )  # fmt: skip
    server = ChatServer(client, host=args.host, port=args.port, limits=_limits(args, 8))
    out = Path(args.out)
    banner = (f"ardea serve: {model_dir} at {server.url} (history={args.history}); "
              f"Ctrl-C to stop and write {out}")  # fmt: skip
    try:
        serve_until_stopped(server, banner)
    finally:
        rows = client.export(style=args.export)
        _write(out, rows, tokenizer)
        print(f"ardea serve: wrote {len(rows)} trajectories of {len(client.interactions)} "
              f"calls to {out} ({client.orphans} undelivered calls left out, "
              f"{client.tool_choice_unmet} replies without a required tool call, "
              f"{client.rewritten_turns_kept} rewritten turns kept as generated)", flush=True)  # fmt: skip
    return 0


def serve_tinker(args: argparse.Namespace) -> int:
    """``ardea serve --tinker``: the Tinker API on the model directory of ``args.path``."""
    from ardea.cli.commands import quiet_transformers, resolve_model_dir

    if args.samplers < 1:
        raise ArdeaError(f"--samplers {args.samplers}: must be >= 1")
    model_dir, run_config = resolve_model_dir(args.path)
    engine_options, dtype, compute_dtype = tinker_config(args, run_config)
    name = args.name or Path(model_dir).name
    from ardea.trainer.setup import resolve_device

    try:
        resolve_device(args.device, "--device")
    except ValueError as exc:
        raise ArdeaError(str(exc)) from None
    quiet_transformers()
    from ardea.service.tinker_fields import TinkerLimits
    from ardea.service.tinker_server import TinkerServer

    work = TinkerLimits(max_sample_tokens=args.max_sample_tokens, max_queued=args.max_queued,
                        max_sampling_in_flight=args.max_sampling_in_flight)  # fmt: skip
    limits = _limits(args, 64)
    server = TinkerServer({name: model_dir}, state_dir=args.state_dir, host=args.host,
                          port=args.port, samplers=args.samplers, device=args.device,
                          limits=limits, work=work, engine=args.engine,
                          engine_options=engine_options, dtype=dtype,
                          compute_dtype=compute_dtype)  # fmt: skip
    serve_until_stopped(server, f"ardea serve --tinker: {model_dir} as base_model {name!r} at "
                        f"{server.url} (states in {args.state_dir}, sampling on "
                        f"{args.engine}); Ctrl-C to stop")  # fmt: skip
    return 0


def tinker_config(args: argparse.Namespace, run_config) -> tuple[dict[str, Any], str, str]:
    """The engine's options (``rollout.vllm`` with the command line's overrides: a launched
    server unless ``rollout.vllm.urls`` names one), parameter and compute dtypes (the
    flags', else the run's, else ardea's defaults)."""
    import dataclasses

    wrong = [o for o in args.args if not o.startswith("rollout.vllm.")]
    if wrong or (args.args and args.engine != "vllm"):
        raise ArdeaError(f"ardea serve --tinker takes rollout.vllm.* overrides (with --engine "
                         f"vllm) and no others, got {args.args}")  # fmt: skip
    from ardea.config import load_config
    from ardea.rollout import engine_factory

    engine_factory(args.engine)  # an unknown engine lists the known ones
    model = load_config(run_config, []).model
    options: dict[str, Any] = {}
    if args.engine == "vllm":
        overrides = ["rollout.engine=vllm", *args.args]
        if not any(o.startswith(("rollout.vllm.urls=", "rollout.vllm.launch=")) for o in args.args):
            overrides.append("rollout.vllm.launch=true")
        options = dataclasses.asdict(load_config(None, overrides).rollout.vllm)
    return options, args.dtype or model.dtype, args.compute_dtype or model.compute_dtype


def serve_until_stopped(server, banner: str) -> None:
    """Start ``server``, print ``banner``, serve until Ctrl-C or SIGTERM, then stop it."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.start()
    print(banner, flush=True)
    try:
        while not stop.wait(0.2):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop()


def _limits(args: argparse.Namespace, default_mb: float):
    """The HTTP layer's limits of the command line (``--max-request-mb`` defaults to
    ``default_mb``)."""
    from ardea.agent.http_guard import ServerLimits

    mb = default_mb if args.max_request_mb is None else args.max_request_mb
    return ServerLimits(max_body_bytes=int(mb * 2**20), max_in_flight=args.max_in_flight,
                        api_key=args.api_key)  # fmt: skip


def _check(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ArdeaError(f"--port {args.port}: a port is 0..65535 (0: any free one)")
    if args.max_tokens < 1:
        raise ArdeaError(f"--max-tokens {args.max_tokens}: must be >= 1")
    if not 0.0 <= args.temperature <= 2.0:
        raise ArdeaError(f"--temperature {args.temperature}: must be in [0, 2]")
    if args.max_request_mb is not None and not args.max_request_mb * 2**20 >= 1:
        raise ArdeaError(f"--max-request-mb {args.max_request_mb}: must be > 0")
    for flag in ("max_in_flight", "max_sample_tokens", "max_sampling_in_flight", "max_queued"):
        if getattr(args, flag) < 1:
            raise ArdeaError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be >= 1")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        if not args.api_key:
            raise ArdeaError(f"--host {args.host} is reachable from other machines: give an "
                             "--api-key (or $ARDEA_API_KEY), or bind 127.0.0.1")  # fmt: skip
        print(f"ardea serve: binding {args.host}: reachable from other machines (the API key "
              "is required)", file=sys.stderr)  # fmt: skip


def trajectory_record(row, tokenizer) -> dict[str, Any]:
    """One trajectory as plain JSON (module docstring)."""
    segments = []
    for s in row.segments:
        seg = {"kind": s.kind, "token_ids": list(s.token_ids),
               "text": tokenizer.decode(list(s.token_ids), skip_special_tokens=False)}  # fmt: skip
        if s.kind == "generated":
            seg.update(logprobs=list(s.logprobs or []), version=s.version, turn=s.turn)
        segments.append(seg)
    return {"segments": segments, "reward": row.reward, "group_id": row.group_id,
            "no_eos": row.no_eos, "rewritten_turns": row.rewritten_turns}  # fmt: skip


def _write(out: Path, rows, tokenizer) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(trajectory_record(row, tokenizer)) + "\n")
    tmp.replace(out)
