"""The draft's command-line flags, shared by `fdecode generate` and `fdecode serve` so both spell them alike
(docs/serving.md, "Flags"): a chain's depth or a tree's nodes (-k), a tree's children per node and levels, and
whether an Engine chooses each step's depth."""

from __future__ import annotations

import argparse


def add_draft_flags(parser: argparse.ArgumentParser) -> None:
    """-k / --num-draft-tokens, --draft-topk, --draft-depth and --[no-]adaptive-depth, with `DecodeConfig`'s
    defaults (K = 3, draft_topk "auto": the chain of 3 on a CPU; adaptive)."""
    parser.add_argument(
        "-k",
        "--num-draft-tokens",
        type=int,
        default=3,
        help="K: drafts verified per step, a chain's depth or a tree's nodes (default: %(default)s)",
    )
    parser.add_argument(
        "--draft-topk",
        type=topk,
        default="auto",
        help="children kept per drafted node; > 1 drafts a tree of K nodes; auto: on an accelerator a tree of 4K "
        "nodes over K levels (k = 4) beside the chains, on a CPU the chain of K (default: %(default)s)",
    )
    parser.add_argument("--draft-depth", type=int, help="a tree's draft levels, S < K, needed with --draft-topk > 1")
    parser.add_argument(
        "--adaptive-depth",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="choose each step's depth (chains of 1 .. S and trees) by measured cost and acceptance; "
        "--no-adaptive-depth verifies all K drafts (the whole tree) at every step; n-gram chains keep their "
        "on/off gate either way (default: adaptive)",
    )


def topk(text: str) -> int | str:
    """--draft-topk's value: "auto" or an int (`DecodeConfig` checks its range)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an int, got {text!r}") from None


def draft_settings(args: argparse.Namespace) -> dict[str, int | str | None]:
    """The `DecodeConfig` fields the flags set, as keywords (for `DecodeConfig` and `fdecode.serve.load`), so a
    flag added here reaches both commands."""
    return dict(
        num_draft_tokens=args.num_draft_tokens,
        draft_topk=args.draft_topk,
        draft_depth=args.draft_depth,
        adaptive_depth=args.adaptive_depth,
    )
