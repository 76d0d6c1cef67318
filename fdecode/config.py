"""`DecodeConfig`: the static half of a decode step (docs/design.md, "The state").

Everything here is a Python scalar that is baked into the captured graph
(shapes, K, block size, dtype, device), so the config is frozen and hashable.
Anything that changes per request (positions, budgets, stop ids, sampling
parameters) is a tensor in `DecodeState` instead, so it never causes a recompile.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from dataclasses import dataclass, field

import torch

from fdecode.ops.attention import KERNELS
from fdecode.scalars import scalar, token_ids
from fdecode.tree.shape import check_tree_shape

BACKENDS = ("auto", "eager", "inductor", "aot_eager", "dynamo", "cudagraphs", "torchair")
# torchair graph modes: ACL graph capture (npugraph_ex, the default) or a GE graph (max-autotune).
TORCHAIR_MODES = ("reduce-overhead", "max-autotune")
LOGPROBS_MODES = ("raw", "processed")


@dataclass(frozen=True)
class DecodeConfig:
    """The static half of a step. Its fields, by concern (each is documented where it is declared):

    graph shape      num_draft_tokens (K), draft_topk, draft_depth, max_batch (B), max_seq_len, block_size,
                     num_blocks, dtype, device, context_buckets, dynamic_window, max_stop_ids
    compilation      backend, attention, layer_regions, pack_weights, torchair_mode
    Engine policy    adaptive_depth, draft_gate, draft_catch_up
    sampling and     sampling, top_k_candidates, eos_token_id, penalties, min_tokens, max_logit_bias,
    request features max_logprobs, logprobs_mode, max_grammar_states, max_grammar_transitions
    parallelism      tp_size, broadcast_accepted
    """

    num_draft_tokens: int  # K: drafts proposed and verified per step (a tree's nodes, N, besides its root)
    max_batch: int  # B: lanes; the step's shapes are fixed by it
    max_seq_len: int  # capacity of one lane: prompt + generated tokens
    block_size: int = 16  # tokens per KV block
    num_blocks: int | None = None  # KV pool size incl. scratch block 0; None: every lane at max length
    backend: str = "auto"
    # KV cache and activation dtype. "auto": the target's own, i.e. its parameters' dtype (a checkpoint
    # folder: its config.json dtype / torch_dtype, float32 where it names none), on every device; unlike
    # vLLM's "auto", float32 weights are not cast down. Models of another dtype are converted in a copy.
    dtype: torch.dtype | str = "auto"
    # None: the target model's device (a checkpoint folder loads to "cpu"). `fdecode.compile` resolves
    # both: `step.config.dtype` is a torch.dtype and `step.config.device` a str.
    device: str | None = None
    max_stop_ids: int = 4  # E: EOS ids a lane can stop on (padded with -1)
    # The stop ids of requests that name none (`SamplingParams.eos_token_id=None`). "auto": the model's EOS ids,
    # which `fdecode.compile` reads from its generation config (a transformers model's `generation_config`,
    # a folder's generation_config.json, else config.json's `eos_token_id`), as transformers' `generate` and
    # vLLM do; an id or a list of ids: those; None or (): none. `step.config.eos_token_id` is the tuple used.
    eos_token_id: str | int | tuple[int, ...] | None = "auto"
    # Allow random lanes. Steps whose lanes are all greedy run the greedy-only graph either way (the host
    # picks a `SamplingPlan` per step); False refuses temperature > 0 and never captures a sampling graph.
    sampling: bool = True
    # C: a step whose random lanes all have 1 <= top_k <= C filters and samples within torch.topk's C
    # candidates (one pass over the vocabulary); 0 disables that graph (every random step filters all of V).
    top_k_candidates: int = 128
    # Attention windows (tokens) with a graph each; a step attends over the smallest window that holds every
    # position it can touch. None: 256, 512, ... up to max_seq_len. Rounded up to whole blocks.
    context_buckets: tuple[int, ...] | None = None
    # One graph per sampling plan for every window of 2 blocks or more (the window's width a symbolic size),
    # where the backend can (`fdecode.graphs.backends.DYNAMIC_WINDOW`); False: a graph per window everywhere.
    dynamic_window: bool = True
    # n-gram chains: an `Engine` on the step stops verifying drafts while they are not being accepted, running
    # steps that verify one row instead of K + 1, and tries them again after a pause that doubles while they
    # keep failing (`fdecode.runtime.gate`). Lossless either way; False: every step verifies K + 1 rows.
    draft_gate: bool = True
    # An `Engine` chooses each launch's depth (how many of the K drafts the step verifies and proposes) from
    # the acceptance it reads one step behind and each depth's step time (`fdecode.runtime.depth`), among the
    # depths whose graphs are made: `step.warmup(depths=step.depths)` makes them all; without it the first launch
    # makes `step.first_depth`'s (K, or an adaptive tree step's chain of depth S) and the others are made on a
    # thread of their own (`fdecode.runtime.depth_graphs`). False: every step verifies K (a tree: all of it).
    # For draft LMs, MTP heads and n-gram trees (n-gram chains have `draft_gate`); recurrent chains keep K.
    adaptive_depth: bool = True
    # A draft LM sits out depth-0 steps (the target alone, as target-only decoding costs): up to this many in
    # a row, whose tokens the next step that drafts feeds it (a catch-up step: it verifies the first row, runs
    # the draft over the tokens it missed and proposes one draft); a depth-0 step past that many catches it
    # up itself. 0: a draft LM runs at every step. MTP heads (which read the target's hidden states) and
    # recurrent or n-gram drafts run at every step (`fdecode.drafts.Drafter.idles`).
    # 16: on the real pair a catch-up costs ~180 ms over depth 0 plus ~3 ms a missed row, so a stream held at
    # depth 0 pays it every C + 1 tokens (docs/design.md, "Adaptive depth and the idle draft", has the figures).
    draft_catch_up: int = 16
    # Draft trees (`fdecode.tree`, docs/design.md "Trees"): k children kept per expanded node, S draft levels
    # (None: num_draft_tokens). k = 1 with S = num_draft_tokens is the chain; k > 1 drafts a tree of
    # num_draft_tokens nodes over S < num_draft_tokens levels, the best of the k + (S - 1) k^2 candidates by path
    # probability (EAGLE-2). "auto": `fdecode.compile` chooses (`fdecode.tree.auto`; `step.config` holds the
    # choice, `step.shape_reason` says why): on an accelerator, with adaptive_depth, a tree as deep as
    # num_draft_tokens of 4x its nodes (k = 4), whose chains of 1 .. K the Engine weighs against the trees; on a
    # CPU (which pays for every row a verify runs), or where no tree can run, the chain of num_draft_tokens.
    # Until then the config is that chain.
    draft_topk: int | str = "auto"
    draft_depth: int | None = None
    # Paged-attention kernel: "auto" (the best eligible one, see `fdecode.graphs.backends.choose_attention`),
    # "torch" (the reference), "flash_attn" (CUDA) or "npu_fused_infer_attention" (Ascend NPU).
    # `fdecode.compile` resolves "auto": the device's kernel where eligible, else the reference.
    attention: str = "auto"
    # Compile each kind of decoder layer once and call it at every copy (`torch.compiler.nested_compile_region`,
    # `fdecode.models.regions`), so compile time does not grow with depth x (K + 1); the step stays one
    # graph. Used with the reference attention kernel under the compiling backends (not torchair); False
    # unrolls every layer copy. "auto": True where the step runs at least `AUTO_MIN_COPIES` layer copies
    # (target layers + K x draft layers), where compile time pays for the region calls' host cost.
    # `fdecode.compile` resolves it: `step.config.layer_regions` is a bool.
    layer_regions: bool | str = "auto"
    # An Inductor step on the CPU keeps each large linear weight (`onednn_linear.MIN_BYTES` and up) in oneDNN's
    # own layout (`fdecode.backends.cpu.onednn_packed`), made at `fdecode.compile`: products of 2-8 rows
    # (verifies, a batch's drafts) run 1.5-2.2x faster. A checkpoint folder's weights are packed in place of
    # them (one copy, stored on disk for the next process); others keep the packed copy beside them (a second
    # copy); `repr(step)` says which. False: oneDNN reads the weights as they lie.
    pack_weights: bool = True
    tp_size: int = 1  # tensor-parallel ranks; > 1 needs fdecode.compile(..., tp_group=group) of that size
    broadcast_accepted: bool = False  # TP only: every rank uses rank 0's tokens (in-graph broadcast)
    torchair_mode: str = "reduce-overhead"  # backend "torchair": ACL graph (npugraph_ex) or "max-autotune" (GE graph)
    # Request features that need room in the state or work in the graph (`fdecode.ops.processors`); a request
    # asking for one the config leaves off is refused before anything runs. Off, the step is as without them.
    # repetition / frequency / presence penalties: token counts per lane in the state (5 bytes x V a lane).
    penalties: bool = False
    min_tokens: bool = False  # SamplingParams.min_tokens: stop ids masked until a lane has that many tokens
    max_logit_bias: int = 0  # SamplingParams.logit_bias: at most this many biased ids per request (0: off)
    # SamplingParams.logprobs: the committed tokens' logprobs and up to this many top alternatives, computed
    # in the graph and read with the tokens (None: off; 0: the committed tokens' own only).
    max_logprobs: int | None = None
    # "raw": log_softmax of the target's logits (vLLM's default); "processed": of the distribution sampled
    # from (after logit bias, min_tokens, penalties, temperature and the filters).
    logprobs_mode: str = "raw"
    # SamplingParams.grammar (`fdecode.Grammar`): room for the automata of the grammars a state's lanes use at
    # once, in states (a bitmask row of V / 8 bytes each) and transitions (16 bytes each); 0: off.
    max_grammar_states: int = 0
    max_grammar_transitions: int = 0
    _resolved_num_blocks: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in (
            "num_draft_tokens",
            "max_batch",
            "max_seq_len",
            "block_size",
            "num_blocks",
            "max_stop_ids",
            "top_k_candidates",
            "tp_size",
            "max_logit_bias",
            "max_logprobs",
            "max_grammar_states",
            "max_grammar_transitions",
            "draft_catch_up",
            "draft_topk",
            "draft_depth",
        ):  # numpy / torch integers as ints (the config is hashed)
            value = scalar(getattr(self, name))
            if isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, name, value)
        for name in ("num_draft_tokens", "max_batch", "max_seq_len", "block_size", "max_stop_ids", "tp_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"DecodeConfig.{name} must be a positive int, got {value!r}")
        for name in ("draft_catch_up", "top_k_candidates"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"DecodeConfig.{name} must be an int >= 0, got {value!r}")
        check_tree_shape(self)
        if self.draft_topk in (1, "auto") and self.draft_depth == self.num_draft_tokens:  # the chain, spelled out
            object.__setattr__(self, "draft_depth", None)
        if not isinstance(self.dynamic_window, bool):
            raise ValueError(f"DecodeConfig.dynamic_window must be True or False, got {self.dynamic_window!r}")
        if not isinstance(self.layer_regions, bool) and self.layer_regions != "auto":
            raise ValueError(f"DecodeConfig.layer_regions must be 'auto', True or False, got {self.layer_regions!r}")
        if not isinstance(self.draft_gate, bool):
            raise ValueError(f"DecodeConfig.draft_gate must be True or False, got {self.draft_gate!r}")
        for name in ("penalties", "min_tokens", "pack_weights"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"DecodeConfig.{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("max_logit_bias", "max_logprobs", "max_grammar_states", "max_grammar_transitions"):
            value = getattr(self, name)
            if (value is not None or name != "max_logprobs") and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ValueError(
                    f"DecodeConfig.{name} must be an int >= 0{' or None' if name == 'max_logprobs' else ''}, "
                    f"got {value!r}"
                )
        if (self.max_grammar_states > 0) != (self.max_grammar_transitions > 0):
            raise ValueError(
                "DecodeConfig.max_grammar_states and max_grammar_transitions are both 0 (no grammars) or "
                f"both > 0, got {self.max_grammar_states} and {self.max_grammar_transitions}"
            )
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"DecodeConfig.logprobs_mode must be one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}")
        if not isinstance(self.adaptive_depth, bool):
            raise ValueError(f"DecodeConfig.adaptive_depth must be True or False, got {self.adaptive_depth!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"DecodeConfig.backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.torchair_mode not in TORCHAIR_MODES:
            raise ValueError(f"DecodeConfig.torchair_mode must be one of {TORCHAIR_MODES}, got {self.torchair_mode!r}")
        if self.dtype != "auto" and (not isinstance(self.dtype, torch.dtype) or not self.dtype.is_floating_point):
            raise TypeError(f"DecodeConfig.dtype must be 'auto' or a floating torch.dtype, got {self.dtype!r}")
        if self.device is not None:
            object.__setattr__(self, "device", _normalise_device(self.device))
        if self.eos_token_id != "auto":
            object.__setattr__(self, "eos_token_id", _stop_ids(self.eos_token_id, self.max_stop_ids))
        if self.broadcast_accepted and self.tp_size == 1:
            raise ValueError("DecodeConfig.broadcast_accepted needs tensor parallelism (tp_size > 1)")
        needed = 1 + self.max_batch * self.blocks_per_lane
        num_blocks = needed if self.num_blocks is None else self.num_blocks
        if not isinstance(num_blocks, int) or num_blocks < 2:
            raise ValueError(f"DecodeConfig.num_blocks must be an int >= 2 (block 0 is scratch), got {num_blocks!r}")
        object.__setattr__(self, "_resolved_num_blocks", num_blocks)
        if self.attention not in ("auto", *KERNELS):
            raise ValueError(f"DecodeConfig.attention must be 'auto' or one of {KERNELS}, got {self.attention!r}")
        if self.context_buckets is not None:
            buckets = self.context_buckets
            if not isinstance(buckets, tuple) or not all(isinstance(n, int) and n > 0 for n in buckets):
                raise ValueError(f"DecodeConfig.context_buckets must be a tuple of positive ints, got {buckets!r}")

    @functools.cached_property  # read at every step (`bucket_for`); the fields never change
    def bucket_blocks(self) -> tuple[int, ...]:
        """Attention windows in blocks, ascending; the last one is a whole lane (`blocks_per_lane`)."""
        lane = self.blocks_per_lane
        if self.context_buckets is None:
            tokens, n = [], 256
            while n < self.max_seq_len:
                tokens.append(n)
                n *= 2
        else:
            tokens = list(self.context_buckets)
        return tuple(sorted({min(lane, math.ceil(n / self.block_size)) for n in tokens} | {lane}))

    def bucket_for(self, max_position: int | None) -> int:
        """Blocks of the smallest window holding every key a step reads when no lane's `base_pos`
        exceeds `max_position` (None: unknown, the whole lane). The step's furthest query is the last
        draft, at base_pos + 2K (accept all W, then K - 1 more drafts), and it reads keys 0 .. itself."""
        if max_position is None:
            return self.blocks_per_lane
        need = math.ceil((max_position + 2 * self.K + 1) / self.block_size)
        return next((n for n in self.bucket_blocks if n >= need), self.blocks_per_lane)

    @property
    def device_type(self) -> str:
        """The device type ("cpu", "cuda", "npu", ...), known even where its torch extension is not installed
        ("cpu" while `device` is None, before `fdecode.compile` resolves it)."""
        return (self.device or "cpu").split(":")[0]

    @property
    def tree(self) -> bool:
        """Whether the step drafts and verifies a tree (`draft_topk` > 1) rather than a chain ("auto" is the chain
        until `fdecode.compile` resolves it)."""
        return self.draft_topk != "auto" and self.draft_topk > 1

    @property
    def levels(self) -> int:
        """S, the draft levels: a node's greatest depth below the root (the chain's K)."""
        return self.num_draft_tokens if self.draft_depth is None else self.draft_depth

    @property
    def K(self) -> int:
        return self.num_draft_tokens

    @property
    def W(self) -> int:
        """The verified tokens per lane (K+1): the last committed token plus K drafts. ("Window" is the
        attention window, `context_buckets`.)"""
        return self.num_draft_tokens + 1

    @property
    def processing(self) -> bool:
        """Whether the step changes logits before it samples (penalties, min_tokens, logit bias or grammars)."""
        return self.logit_processors or self.grammars

    @property
    def logit_processors(self) -> bool:
        """Whether the step has penalties, min_tokens or a logit bias: its sampling plans then come in twins
        without them (`fdecode.ops.plan.SamplingPlan.unprocessed`)."""
        return self.penalties or self.min_tokens or self.max_logit_bias > 0

    @property
    def grammars(self) -> bool:
        """Whether lanes may follow a grammar (`SamplingParams.grammar`)."""
        return self.max_grammar_states > 0

    @property
    def logprob_columns(self) -> int:
        """Columns of the packed output per window row for logprobs: the committed token's, then the top
        `max_logprobs` ids and their logprobs (0: logprobs off)."""
        return 0 if self.max_logprobs is None else 1 + 2 * self.max_logprobs

    @property
    def output_width(self) -> int:
        """Columns of the packed output (`StepOutput`): W tokens, drafts verified, logprobs, count, status."""
        return self.W + 3 + self.W * self.logprob_columns

    @property
    def blocks_per_lane(self) -> int:
        """Columns of the block table: enough blocks for one lane at `max_seq_len`."""
        return math.ceil(self.max_seq_len / self.block_size)

    @property
    def pool_blocks(self) -> int:
        """KV pool size in blocks, block 0 (scratch) included."""
        return self._resolved_num_blocks

    @property
    def num_slots(self) -> int:
        return self.pool_blocks * self.block_size


def _stop_ids(value: object, most: int) -> tuple[int, ...]:
    """DecodeConfig.eos_token_id as a tuple of ids (numpy / torch integers accepted)."""
    ids = [] if value is None else token_ids(value)
    if ids is None or any(t < 0 for t in ids):
        raise ValueError(f"DecodeConfig.eos_token_id must be 'auto', None, an id or a list of ids, got {value!r}")
    if len(ids) > most:
        raise ValueError(f"DecodeConfig.eos_token_id has {len(ids)} ids but max_stop_ids is {most}")
    return tuple(ids)


def _normalise_device(device: object) -> str:
    """str(torch.device(device)); an Ascend "npu[:i]" stays as given where torch_npu, which teaches
    torch that name, is absent, so backend eligibility can say so instead of a parse error."""
    try:
        return str(torch.device(device))
    except RuntimeError:
        name = str(device)
        if name.split(":")[0] != "npu":
            raise
        if importlib.util.find_spec("torch_npu") is not None:
            import torch_npu  # noqa: F401 - registers the "npu" device name

            return str(torch.device(name))
        return name
