"""`Engine`: the host loop that feeds a compiled step without waiting on it (docs/design.md, "The Engine").

Each `engine.step()` (1) launches the device step on the current state (all admitted lanes), (2) reads
the *previous* step's output from a persistent host buffer after one event wait, turns it into events
and retires finished lanes (their blocks return to the pool), (3) queues a non-blocking copy of this
step's output into the host buffer, (4) hands the running lanes the blocks their next steps may reach,
oldest request first, then (5) admits waiting requests into free lanes by priming (no recompilation:
shapes are fixed by `max_batch`; their first token is read with the next output).
Stop conditions are applied on the device; the host learns of a finished lane one step later. Where
every running lane may finish in the step in flight (at most W tokens of its budget left), (2) comes
before (1) instead (`Engine._ending`), so no step is launched for lanes that have already finished.

Before each launch every lane owns the blocks of every position the step in flight and the next one
can reach (capped at prompt + budget, and for a tree step the slots its last steps' nodes reach past them:
`fdecode.prefill.lane_blocks`). A request is admitted when a lane and its first blocks are free
(else it waits); by default it also reserves the blocks it may grow into, so growth never fails. With
`overcommit=True` only the first blocks must be free; a lane that then runs dry is cut on the device
and stopped, and its last event carries the error. Other lanes are never touched.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from fdecode.detokenize import Detokenizer
from fdecode.host_record import HostRecord
from fdecode.params import SamplingParams, request_params
from fdecode.prefill import block_table, check_budgets, check_prompt, lane_blocks
from fdecode.runtime.allocator import BlockAllocator
from fdecode.runtime.depth_graphs import DepthGraphs
from fdecode.runtime.logprobs import TokenLogprob, lane_logprobs, token_logprobs
from fdecode.runtime.metrics import RequestMetrics, SpecMetrics
from fdecode.runtime.policy import depth_policy
from fdecode.staging import Fence, Uploads, host_buffer
from fdecode.state.decode_state import ERRORS
from fdecode.state.grammar_pool import GrammarPool
from fdecode.text import encode, find_tokenizer, is_text, stop_ids


@dataclass(frozen=True)
class Event:
    request_id: int
    new_tokens: list[int]  # tokens committed since the last event of this request
    finished: bool  # the request's last event: no other follows
    error: str | None = None  # why the request was stopped early, if it was
    # Why a finished request ended (None while it runs): "stop" (it emitted a stop id), "length" (its
    # budget or max_seq_len), "cancelled" (`Engine.cancel`), "error" (see `error`).
    reason: str | None = None
    metrics: RequestMetrics | None = None  # on a finished event: the request's acceptance counts (so far, if cancelled)
    # One per token of new_tokens, where the request asked for logprobs (`SamplingParams.logprobs`), else None.
    logprobs: list[TokenLogprob] | None = None
    text: str | None = None  # new_tokens as text, for a prompt given as text (`fdecode.detokenize`), else None


@dataclass
class Request:
    """A request the Engine holds (`Engine.requests`): read it, never write it."""

    id: int
    prompt: list[int]
    budget: int
    params: SamplingParams  # resolved (`request_params`): its seed and stop ids are the lane's
    blocks_needed: int  # blocks of prompt + budget (a tree's reach past them too): the most it can ever own
    blocks: list[int] = field(default_factory=list)
    lane: int | None = None
    known: int = 0  # tokens the host has seen committed (prompt included)
    metrics: RequestMetrics = RequestMetrics()  # counted from the step rows read for it
    detokenizer: Detokenizer | None = None  # a prompt given as text: its tokens are decoded as they come


def _reason(row: list[int], request: Request) -> str:
    """Why the lane of `row` (a finished lane's packed output) ended."""
    count = row[-2]
    if row[-1] >= 2:
        return "error"
    return "stop" if count and row[count - 1] in request.params.eos_token_id else "length"


class Engine:
    """Continuous batching over a compiled `Step`.

    engine = fdecode.Engine(step)
    rid = engine.add_request(prompt, max_new_tokens=64, eos_token_id=2, temperature=0.8, seed=1)
    rid = engine.add_request(prompt, fdecode.SamplingParams(temperature=0.8, seed=1, max_new_tokens=64))
    rid = engine.add_request("def f(x):")   # text or chat messages, with a tokenizer: events carry `text`
    for event in engine.stream(): ...        # (request_id, new_tokens, finished, error, reason, metrics)
    results = engine.run()                   # {request_id: tokens}, runs until idle
    """

    def __init__(
        self,
        step,
        *,
        callbacks: Sequence[Callable[[Event], None]] = (),
        overcommit: bool = False,
        tokenizer=None,
    ) -> None:
        """tokenizer: encodes prompts given as text (`fdecode.text`; default: the target checkpoint's)."""
        self.step_fn = step
        self.tokenizer = tokenizer
        self.overcommit = overcommit
        cfg = self.config = step.config
        self.state = step.empty_state()
        self.allocator = BlockAllocator(cfg.pool_blocks)
        self.callbacks = list(callbacks)
        self.steps = 0  # device steps launched
        self.host_waits = 0  # device -> host reads (one per step, plus priming reads no step output carried)
        self._lanes: list[Request | None] = [None] * cfg.max_batch
        self._waiting: deque[Request] = deque()
        self._requests: dict[int, Request] = {}
        self._next_id = 0
        device = torch.device(cfg.device)
        # Persistent host buffers, allocated once (pinned on an accelerator, `fdecode.staging`): the step's
        # packed output and priming's first tokens, read after one wait on `_ready`; every upload (priming,
        # block-table growth) goes through `_uploads`, so nothing the host does between reads waits.
        self._out_host = host_buffer((cfg.max_batch, cfg.output_width), torch.int64, device)
        self._prime_host = host_buffer((cfg.max_batch, cfg.output_width), torch.int64, device)
        self._ready = Fence(device)
        self._uploads = Uploads(device)
        self._out_lanes: list[Request | None] | None = None  # lane owners when the pending step launched
        self._primed_lanes: list[int] = []
        self._cancelled: list[Event] = []  # final events of cancelled requests, emitted by the next step()
        # How each launch's depth is chosen: by cost and acceptance, the n-gram gate, or K (`fdecode.runtime.policy`).
        self.policy = depth_policy(step)
        # The depth graphs the policy may choose that are not made, asked for after launches (`DepthGraphs`).
        self.depth_graphs = DepthGraphs(step, self.policy)
        self._out_ticket: object = None  # what the policy said of the pending step (`DepthPolicy.observe_output`)
        # The grammars resident in the state's pool (`fdecode.state.grammar_pool`), where lanes may follow one.
        self.grammars = GrammarPool(cfg, step.target.config.vocab_size) if cfg.grammars else None
        self._metrics = SpecMetrics(cfg.K)  # acceptance over every step row read (`metrics`)

    # ------------------------------------------------------------------ requests

    def add_request(
        self,
        prompt: Sequence[int] | torch.Tensor | str | Sequence[Mapping],
        params: SamplingParams | None = None,
        *,
        max_new_tokens: int | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        ignore_eos: bool = False,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        min_p: float | None = None,
        seed: int | None = None,
    ) -> int:
        """Queue a request; it is admitted when a lane and its KV blocks are free. Returns its id.

        How it is decoded: `params` (a `fdecode.SamplingParams`) or the keywords, with the same
        defaults (greedy, the model's EOS ids, up to max_seq_len; see `fdecode.params`).
        A prompt given as a string or chat messages is encoded with the tokenizer, stops at its EOS ids too
        (where neither params nor eos_token_id say otherwise), and its events carry `text`.
        Errors about the prompt name it "prompt"; those about an argument name only the argument."""
        cfg, vocab = self.config, self.step_fn.target.config.vocab_size
        text = is_text(prompt)
        if text:
            self.tokenizer = find_tokenizer(self.step_fn, self.tokenizer)
            prompt = encode(self.tokenizer, prompt)
            if params is None and eos_token_id is None and not ignore_eos:
                eos_token_id = stop_ids(self.step_fn, self.tokenizer)
        ids = check_prompt(prompt, vocab, "prompt")
        (resolved,) = request_params(
            1,
            cfg,
            vocab,
            params=params,
            seeds=self.step_fn.seeds,
            labels=[None],
            per_prompt=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos_token_id,
            ignore_eos=ignore_eos,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seed=seed,
        )
        request_id = self.add_resolved(ids, resolved)
        if text:
            self._requests[request_id].detokenizer = Detokenizer(self.tokenizer, ids)
        return request_id

    def add_resolved(self, ids: list[int], params: SamplingParams, *, label: str = "prompt") -> int:
        """Queue a prompt already checked (`fdecode.prefill.check_prompt`) with params already resolved
        (`fdecode.params.request_params`): what `fdecode.generate` does for many prompts at once, so that a
        whole-call seed gives each request its own. `label` names the prompt in errors ("prompt 3").
        Returns its id."""
        cfg = self.config
        (budget,) = check_budgets([len(ids)], [params], cfg, [label])
        need = lane_blocks(cfg, len(ids) + budget, reach=0)
        if need > self.allocator.capacity:
            raise ValueError(
                f"{label} needs {need} KV blocks ({len(ids)} tokens + max_new_tokens {budget}) but the pool has "
                f"{self.allocator.capacity}: it could never be admitted"
            )
        most = min(lane_blocks(cfg, len(ids) + budget), self.allocator.capacity)  # a tree's reach where the pool has it
        request = Request(self._next_id, ids, budget, params, most, known=len(ids))
        self._next_id += 1
        self._requests[request.id] = request
        self._waiting.append(request)
        return request.id

    def cancel(self, request_id: int) -> None:
        """Stop a request now: a waiting one is dropped, a running one's lane is silenced and freed. Its final
        event (`finished=True`, `reason="cancelled"`, no tokens: what it committed but was not yet read is
        dropped) comes with the next `step()` / `stream()`, and goes to the callbacks like any other."""
        request = self._requests.get(request_id)
        if request is None:
            raise KeyError(f"unknown request id {request_id!r} (finished requests are forgotten)")
        if request.lane is None:
            self._waiting.remove(request)
        else:
            active = self.state.active
            lanes = torch.arange(active.shape[0], device=active.device)
            self.state = self.state.replace(active=active & (lanes != request.lane))  # no upload, no read
            self._retire(request)
        del self._requests[request_id]
        self._cancelled.append(Event(request_id, [], True, reason="cancelled", metrics=request.metrics))

    @property
    def requests(self) -> Mapping[int, Request]:
        """The requests not finished yet (waiting or running), by id: a read-only view."""
        return MappingProxyType(self._requests)

    @property
    def num_active(self) -> int:
        return sum(r is not None for r in self._lanes)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def host_buffers(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The host memory it reads into and uploads from (pinned on an accelerator): the step output's and
        priming's read buffers, and its uploads' staging buffer (`fdecode.staging.Uploads.buffer`)."""
        return self._out_host, self._prime_host, self._uploads.buffer

    @property
    def ready_event(self) -> torch.Event | None:
        """The event it records after each launch or admission and waits on once per read (None on the CPU)."""
        return self._ready.event

    @property
    def metrics(self) -> SpecMetrics:
        """Acceptance over every step read so far (`fdecode.runtime.metrics`): totals, mean accepted length,
        acceptance per draft position. Updated in place by `step()`; counted from the rows read anyway."""
        return self._metrics

    def has_work(self) -> bool:
        return bool(self._requests) or self._out_lanes is not None or bool(self._cancelled)

    # ------------------------------------------------------------------ the loop

    def step(self) -> list[Event]:
        """One iteration: launch, read the previous output, admit. Returns the events read.

        Where every running lane may finish in the pending step (`_ending`), that output is read before the
        launch instead, so no step runs only lanes that have finished: one wait without a step behind it
        (free on the CPU, which runs a step inside its launch), for a step saved at the end of each stream."""
        early = self._drain() if self._ending() else []
        launched, ticket = None, None
        started, compiled = time.perf_counter(), self._compiled()
        if self.num_active:
            host = self._host_record()
            ready = self.step_fn.schedule.ready_depths(self.state, host) if self.policy.reads_ready else None
            depth, ticket = self.policy.launch(ready)
            self.state, out = self.step_fn(self.state, depth=depth, host=host)
            self.depth_graphs.after_launch(host)  # the other depths' graphs, made on a thread of their own
            launched = out.packed
            self.steps += 1
        events, self._cancelled = self._cancelled + early + self._drain(), []
        if launched is not None and not early and self._compiled() == compiled:
            # The launch and the read of the step before: on the CPU, the step itself (`DepthController.observe_cost`).
            self.policy.observe_cost(depth, time.perf_counter() - started)
        if launched is not None:
            self._out_host.copy_(launched, non_blocking=True)
            self._out_lanes = list(self._lanes)
            self._out_ticket = ticket
        short = self._extend()  # running lanes grow first: a newcomer never takes the blocks they need next
        if not short:
            self._admit()
        if launched is not None or self._primed_lanes:
            self._ready.record()
        for event in events:
            for callback in self.callbacks:
                callback(event)
        return events

    def stream(self) -> Iterator[Event]:
        """Events until every request has finished."""
        while self.has_work():
            yield from self.step()

    def run(self) -> dict[int, list[int]]:
        """Run until idle; returns every request's committed tokens."""
        results: dict[int, list[int]] = {}
        for event in self.stream():
            results.setdefault(event.request_id, []).extend(event.new_tokens)
        return results

    # ------------------------------------------------------------------ internals

    def _compiled(self) -> int:
        """Graphs the step has run so far (`Step.plan_compile_seconds`): a launch that adds one compiled or
        loaded it, and its seconds say nothing of the depth's cost."""
        return len(getattr(self.step_fn, "plan_compile_seconds", ()))

    def _ending(self) -> bool:
        """Whether a step is pending and every running lane may finish in it: at most W tokens are left of
        its budget (an EOS may end a lane sooner; that is not foreseen)."""
        if self._out_lanes is None or not self.num_active:
            return False
        return all(r is None or len(r.prompt) + r.budget - r.known <= self.config.W for r in self._lanes)

    def _drain(self) -> list[Event]:
        """Read the pending step output and primed first tokens (one event wait) into events."""
        if self._out_lanes is None and not self._primed_lanes:
            return []
        self._ready.wait()
        self.host_waits += 1
        events: list[Event] = []
        if self._out_lanes is not None:
            self.policy.observe_output(self._out_host, self._out_ticket)
            events += self._read(self._out_host, self._out_lanes, range(len(self._out_lanes)))
            self._out_lanes = None
        if self._primed_lanes:
            events += self._read(self._prime_host, self._lanes, self._primed_lanes, primed=True)
            self._primed_lanes = []
        return events

    def _read(self, host: torch.Tensor, owners, lanes, *, primed: bool = False) -> list[Event]:
        """Events of the lanes' rows of `host`; a step's rows (not priming's, `primed`) are counted in metrics."""
        events = []
        rows = host.tolist()
        logprob_rows = None if self.config.max_logprobs is None else lane_logprobs(host, self.config.W)
        for lane in lanes:
            request = owners[lane]
            if request is None or request.lane != lane:
                continue  # a lane retired or re-primed since this output was produced
            row = rows[lane]
            count, finished = row[-2], bool(row[-1])
            if count == 0 and not finished:
                continue
            error = ERRORS.get(row[-1])  # status >= 2: stopped with an error
            if not primed:  # row[W]: the drafts its verified rows carried (`StepOutput.num_drafts`)
                request.metrics = request.metrics.counted(count, row[self.config.W])
                self._metrics.count(count, row[self.config.W])
            reason, metrics = (_reason(row, request), request.metrics) if finished else (None, None)
            top = request.params.logprobs
            logprobs = None if top is None else token_logprobs(row[:count], logprob_rows[lane], top)
            text = None
            if request.detokenizer is not None:
                text = request.detokenizer.push(row[:count]) + (request.detokenizer.flush() if finished else "")
            events.append(Event(request.id, row[:count], finished, error, reason, metrics, logprobs, text))
            request.known += count
            if finished:
                self._retire(request)
                del self._requests[request.id]
        return events

    def _host_record(self) -> HostRecord:
        """What the host knows of the state before the next launch (`fdecode.host_record`): the step's record of
        it (no device read) with the position bound tightened from what was read and each lane's sampling from
        its request."""
        record = self.step_fn.schedule.records.of(self.state)
        return dataclasses.replace(
            record, max_position=self._position_bound(record.max_position), lane_sampling=self._lane_sampling()
        )

    def _position_bound(self, own: int | None) -> int:
        """Upper bound on every running lane's base_pos before the next launch, from what was read.

        A lane's base_pos is its committed count minus one, and at most one step of it (<= W tokens)
        is still unread; a lane primed since the last launch sits at len(prompt) = known. The step's
        own bound `own` (prefill + W per step) is valid too and only grows, so the tighter one is used:
        it lets the window shrink again when long requests finish.
        """
        read = max(r.known for r in self._lanes if r is not None) + self.config.W - 1
        return read if own is None else min(own, read)

    def _lane_sampling(self) -> tuple[tuple[float, int, float, bool] | None, ...]:
        """`SamplingParams.plan_inputs` of each lane's request, None for a free lane: the step picks its
        sampling plan from it, so a batch that has no random request left runs the greedy graph, and one
        with no request using a logit processor the graph without them."""
        return tuple(None if r is None else r.params.plan_inputs for r in self._lanes)

    def _retire(self, request: Request) -> None:
        if self.grammars is not None:
            self.grammars.release(request.lane)
        self._lanes[request.lane] = None
        self.allocator.free(request.blocks)
        request.blocks, request.lane = [], None

    def _blocks_wanted(self, request: Request) -> int:
        """Blocks covering every position the next launched step can write (see the module docstring)."""
        cfg = self.config
        last_position = request.known - 1 + 2 * cfg.W + cfg.K
        return min(request.blocks_needed, last_position // cfg.block_size + 1)

    def _extend(self) -> bool:
        """Hand running lanes the blocks the next step may reach, oldest request first; one small table write
        if any. Returns whether a lane is left short (overcommit: the pool ran dry), so no newcomer is
        admitted while it is."""
        lanes, columns, blocks, short = [], [], [], False
        for request in sorted((r for r in self._lanes if r is not None), key=lambda r: r.id):
            more = self._blocks_wanted(request) - len(request.blocks)
            got = self.allocator.allocate(more) if more > 0 else None
            if got is None:
                short |= more > 0  # pool dry: the device stops the lane if it really gets there
                continue
            lanes += [request.lane] * len(got)
            columns += range(len(request.blocks), len(request.blocks) + len(got))
            blocks += got
            request.blocks += got
        if blocks:
            lanes, columns, blocks = self._uploads(torch.tensor([lanes, columns, blocks], dtype=torch.int64))[0]
            table = self.state.block_tables.index_put((lanes, columns), blocks)
            self.state = self.state.replace(block_tables=table)
        return short

    def _admit(self) -> None:
        """Prime waiting requests into free lanes; their first tokens are read with the next output."""
        free_lanes = [lane for lane, r in enumerate(self._lanes) if r is None]
        admitted: list[Request] = []
        while self._waiting and len(admitted) < len(free_lanes):
            head = self._waiting[0]
            running = [r for r in self._lanes if r is not None] + admitted
            promised = sum(r.blocks_needed - len(r.blocks) for r in running)
            if not self.overcommit and self.allocator.num_free - promised < head.blocks_needed:
                break  # its growth could not be guaranteed: wait for blocks to return
            if self.grammars is not None and not self.grammars.fits([r.params.grammar for r in admitted + [head]]):
                break  # its grammar does not fit beside the running lanes' ones: wait for lanes to finish
            blocks = self.allocator.allocate(self._blocks_wanted(head))
            if blocks is None:
                break  # first come, first served: wait for blocks to return
            request = self._waiting.popleft()
            request.blocks, request.lane = blocks, free_lanes[len(admitted)]
            admitted.append(request)
        if not admitted:
            return
        for request in admitted:
            self.policy.admit(request.lane)  # a new prompt may be worth drafting from
        cfg = self.config
        table = block_table([r.blocks for r in admitted], cfg)
        for request in admitted:
            self._lanes[request.lane] = request
        lanes = [r.lane for r in admitted]
        self.state = self.step_fn.prime(
            self.state,
            lanes,
            [r.prompt for r in admitted],
            block_tables=table,
            budgets=[r.budget for r in admitted],
            params=[r.params for r in admitted],
            uploads=self._uploads,
            grammars=self.grammars,
            host=self.step_fn.schedule.records.of(self.state),  # what the host knows of it, never a device read
        )
        self._prime_host.copy_(self.state.output, non_blocking=True)
        self._primed_lanes = lanes

    def __repr__(self) -> str:
        return (
            f"Engine(active={self.num_active}/{self.config.max_batch}, waiting={self.num_waiting}, "
            f"steps={self.steps}, {self.allocator})"
        )
