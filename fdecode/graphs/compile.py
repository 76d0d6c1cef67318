"""`fdecode.compile`: bind models and config into a `Step`, captured by the chosen backend
(docs/design.md, "Backends and kernels").

A `Step` is the user's handle: `step(state)`, `step.prefill(...)`, `step.warmup()`. It composes three parts:
its graphs (`fdecode.graphs.graph_set.GraphSet`: capture, disk store, announcements, by `GraphKey`), the
host-side choice of which graph runs (`fdecode.graphs.schedule.Schedule`: window, plan, depth) and its KV
pools (`fdecode.state.ownership.KVPools`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import torch

from fdecode.backends import cpu
from fdecode.config import DecodeConfig
from fdecode.drafts import Drafter
from fdecode.drafts.resolve import resolve_draft
from fdecode.graphs.backends import choose_attention, device_reason, latent_reason, resolve_backend
from fdecode.graphs.chains import Chains
from fdecode.graphs.graph_key import GraphKey
from fdecode.graphs.graph_set import GraphSet
from fdecode.graphs.pure import pure_step
from fdecode.graphs.schedule import Schedule, requested_depth
from fdecode.host_record import HostRecord
from fdecode.models.parallel import check_group
from fdecode.models.regions import resolve_regions
from fdecode.models.resolve import config_of, resolve_config, resolve_target
from fdecode.models.sharding import check_divides, parallelize_pair
from fdecode.ops.plan import SamplingPlan, all_plans, covering
from fdecode.params import PerPrompt, SamplingParams
from fdecode.prefill import Prompts, empty_state, prefill, prime
from fdecode.progress import notice
from fdecode.seeds import SeedSource
from fdecode.state import DecodeState, StepOutput
from fdecode.step import general_plan
from fdecode.tree.auto import auto_shape
from fdecode.tree.shape import check_tree, first_depth, kernel_reason


class Step:
    """A compiled decode step: `state, out = step(state)`; `state = step.prefill(prompts)`.

    Attributes: `target`, `draft` (fdecode models, or an `NgramDraft`), `drafter` (`fdecode.drafts`), `draft_kind`
    ("mtp", "ngram" or "model"), `config`, `backend` (what runs) and `fallback_reason` (why not the requested one),
    `attention_reason` (why `config.attention` is not a device kernel / the requested one, or runs a tree step's
    chains alone), `shape_reason` (the chain or tree `draft_topk="auto"` chose, and why; None where the config named
    k), `buckets` (attention windows in tokens), `plans` (the sampling plans it can run), `covering_plans`
    (`warmup()`'s default: exact for any lanes), `gated` (an `Engine` pauses verifying drafts that do not pay,
    `fdecode.runtime.gate`), `first_depth` (the depth a stream starts at, `warmup()`'s default: K, or an adaptive
    tree step's chain of depth S),
    `seeds`, `fn` (the uncompiled pure function, whole-lane window, exact for any lanes). Its parts: `graph_set`
    (the graphs by `GraphKey`: capture, disk store, announcements; `graphs`, `compile_seconds`,
    `plan_compile_seconds` are its views), `schedule` (which graph runs, from the state's `HostRecord`, never a
    device read; `depth_seconds`, the depths' costs `warmup` timed) and `chains` (its KV pools and which states may
    use them).
    """

    # Where `fdecode.compile` packed the large linear weights (`fdecode.backends.cpu.onednn_linear.Packing`:
    # bytes in place of checkpoint files' weights, and beside others), None where it packed none.
    packing = None

    def __init__(
        self,
        target,
        draft,
        config: DecodeConfig,
        *,
        drafter: Drafter,
        backend: str,
        fallback_reason: str | None,
        attention_reason: str | None = None,
        shape_reason: str | None = None,
        announce: bool = True,
    ):
        self.target = target
        self.draft = draft
        self.config = config
        self.drafter = drafter
        self.draft_kind = drafter.kind
        self.backend = backend
        self.fallback_reason = fallback_reason
        self.attention_reason = attention_reason
        self.shape_reason = shape_reason
        # Default seeds of requests that give none, the same on every tensor-parallel rank.
        self.seeds = SeedSource(getattr(target, "tp", None), config.device)
        self.graph_set = GraphSet(target, draft, config, backend=backend, announce=announce)
        self.schedule = Schedule.for_models(config, self.graph_set, target, draft, drafter)
        self.depths = self.schedule.depths  # the depths this step runs (`__call__`)
        self.depth_seconds = self.schedule.depth_seconds  # depth -> seconds of one step (`warmup`)
        self.idles_draft = self.schedule.idles_draft  # the draft sits out depth-0 steps (`fdecode.ops.catch_up`)
        # One graph per plan and depth for every window of 2+ blocks (`GraphSet.dynamic_window`).
        self.dynamic_window = self.graph_set.dynamic_window
        self.compile_seconds = self.graph_set.compile_seconds  # (the graph set's own dicts, filled as graphs run)
        self.plan_compile_seconds = self.graph_set.plan_compile_seconds
        # The step's KV pools and which states may use them (`fdecode.graphs.chains`).
        self.chains = Chains(config, target, draft, drafter, self.graph_set.new_kv)
        # The pure step function (what every backend captures), whole-lane window, exact for any lanes.
        self.fn = pure_step(target, draft, config, GraphKey(config.blocks_per_lane, general_plan(config), config.K))
        self.buckets = tuple(n * config.block_size for n in config.bucket_blocks)
        self.plans = all_plans(config.sampling, config.top_k_candidates, config.logit_processors)
        self.covering_plans = covering(config.sampling, config.logit_processors)
        self.gated = drafter.gated(config)
        # The depth a stream starts at where no other depth's graph is made, and `warmup()`'s: K, or an adaptive tree
        # step's chain of depth S (`fdecode.tree.shape.first_depth`: one of `depths`).
        self.first_depth = first_depth(config)
        self._models = (target, draft, config)  # what priming and prefill take first

    @property
    def graphs(self) -> Mapping[GraphKey, Callable]:
        """The graphs made so far, by key: a read-only view (`GraphSet.graphs`)."""
        return self.graph_set.graphs

    @property
    def kv_pools(self) -> list:
        """The KV pools this step owns (`fdecode.state.ownership.KVPool`), oldest first: a copy of the list."""
        return self.chains.pools

    def plan_for(self, state: DecodeState, depth: int | None = None, *, host: HostRecord | None = None) -> SamplingPlan:
        """The plan a step of `depth` (None: K) runs on `state` (`Schedule.plan_for`)."""
        return self.schedule.plan_for(state, depth, host=host)

    def __call__(
        self,
        state: DecodeState,
        *,
        speculate: bool = True,
        depth: int | None = None,
        host: HostRecord | None = None,
    ) -> tuple[DecodeState, StepOutput]:
        """One step. depth: how many of the window's drafts to verify, 0 .. K (None: K, or 0 where
        speculate=False); the step then proposes as many for the next window (at least one; all K for
        n-gram and recurrent drafts), so a lane commits at most depth + 1 tokens and the target runs
        depth + 1 rows: cheaper where drafts are not being accepted (`decode_step`). Every depth reads
        and writes the same state and is exact; each is a graph of its own (compiled on first use, or
        by `warmup(depths=...)`). speculate=False is depth 0: every lane commits one token, as
        target-only decoding would. host: what the host knows of `state` (`fdecode.host_record`; None: the
        schedule's record of it, unknown for a state this step did not make), as an `Engine` passes it."""
        depth = self.schedule.check_depth(requested_depth(speculate, depth, self.config.K))
        self.chains.let_in(state, self.check_state)
        host = self.schedule.record(state) if host is None else host
        return self._run(state, *self.schedule.key(state, depth, host=host), host=host)

    def _run(
        self, state: DecodeState, blocks: int, key: GraphKey, *, quiet: bool = False, host: HostRecord | None = None
    ) -> tuple[DecodeState, StepOutput]:
        host = self.schedule.record(state) if host is None else host
        new_state, out = self.graph_set.run(state, blocks, key, trusted=self.chains.trusted, quiet=quiet)
        self.chains.advance(state, new_state, key)
        self.schedule.stepped(state, host, key, new_state)
        return new_state, out

    def warmup(
        self,
        plans: Sequence[SamplingPlan] | None = None,
        *,
        progress: bool | None = None,
        depths: Sequence[int] | None = None,
    ) -> dict[int, float]:
        """Capture every window's graph for each of `plans` and `depths` now, on a throwaway all-inactive state
        whose KV pool goes back to the step (the next `prefill` runs at the addresses the graphs were captured
        with); returns `compile_seconds` (per window, summed over plans). plans: None is `covering_plans`, after
        which no mix of requests compiles anything; `step.plans` makes the specialised graphs too, which every
        batch then runs where they are exact. depths: None is `first_depth` (K, or an adaptive tree step's chain of
        depth S), and 0 too for a `gated` step. progress: a tqdm bar over the runs (None:
        `graph_set.announce`; never for eager). Each depth's step is then timed at the widest window
        (`Schedule.warmup_runs`, `fdecode.graphs.warmup`): the costs an `Engine` with `adaptive_depth` weighs depths
        by go in `depth_seconds` (where a depth was timed before, the least).
        """
        first = self.first_depth
        depths = ((first, 0) if self.gated else (first,)) if depths is None else depths
        plans = self.covering_plans if plans is None else plans
        show = (self.graph_set.announce if progress is None else progress) and self.backend != "eager"
        self.schedule.warm(self._run, self.empty_state(), plans, depths, show=show)  # a throwaway state
        return dict(self.compile_seconds)

    def prefill(
        self,
        prompts: Prompts,
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        max_new_tokens: int | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        ignore_eos: bool = False,
        temperature: PerPrompt = None,
        top_k: PerPrompt = None,
        top_p: PerPrompt = None,
        min_p: PerPrompt = None,
        seed: PerPrompt = None,
        concurrent: bool = False,
    ) -> DecodeState:
        """Prime a fresh state: one lane per prompt; the first new token is in `state.step_output`.

        prompts: a list of token-id lists (or 1-D tensors / arrays), or a 2-D tensor / array.
        How each prompt is decoded: `params` (one `fdecode.SamplingParams` for the call, or one per
        prompt), or the shortcuts: temperature (0 = greedy, the default), top_k (0 = off), top_p (1 =
        off), min_p (0 = off), seed (a number for the call or one per prompt; a seed for the call
        gives each prompt its own stream), max_new_tokens (None: up to max_seq_len), eos_token_id
        (None: the model's EOS ids, `config.eos_token_id`), ignore_eos. See `fdecode.params`.

        KV pools (`fdecode.state.ownership`): one prefill chain at a time. A prefill reuses the pool of
        the previous prefill's chain, whose states are refused from then on (stepping one raises), so
        `for ...: state = step.prefill(...)` runs every generation in one pool. concurrent=True starts
        a chain that runs alongside the others instead: in a pool of its own while any of its states
        is alive, which no later prefill takes over.
        """

        requests = dict(params=params, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, ignore_eos=ignore_eos)
        requests.update(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
        state, record = self.chains.start(  # the state, and what the host knows of it
            lambda *kv: prefill(*self._models, prompts, kv=kv, seeds=self.seeds, **requests), take_over=not concurrent
        )
        self.schedule.records.note(state, record)
        return state

    def prime(
        self,
        state: DecodeState,
        lanes: list[int],
        prompts: list[list[int]],
        *,
        host: HostRecord | None = None,
        **requests,
    ) -> DecodeState:
        """Write new requests into `lanes` of `state` (an `Engine`'s admission; `fdecode.prefill.prime` takes
        the keywords: block_tables, budgets, params, uploads, grammars). Consumes `state`'s KV (in place).
        host: what the host knows of `state` (None: the schedule's record of it)."""
        host = self.schedule.record(state) if host is None else host
        new, record = prime(*self._models, state, lanes, prompts, host=host, **requests)
        self.schedule.records.note(new, record, spent=state)
        return new

    def empty_state(self) -> DecodeState:
        """A state with every lane inactive, in a free KV pool: what an `Engine` starts from. Its chain
        keeps the pool while any of its states is alive (no prefill takes it over)."""
        record = HostRecord.empty(self.config.max_batch)
        state, _ = self.chains.start(lambda *kv: (empty_state(*self._models, kv), record), take_over=False)
        self.schedule.records.note(state, record)
        return state

    def check_state(self, state: DecodeState) -> None:
        """Host-side shape/device checks (no device sync), so a wrong state fails before the graph runs."""
        self.chains.check(state)

    def __repr__(self) -> str:
        cfg, t = self.config, self.target.config
        fallback = f", fallback_reason={self.fallback_reason!r}" if self.fallback_reason else ""
        tree = f" (a tree: k={cfg.draft_topk}, S={cfg.levels})" if cfg.tree else ""
        return (
            f"Step(backend={self.backend!r}{fallback}, target={t.model_type} {t.num_layers}L/{t.hidden_size}H, "
            f"draft={self.draft_kind}, attention={cfg.attention!r}, K={cfg.K}{tree}, max_batch={cfg.max_batch}, max_seq_len={cfg.max_seq_len}, "
            f"block_size={cfg.block_size}, dtype={cfg.dtype}, device={cfg.device}"
            f"{f', tp={cfg.tp_size}' if cfg.tp_size > 1 else ''}"
            f"{f', packed weights: {self.packing}' if self.packing is not None else ''})"
        )


def compile(
    target,
    draft,
    config: DecodeConfig,
    *,
    fallback: bool = False,
    tp_group: torch.distributed.ProcessGroup | None = None,
    warmup: bool = False,
    announce: bool = True,
) -> Step:
    """Bind `target` and `draft` to `config` and capture the decode step.

    target: a transformers causal LM, a local checkpoint folder, or an fdecode `LlamaModel`.
    draft:  the same kinds, an fdecode `MTPHead`, or `"mtp"` for the target's own MTP head.
    The models are left as they are: `config.dtype="auto"` / `config.device=None` take the target's
    own (`step.config` holds the resolved values); the step shares each parameter that already has
    its dtype and device and converts a copy of any other (`fdecode.models.resolve.owned`).
    warmup: capture every context window's graph now (`Step.warmup`, with a progress bar) instead of
        on first use.
    announce: say on stderr (one line) when a graph compiles, and show warm-up's progress bar.
    fallback: run the best eligible backend (and say why in `step.fallback_reason`) instead of
        raising when the requested backend cannot capture this configuration.
    tp_group: the process group of a tensor-parallel step (`config.tp_size` ranks, one step per
        rank); the models are loaded whole and each rank keeps its shards (`fdecode.models.parallel`).
    """
    if not isinstance(config, DecodeConfig):
        raise TypeError(f"config must be a fdecode.DecodeConfig, got {type(config).__name__}")
    config = resolve_config(target, config)  # dtype "auto" / device None: the target's own
    unusable = device_reason(config)
    if unusable is not None:
        raise ValueError(f"device {config.device!r} cannot be used here: {unusable}")
    tp = check_group(tp_group, config.tp_size, config.device)
    if tp is not None:  # a split that cannot be made is refused before any weight is read
        check_divides(config_of(target), tp.size, what="target")
    target_model = resolve_target(target, config)
    draft_model, drafter = resolve_draft(draft, target_model, config)
    if tp is not None:
        target_model, draft_model = parallelize_pair(target_model, draft_model, drafter, tp)
    shapes = tuple((c.num_heads, c.num_kv_heads, c.head_dim) for c in (target_model.config, draft_model.kv_config))
    latent = latent_reason(target_model, draft_model)  # an MLA latent cache: the reference reads it
    kernel, attention_reason = choose_attention(config, shapes, fallback=fallback, latent=latent)
    config = dataclasses.replace(config, attention=kernel)  # before the backend: torchair's GE mode depends on it
    config, shape_reason = auto_shape(target_model, draft_model, drafter, config)  # draft_topk "auto"
    check_tree(target_model, draft_model, drafter, config)  # a tree these models or features cannot run
    tree_kernel = kernel_reason(config)  # a device kernel runs a tree step's chains alone
    attention_reason = "; ".join(r for r in (attention_reason, tree_kernel) if r) or None
    regions = resolve_regions(config.layer_regions, target_model, draft_model, drafter, config.K)
    config = dataclasses.replace(config, layer_regions=regions)  # "auto": by the layer copies of a step
    config, backend, reason = resolve_backend(config, target_model, draft_model, drafter, fallback=fallback)
    packing = cpu.pack_linears(target_model, draft_model) if cpu.packs_weights(config, backend) else None
    if announce and packing is not None and packing.beside:
        notice(
            f"kept oneDNN's layout of the large linear weights beside them: +{packing.beside / 2**30:.2f} GiB "
            "(weights that are no checkpoint file's bytes; DecodeConfig.pack_weights=False: none)"
        )
    if announce and packing is not None and packing.written:
        notice(
            f"stored oneDNN's layout of the checkpoint's large linear weights on disk, once: "
            f"{packing.written / 2**30:.2f} GiB in {cpu.packed_folder()} (a later start maps it)"
        )
    step = Step(
        target_model,
        draft_model,
        config,
        drafter=drafter,
        backend=backend,
        fallback_reason=reason,
        attention_reason=attention_reason,
        shape_reason=shape_reason,
        announce=announce,
    )
    step.packing = packing  # `repr(step)` shows it
    if warmup:
        step.warmup()
    return step
