"""`fdecode serve [MODEL]`: the command line of the server (docs/serving.md, "Flags").

fdecode serve                                  # the bundled model on 127.0.0.1:8000
fdecode serve ./my-model --draft ngram --port 8080 --max-batch 16 --max-seq-len 4096
"""

from __future__ import annotations

import argparse
import logging
import sys

from fdecode.draft_flags import add_draft_flags, draft_settings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fdecode serve", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "model", nargs="?", help="local Hugging Face folder with weights, config, tokenizer (default: bundled)"
    )
    p.add_argument("--draft", help="'mtp', 'ngram' or a draft checkpoint folder (default: mtp where the model has it)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", help="the name /v1/models lists (default: the folder's name)")
    add_draft_flags(p)
    p.add_argument("--max-batch", type=int, default=8, help="lanes: requests decoded together (default: %(default)s)")
    p.add_argument("--max-seq-len", type=int, default=2048, help="context per request (default: %(default)s)")
    p.add_argument(
        "--backend", default="auto", help="what compiles the step: auto, inductor, eager, ... (default: auto)"
    )
    p.add_argument("--max-logprobs", type=int, default=20, help="most top_logprobs a request may ask (default: 20)")
    p.add_argument("--max-logit-bias", type=int, default=64, help="most logit_bias ids per request (default: 64)")
    p.add_argument("--max-grammar-states", type=int, default=4096, help="grammar pool states (default: 4096)")
    p.add_argument(
        "--max-grammar-transitions", type=int, default=1 << 20, help="grammar pool transitions (default: 1048576)"
    )
    p.add_argument("--max-waiting", type=int, default=64, help="requests queued beyond the lanes (default: 64)")
    p.add_argument(
        "--full-status",
        type=int,
        default=429,
        choices=(429, 503),
        help="status of a request refused as the queue is full",
    )
    p.add_argument("--drain-timeout", type=float, default=30.0, help="seconds SIGTERM waits for requests in flight")
    p.add_argument("--threads", type=int, help="torch intra-op threads of the engine (default: torch's)")
    p.add_argument("--log-level", default="info")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        from fdecode.serve import Server, load
    except ImportError as error:
        print(f'error: fdecode serve needs the serve extra: pip install -e ".[serve]" ({error})', file=sys.stderr)
        return 2
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        model = load(
            args.model,
            args.draft,
            name=args.served_model_name,
            **draft_settings(args),
            max_batch=args.max_batch,
            max_seq_len=args.max_seq_len,
            backend=args.backend,
            max_logprobs=args.max_logprobs,
            max_logit_bias=args.max_logit_bias,
            max_grammar_states=args.max_grammar_states,
            max_grammar_transitions=args.max_grammar_transitions,
        )
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"fdecode serve: {model.name} at http://{args.host}:{args.port}/v1 ({model.step})", file=sys.stderr)
    server = Server(model, max_waiting=args.max_waiting, full_status=args.full_status, drain_timeout=args.drain_timeout)
    server.run(args.host, args.port, log_level=args.log_level)
    return 0
