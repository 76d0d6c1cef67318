"""The pure step function each step graph captures, one code object per `GraphKey`
(docs/design.md, "Backends and kernels").

`pure_step` binds the models, the config and a key to `fdecode.step.decode_step`. Dynamo caches compiled
graphs (and counts recompiles) per code object, so each gets one of its own (`fresh_code`): two steps, or two
keys of one step, never evict each other. The graph of every window (key window None) takes the window as a
second argument, a [blocks, 0] tensor (`window_width`) whose length the graph reads as a symbolic size.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable

import torch

from fdecode.config import DecodeConfig
from fdecode.graphs.graph_key import GraphKey
from fdecode.models.regions import shares_parameters
from fdecode.ops.plan import SamplingPlan
from fdecode.state import DecodeState, StepOutput
from fdecode.step import decode_step


def fresh_code(fn: Callable, name: str) -> Callable:
    """`fn` with a code object of its own. Dynamo caches compiled graphs (and counts recompiles,
    up to `cache_size_limit`) per code object; giving every Step its own means two steps with
    different configs never evict each other or count as each other's recompiles."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, name, fn.__defaults__, fn.__closure__)


def pure_step(target, draft, config: DecodeConfig, key: GraphKey) -> Callable:
    """The pure step of `key`: for a window of `key.window` blocks, or (None) for any window: then it takes
    the window as a second argument, a [blocks, 0] tensor (`window_width`) whose length the graph reads as a
    symbolic size. A code object of its own (`fresh_code`) per key (see `decode_step`)."""
    blocks, plan, depth, catch_up = key.window, key.plan, key.depth, key.catch_up
    config = plan_config(config, plan)
    draft_regions = config.layer_regions and not shares_parameters(target, draft)  # once, not in every trace
    name = "".join(c if c.isalnum() else "_" for c in plan.name) + key.suffix(config.K)
    if blocks is None:

        def any_window(state: DecodeState, width: torch.Tensor) -> tuple[DecodeState, StepOutput]:
            return decode_step(
                target,
                draft,
                config,
                state,
                context_blocks=width,
                plan=plan,
                depth=depth,
                catch_up=catch_up,
                draft_regions=draft_regions,
            )

        return fresh_code(any_window, f"fdecode_step_any_window_{name}")

    def step(state: DecodeState) -> tuple[DecodeState, StepOutput]:
        return decode_step(
            target,
            draft,
            config,
            state,
            context_blocks=blocks,
            plan=plan,
            depth=depth,
            catch_up=catch_up,
            draft_regions=draft_regions,
        )

    return fresh_code(step, f"fdecode_step_ctx{blocks * config.block_size}_{name}")


def plan_config(config: DecodeConfig, plan: SamplingPlan) -> DecodeConfig:
    """The config a plan's graph is traced with: without the logit processors where the plan leaves them out
    (no lane uses one; their state leaves pass through untouched)."""
    if not plan.unprocessed:
        return config
    return dataclasses.replace(config, penalties=False, min_tokens=False, max_logit_bias=0)


def window_width(config: DecodeConfig, blocks: int) -> torch.Tensor:
    """The window argument of the graph of every window: [blocks, 0] (no memory) on the step's device,
    its length marked dynamic from 2 blocks to the whole lane, so one compile serves every window."""
    width = torch.empty((blocks, 0), dtype=torch.int8, device=config.device)
    torch._dynamo.mark_dynamic(width, 0, min=2, max=config.blocks_per_lane)
    return width
