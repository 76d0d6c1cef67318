"""Tensor parallelism on a subgroup: a 4-process gloo world split into TP groups [0, 1] and [2, 3].

A DP x TP layout runs one step per TP group; the group [2, 3] does not start at global
rank 0, so every collective's source must be a rank *within* the group (the functional
broadcast of `broadcast_accepted` takes one). Each group must decode exactly what a
single process does, and `broadcast_accepted` must make the group's second rank follow
its first even when it samples with other seeds.
"""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist
from support.tp_worker import (
    PERTURBED_SEEDS,
    PROMPTS,
    SAMPLING,
    accepted_per_step,
    decode_config,
    partial_draft,
    spawn_ranks,
    target_model,
)

import fdecode
from fdecode.models import group_exit

WORLD = 4
GROUPS = ([0, 1], [2, 3])
NEW_TOKENS = 6
STEPS = 6
TIMEOUT_S = 300  # a collective some rank never joins would otherwise hang the suite


def greedy(step) -> list[list[int]]:
    return fdecode.generate(step, PROMPTS, max_new_tokens=NEW_TOKENS, progress=False)


def run_rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    groups = [dist.new_group(ranks) for ranks in GROUPS]  # every rank creates every group
    group = groups[rank // 2]
    target = target_model()
    step = fdecode.compile(
        target, partial_draft(target), decode_config(tp_size=2, broadcast_accepted=True), tp_group=group
    )
    # The group's second rank samples with other seeds: a stand-in for a rank whose kernels disagree.
    seeds = PERTURBED_SEEDS if dist.get_rank(group) == 1 else SAMPLING["seed"]
    result = {"greedy": greedy(step), "random": accepted_per_step(step, STEPS, seeds)}
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    group_exit.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return spawn_ranks(run_rank, WORLD, tmp_path_factory.mktemp("tp_subgroup"), TIMEOUT_S)


def test_broadcast_accepted_on_groups_not_starting_at_rank0(ranks):
    target = target_model()
    single = fdecode.compile(target, partial_draft(target), decode_config())
    want_greedy = greedy(single)
    want_random = accepted_per_step(single, STEPS, SAMPLING["seed"])  # the unperturbed run
    for rank, result in enumerate(ranks):
        assert result["greedy"] == want_greedy, f"rank {rank}"
        # Both ranks of each group commit their first rank's (unperturbed) tokens.
        assert torch.equal(result["random"], want_random), f"rank {rank}"
