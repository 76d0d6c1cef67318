"""Priming: the host -> device transition that builds the first `DecodeState` (docs/design.md, "Priming").

For each prompt p[0 .. n-1] the host checks it (ids in the vocabulary, length + budget within
`max_seq_len`), hands the lane KV blocks and builds its block table, runs the target over the prompt
(KV at 0 .. n-1; the last row gives the first new token g, argmax or a sample with the lane's counter
0) and the draft (an MTP head pairs the token at p with the target hidden from p - 1; an n-gram draft
only takes the prompt into its history row), then hands `step.advance` the accepted run [g] with
base_pos = n - 1, so the new window is [g, d'1 .. d'K] at base_pos = n.

Everything that can be wrong with the input raises here, before any tensor is touched. Prefill runs
eagerly (prompt lengths vary); the step graph never sees it. It never waits for the device: every
host value goes up in one packed non-blocking upload (`fdecode.staging.Uploads`), and attention reads
the context bucket of the longest prompt (`DecodeConfig.bucket_for`), not the whole lane.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fdecode.backends import cpu
from fdecode.config import DecodeConfig
from fdecode.drafts import drafter_for
from fdecode.host_record import HostRecord
from fdecode.ops.paging import slot_of
from fdecode.ops.plan import GREEDY, plan_for
from fdecode.ops.processors import prompt_seen
from fdecode.params import SamplingParams, request_params
from fdecode.scalars import is_array, rows, scalar
from fdecode.seeds import SeedSource
from fdecode.staging import Uploads
from fdecode.state import DecodeState
from fdecode.state.decode_state import LEAVES
from fdecode.state.grammar_pool import FREE_KEY, GrammarPool
from fdecode.state.recurrent import after_prompts, draft_copies, first_copy, forward_rows, zero_leaves
from fdecode.step import Verified, advance, commit, transition_randoms
from fdecode.tree.shape import parents_leaf, slot_reach

Prompt = Sequence[int] | torch.Tensor  # token ids: a list (of ints, numpy or torch integers), a 1-D tensor or array
Prompts = Sequence[Prompt] | torch.Tensor  # a list of prompts, or a 2-D tensor or array (one prompt per row)


def check_prompt(prompt: Prompt, vocab_size: int, label: str = "prompt") -> list[int]:
    """Validate one prompt and return it as a list of ints. Every message names the prompt once, as `label`
    ("prompt 3" in a batch, "prompt" for a single request)."""
    if is_array(prompt):  # a tensor or a numpy array
        kind = str(prompt.dtype).removeprefix("torch.")
        if prompt.ndim != 1 or not (kind.startswith(("int", "uint")) or kind == "long"):
            raise TypeError(f"{label}: expected a 1-D integer tensor, got {prompt.dtype} {tuple(prompt.shape)}")
        prompt = prompt.tolist()
    if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence):
        got = f"{type(prompt).__name__}{_input_ids_hint(prompt)}"
        raise TypeError(f"{label}: expected a sequence of token ids, got {got}")
    ids = [scalar(t) for t in prompt]  # numpy / torch integers as ints
    if not ids:
        raise ValueError(f"{label} is empty")
    for t in ids:
        if not isinstance(t, int) or isinstance(t, bool):
            raise TypeError(f"{label}: token ids must be ints, got {t!r}")
        if not 0 <= t < vocab_size:
            raise ValueError(f"{label}: token id {t} is outside the vocabulary [0, {vocab_size})")
    return ids


def prompt_rows(prompts: Prompts) -> list[Prompt]:
    """A batch of prompts as a list: a list or tuple of prompts (lists, 1-D tensors or arrays), or the rows
    of a 2-D tensor or array; a 1-D one is refused with a hint (it is one prompt, not a batch)."""
    batch = rows(prompts)
    if batch is None:
        one_prompt = is_array(prompts) and prompts.ndim == 1
        hint = ": it is one prompt, pass [prompt]" if one_prompt else _input_ids_hint(prompts)
        raise TypeError(f"prompts must be a list of token-id sequences or a 2-D tensor, got {_kind(prompts)}{hint}")
    if len(batch) == 0:
        raise ValueError("prompts is empty: pass at least one prompt")
    return batch


def _input_ids_hint(value: object) -> str:
    """For a tokenizer's output (transformers' BatchEncoding, from `tokenizer(...)` or `apply_chat_template`)."""
    return " (pass its ['input_ids'])" if isinstance(value, Mapping) and "input_ids" in value else ""


def _kind(value: object) -> str:
    if is_array(value):
        return f"a {value.ndim}-D {type(value).__name__}"
    return type(value).__name__


def check_prompts(prompts: Prompts, cfg: DecodeConfig, vocab_size: int) -> list[list[int]]:
    """Validate a batch of prompts (at most `max_batch`, see `prompt_rows`) and return them as lists of ints."""
    prompts = prompt_rows(prompts)
    if len(prompts) > cfg.max_batch:
        raise ValueError(f"{len(prompts)} prompts but max_batch is {cfg.max_batch} (fdecode.generate queues them)")
    return [check_prompt(p, vocab_size, f"prompt {i}") for i, p in enumerate(prompts)]


def check_budgets(
    lengths: list[int], params: Sequence[SamplingParams], cfg: DecodeConfig, labels: Sequence[str] | None = None
) -> list[int]:
    """Per-lane token budget (`max_new_tokens` of each request's params, None: up to max_seq_len); prompt +
    budget must fit in `max_seq_len`. `labels` name the prompts (default "prompt 0", "prompt 1", ...)."""
    labels = [f"prompt {i}" for i in range(len(lengths))] if labels is None else labels
    budgets = []
    for label, n, p in zip(labels, lengths, params, strict=True):
        max_new_tokens = p.max_new_tokens
        room = cfg.max_seq_len - n
        if room < 1:
            raise ValueError(f"{label} has {n} tokens; max_seq_len {cfg.max_seq_len} leaves no room to generate")
        if max_new_tokens is None:
            if p.min_tokens > room:
                raise ValueError(
                    f"{label}: min_tokens {p.min_tokens} is more than the {room} tokens max_seq_len "
                    f"{cfg.max_seq_len} leaves after its {n} (EOS would stay masked to the end)"
                )
            budgets.append(room)
        elif n + max_new_tokens > cfg.max_seq_len:
            raise ValueError(
                f"{label}: {n} tokens + max_new_tokens {max_new_tokens} exceed max_seq_len {cfg.max_seq_len}"
            )
        else:
            budgets.append(max_new_tokens)
    return budgets


def block_table(blocks: list[list[int]], cfg: DecodeConfig) -> torch.Tensor:
    """Block table rows [len(blocks), max_blocks] int64 for lanes owning `blocks` (-1 = unallocated)."""
    table = torch.full((len(blocks), cfg.blocks_per_lane), -1, dtype=torch.int64)
    for row, ids in enumerate(blocks):
        table[row, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    return table


def lane_blocks(cfg: DecodeConfig, tokens: int, reach: int | None = None) -> int:
    """The KV blocks a lane of `tokens` positions (prompt + budget) owns at most: those, and `reach` positions
    past them (None: the slots a tree step's last steps write there, `fdecode.tree.shape.slot_reach`; 0 for a
    chain), within `blocks_per_lane`."""
    bs, reach = cfg.block_size, slot_reach(cfg) if reach is None else reach
    return max(-(-tokens // bs), min(-(-(tokens + reach) // bs), cfg.blocks_per_lane))


def allocate_blocks(needs: list[int], cfg: DecodeConfig) -> torch.Tensor:
    """Block table rows for lanes 0.. (one per entry of `needs`): lane b gets needs[b] blocks from 1 upwards."""
    total = sum(needs)
    if total > cfg.pool_blocks - 1:
        raise ValueError(
            f"the prompts need {total} KV blocks but the pool has {cfg.pool_blocks - 1} (num_blocks minus scratch)"
        )
    starts = [1 + sum(needs[:lane]) for lane in range(len(needs))]
    return block_table([list(range(start, start + n)) for start, n in zip(starts, needs)], cfg)


def new_kv(target, draft, cfg: DecodeConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh target and draft KV pools for `cfg` (a `Step` owns them and hands them to its states)."""
    device = torch.device(cfg.device)
    return (
        target.kv_config.new_kv(cfg.num_slots, dtype=cfg.dtype, device=device),
        draft.kv_config.new_kv(cfg.num_slots, dtype=cfg.dtype, device=device),
    )


def empty_state(target, draft, cfg: DecodeConfig, kv: tuple[torch.Tensor, torch.Tensor]) -> DecodeState:
    """A state with every lane inactive, no blocks handed out, over KV pools `kv` (target, draft) taken
    as they are (nothing is read before it is written)."""
    batch, window, device = cfg.max_batch, cfg.W, torch.device(cfg.device)
    drafter = drafter_for(draft)
    zeros = dict(dtype=torch.int64, device=device)
    return DecodeState.of(
        tokens=torch.zeros(batch, window, **zeros),
        base_pos=torch.zeros(batch, **zeros),
        block_tables=torch.full((batch, cfg.blocks_per_lane), -1, **zeros),
        target_kv=kv[0],
        draft_kv=kv[1],
        **zero_leaves(target, draft, batch, copies=draft_copies(cfg), dtype=cfg.dtype, device=device),
        **draft_leaves(drafter, draft, cfg, batch, device),
        active=torch.zeros(batch, dtype=torch.bool, device=device),
        remaining=torch.zeros(batch, **zeros),
        stop_ids=torch.full((batch, cfg.max_stop_ids), -1, **zeros),
        temperature=torch.zeros(batch, dtype=torch.float32, device=device),
        top_k=torch.zeros(batch, **zeros),
        top_p=torch.ones(batch, dtype=torch.float32, device=device),
        min_p=torch.zeros(batch, dtype=torch.float32, device=device),
        **processor_leaves(cfg, batch, target.config.vocab_size, device),
        **grammar_pool_leaves(cfg, target.config.vocab_size, device),
        seed=torch.zeros(batch, **zeros),
        counter=torch.zeros(batch, **zeros),
        draft_probs=torch.zeros(batch, cfg.K, target.config.vocab_size, dtype=torch.float32, device=device),
        output=torch.zeros(batch, cfg.output_width, **zeros),
    )


def draft_leaves(drafter, draft, cfg: DecodeConfig, batch: int, device: torch.device) -> dict[str, torch.Tensor | None]:
    """The draft part's leaves of `batch` fresh lanes (`fdecode.state.parts.Draft`): the n-gram history and the
    missed tokens of an idle draft (-1: none), the tree's parents; None where the draft kind or chain has none."""
    widths = dict(history=drafter.history_width(cfg), missed=drafter.missed_width(draft, cfg))
    leaves = {
        name: torch.full((batch, width), -1, dtype=torch.int64, device=device) if width else None
        for name, width in widths.items()
    }
    return dict(leaves, tree_parents=parents_leaf(cfg, batch, device))


def processor_leaves(cfg: DecodeConfig, batch: int, vocab: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The `fdecode.ops.processors` leaves of `batch` lanes that use no feature (None where the config leaves
    a feature off), their min_tokens and their grammar state (-1: none; None without grammars)."""
    penalties = bias = {}
    if cfg.penalties:
        penalties = dict(
            penalties=torch.cat([torch.ones(batch, 1, device=device), torch.zeros(batch, 2, device=device)], dim=1),
            counts=torch.zeros(batch, vocab, dtype=torch.int32, device=device),
            seen=torch.zeros(batch, vocab, dtype=torch.bool, device=device),
        )
    if cfg.max_logit_bias:
        bias = dict(
            bias_ids=torch.full((batch, cfg.max_logit_bias), -1, dtype=torch.int64, device=device),
            bias=torch.zeros(batch, cfg.max_logit_bias, dtype=torch.float32, device=device),
        )
    grammar_state = torch.full((batch,), -1, dtype=torch.int64, device=device) if cfg.grammars else None
    return dict(
        **penalties, **bias, min_left=torch.zeros(batch, dtype=torch.int64, device=device), grammar_state=grammar_state
    )


def grammar_pool_leaves(cfg: DecodeConfig, vocab: int, device: torch.device) -> dict[str, torch.Tensor]:
    """An empty grammar pool (`fdecode.state.grammar_pool`); none where grammars are off."""
    if not cfg.grammars:
        return {}
    states, transitions = cfg.max_grammar_states, cfg.max_grammar_transitions
    return dict(
        grammar_allowed=torch.zeros(states, -(-vocab // 32), dtype=torch.int32, device=device),
        grammar_keys=torch.full((transitions,), FREE_KEY, dtype=torch.int64, device=device),
        grammar_next=torch.full((transitions,), -1, dtype=torch.int64, device=device),
    )


def request_leaves(params: Sequence[SamplingParams], cfg: DecodeConfig) -> dict[str, torch.Tensor]:
    """The host-side processor values of new lanes (`fdecode.ops.processors`), to upload (only the leaves the
    config has)."""
    n = len(params)
    bias_ids = torch.full((n, cfg.max_logit_bias), -1, dtype=torch.int64)
    bias = torch.zeros(n, cfg.max_logit_bias, dtype=torch.float32)
    for row, p in enumerate(params):
        for column, (t, b) in enumerate(p.logit_bias or ()):
            bias_ids[row, column], bias[row, column] = t, b
    penalties = torch.tensor(
        [[p.repetition_penalty, p.frequency_penalty, p.presence_penalty] for p in params], dtype=torch.float32
    ).view(n, 3)
    leaves = dict(min_left=torch.tensor([p.min_tokens for p in params], dtype=torch.int64))
    if cfg.penalties:
        leaves["penalties"] = penalties
    if cfg.grammars:
        leaves["grammar_state"] = torch.full((n,), -1, dtype=torch.int64)
    if cfg.max_logit_bias:
        leaves.update(bias_ids=bias_ids, bias=bias)
    return leaves


@torch.no_grad()
def prime(
    target,
    draft,
    cfg: DecodeConfig,
    state: DecodeState,
    lanes: list[int],
    prompts: list[list[int]],
    *,
    block_tables: torch.Tensor,  # [n, max_blocks] int64, the blocks handed to each new lane
    budgets: list[int],
    params: Sequence[SamplingParams],  # one per new lane, resolved (`request_params`): seed, stop ids
    uploads: Uploads | None = None,  # the caller's persistent staging buffer (`Engine`); None: one for this call
    grammars: GrammarPool | None = None,  # the state's grammar pool (`Engine`); None: a fresh one for this call
    host: HostRecord,  # what the host knows of `state` (`fdecode.host_record`)
) -> tuple[DecodeState, HostRecord]:
    """Write new requests into `lanes` of `state` (the host -> device transition); other lanes are untouched.
    Returns the new state and what the host knows of it (`host` with the new lanes).

    Inputs must already be checked (`check_*`, `request_params`). Consumes `state` (its KV is written in place).
    """
    n, bs, device = len(lanes), cfg.block_size, torch.device(cfg.device)
    drafter = drafter_for(draft)
    vocab = target.config.vocab_size
    longest = max(len(p) for p in prompts)  # host quantities come from host data: no device read
    tokens = torch.zeros(n, longest, dtype=torch.int64)
    for row, p in enumerate(prompts):
        tokens[row, : len(p)] = torch.tensor(p)
    stops = torch.full((n, cfg.max_stop_ids), -1, dtype=torch.int64)
    for row, p in enumerate(params):
        stops[row, : len(p.eos_token_id)] = torch.tensor(p.eos_token_id, dtype=torch.int64)
    lane = {  # the per-lane sampling leaves, one value per new lane
        name: torch.tensor([getattr(p, name) for p in params], dtype=dtype)
        for name, dtype in (
            ("temperature", torch.float32),
            ("top_k", torch.int64),
            ("top_p", torch.float32),
            ("min_p", torch.float32),
            ("seed", torch.int64),
        )
    }
    lane.update(request_leaves(params, cfg))
    if cfg.grammars:  # the requests' automata into the pool (in place), each lane at its initial state
        pool = GrammarPool(cfg, vocab) if grammars is None else grammars
        admitted = pool.admit(state, lanes, [p.grammar for p in params])
        lane["grammar_state"] = torch.tensor(admitted.initial, dtype=torch.int64)
        if admitted.grammar_state is not state.grammar_state:  # the pool was compacted: running lanes moved
            state = state.replace(grammar_state=admitted.grammar_state)
    # Every host value goes up in one packed non-blocking copy: a pageable copy would wait for the device.
    tokens, lengths, table, stops, index, remaining, *values = (Uploads(device) if uploads is None else uploads)(
        tokens,
        torch.tensor([len(p) for p in prompts]),
        block_tables,
        stops,
        torch.tensor(lanes),
        torch.tensor(budgets, dtype=torch.int64),
        *lane.values(),
    )
    lane = dict(zip(lane, values))
    # Attention reads the smallest context window holding the prompts and the first draft forwards
    # (a context bucket), not the whole lane; KV writes go through the whole table.
    context_blocks = cfg.bucket_for(longest - 1)
    context = table[:, :context_blocks]
    positions = torch.arange(longest, device=device).expand(n, longest)
    real = positions < lengths[:, None]
    slots = torch.where(real, slot_of(table, positions, bs), torch.zeros_like(positions))

    fresh = zero_leaves(
        target, draft, n, copies=draft_copies(cfg), dtype=cfg.dtype, device=device
    )  # new lanes' recurrent state
    with cpu.eager_linears(cfg.device_type):  # large CPU linears by oneDNN, as the step's graphs run them
        logits, hidden, target_states = forward_rows(
            target,
            tokens,
            positions,
            slots,
            state.target_kv,
            context,
            block_size=bs,
            attention=cfg.attention,
            recurrent=first_copy(fresh, "target"),
            valid=real,  # rows past a prompt leave its state alone
        )  # [n, T, V], [n, T, H], recurrent states after each prompt (None: no linear-attention layers)
        # MTP pairs the token at p with the target hidden at p - 1 (a draft LM ignores hidden_in).
        shifted = torch.cat([hidden.new_zeros(n, 1, hidden.shape[-1]), hidden[:, :-1]], dim=1)
        draft_states = None
        if drafter.forwards:  # an n-gram draft has no forward: its history is the prompt itself
            _, _, draft_states = forward_rows(
                draft,
                tokens,
                positions,
                slots,
                state.draft_kv,
                context,
                block_size=bs,
                hidden_in=shifted,
                attention=cfg.attention,
                recurrent=first_copy(fresh, "draft"),
                valid=real,
            )
    fresh_draft = draft_leaves(drafter, draft, cfg, n, device)  # nothing missed yet, a root alone
    history = fresh_draft["history"]
    if history is not None:  # an n-gram draft's history: the prompt
        history[:, : min(longest, history.shape[1])] = torch.where(real, tokens, -1)[:, : history.shape[1]]

    rows = torch.arange(n, device=device)
    last = lengths - 1
    active = torch.ones(n, dtype=torch.bool, device=device)
    primed = DecodeState.of(
        tokens=torch.zeros(n, cfg.W, dtype=torch.int64, device=device),
        base_pos=last,  # advance() puts the first token at last + 1
        block_tables=table,
        target_kv=state.target_kv,
        draft_kv=state.draft_kv,
        **after_prompts(fresh, target_states, draft_states),
        grammar_allowed=state.grammar_allowed,
        grammar_keys=state.grammar_keys,
        grammar_next=state.grammar_next,
        **fresh_draft,
        active=active,
        remaining=remaining,
        stop_ids=stops,
        **lane,
        counts=torch.zeros(n, vocab, dtype=torch.int32, device=device) if cfg.penalties else None,
        seen=prompt_seen(tokens, real, vocab) if cfg.penalties else None,
        counter=torch.zeros(n, dtype=torch.int64, device=device),
        draft_probs=torch.zeros(n, cfg.K, vocab, dtype=torch.float32, device=device),
        output=torch.zeros(n, cfg.output_width, dtype=torch.int64, device=device),
    )
    # The first token: the target's argmax (greedy lanes) or a sample of its filtered distribution.
    last_logits = logits[rows, last]  # [n, V]
    inputs = [p.plan_inputs for p in params]
    plan = plan_for(inputs, candidates=cfg.top_k_candidates) if cfg.sampling else GREEDY
    noise, _, draft_u = transition_randoms(primed, cfg.K) if plan.random else (None, None, None)
    # The first token is a depth-0 step's commit of the prompt's last row (`fdecode.step.commit`): the same draw,
    # stops, budgets, request features and logprobs. The row's KV was written above, so no slot is missing.
    verified = Verified(last_logits[:, None], hidden[rows, last][:, None], None, torch.ones_like(primed.tokens))
    committed = commit(target, cfg, primed, verified, noise, None, plan, 0)
    new = advance(draft, cfg, primed, committed, draft_u, plan=plan, context_blocks=context_blocks)
    return write_lanes(state, index, new), host.primed(lanes, inputs, longest)


SHARED = ("target_kv", "draft_kv", "grammar_allowed", "grammar_keys", "grammar_next")  # pools, not lanes


def write_lanes(state: DecodeState, index: torch.Tensor, rows: DecodeState) -> DecodeState:
    """`state` with the per-lane leaves of lanes `index` ([n] int64 on the device) replaced by those of
    `rows` (KV leaves are shared)."""
    changes = {
        name: getattr(state, name).index_copy(0, index, getattr(rows, name))
        for name in LEAVES
        if name not in SHARED and getattr(state, name) is not None
    }
    return state.replace(**changes)


@torch.no_grad()
def prefill(
    target,
    draft,
    cfg: DecodeConfig,
    prompts: Prompts,
    *,
    kv: tuple[torch.Tensor, torch.Tensor],
    seeds: SeedSource | None = None,
    **requests: object,
) -> tuple[DecodeState, HostRecord]:
    """Build the first state for `prompts` (lanes past len(prompts) stay inactive), over KV pools `kv`
    (target, draft), and what the host knows of it. requests: the sampling settings, `params` or the keyword
    shortcuts (`fdecode.params.request_params`, as `Step.prefill` takes them)."""
    vocab = target.config.vocab_size
    prompts = check_prompts(prompts, cfg, vocab)
    lengths = [len(p) for p in prompts]
    params = request_params(len(prompts), cfg, vocab, seeds=seeds, **requests)
    budgets = check_budgets(lengths, params, cfg)
    needs = [lane_blocks(cfg, n + b) for n, b in zip(lengths, budgets)]
    if sum(needs) > cfg.pool_blocks - 1:  # a pool sized for prompt + budget alone: the last trees run short
        needs = [lane_blocks(cfg, n + b, reach=0) for n, b in zip(lengths, budgets)]
    table = allocate_blocks(needs, cfg)
    lanes = list(range(len(prompts)))
    return prime(
        target,
        draft,
        cfg,
        empty_state(target, draft, cfg, kv),
        lanes,
        prompts,
        block_tables=table,
        budgets=budgets,
        params=params,
        host=HostRecord.empty(cfg.max_batch),
    )
