"""`DraftGate`: when an `Engine` stops verifying n-gram drafts, and when it tries them again
(docs/design.md, "Prompt lookup: n-gram drafts").

A step's shapes are fixed, so every lane verifies K + 1 rows, proposal or not. The host cannot see a
proposal in time, but it sees (one step behind) how many drafts each verified step accepted. The gate
keeps a running mean of the most drafts any running lane accepted per verified step (the plain mean
of the first 1 / weight steps, then an exponential one); while it is below `threshold` the Engine runs
first-row steps (`Step(..., speculate=False)`: one target row, one token per lane, the next window
still proposed) for a pause that doubles each time a trial step fails again, up to `max_pause`; after
a pause one trial step is verified. A trial that accepts enough resets the pause; admitting a request
resets it all.

Lossless either way: a first-row step commits what target-only decoding would. The schedule depends
only on the outputs, so a run is reproducible; but a random lane's draws then depend on its batch,
which `DecodeConfig(draft_gate=False)` avoids.
"""

from __future__ import annotations

import torch


class DraftGate:
    """Decides, per launch, whether the next step verifies its drafts (`speculate()`), from what the
    verified steps accepted (`observe`), read one step behind. The on/off case of the depth policies
    (`fdecode.runtime.policy.DepthPolicy`): `launch` gives K or 0."""

    reads_ready = False

    def __init__(self, num_draft_tokens: int, *, threshold: float = 0.5, weight: float = 0.25, max_pause: int = 32):
        if not 0 < weight <= 1:
            raise ValueError(f"DraftGate weight must be in (0, 1], got {weight!r}")
        if max_pause < 1:
            raise ValueError(f"DraftGate max_pause must be >= 1, got {max_pause!r}")
        self.num_draft_tokens = num_draft_tokens
        self.threshold, self.weight, self.max_pause = threshold, weight, max_pause
        self.verified = 0  # steps launched that verify their drafts
        self.first_row = 0  # steps launched that verify the first row only
        self.depth: int | None = None  # the last launch's: K or 0 (`launch`)
        self.reset()

    def reset(self) -> None:
        """Trust the drafts again (a request was admitted): the mean starts at K, no pause."""
        self.rate = float(self.num_draft_tokens)  # running mean of drafts accepted per verified step (K: none seen)
        self.seen = 0  # verified steps observed since the reset
        self.pause = 1  # first-row steps in the next pause
        self.left = 0  # first-row steps left in this pause
        self.trial = False  # a trial is launched and its output not yet read

    def speculate(self) -> bool:
        """Whether the next launched step verifies its drafts (and counts it)."""
        if self.left or self.trial:
            self.left = max(self.left - 1, 0)
            self.first_row += 1
            return False
        self.verified += 1
        self.trial = self.rate < self.threshold  # a trial: wait for its outcome before verifying again
        return True

    def observe(self, drafts_accepted: int) -> None:
        """A verified step's output was read: the most drafts any running lane accepted in it."""
        self.seen += 1
        self.trial = False
        self.rate += max(self.weight, 1 / self.seen) * (drafts_accepted - self.rate)  # the first replaces K
        if self.rate >= self.threshold:
            self.pause, self.left = 1, 0
        elif not self.left:
            self.left, self.pause = self.pause, min(2 * self.pause, self.max_pause)

    def launch(self, ready=None) -> tuple[int, bool]:
        """The `DepthPolicy` face of `speculate`: the next launch's depth (K, or 0 for a first-row step) and
        whether it verifies its drafts, which `observe_output` gets back with the step's output."""
        speculate = self.speculate()
        self.depth = self.num_draft_tokens if speculate else 0
        return self.depth, speculate

    def observe_output(self, packed: torch.Tensor, speculated: bool = True) -> None:
        """`observe` a verified step's packed output (`StepOutput.packed`, read on the host): the lanes still
        running after it; none running (all finished or free) tells nothing (a trial is tried again). A
        first-row step's output (`speculated` False) tells nothing of the drafts."""
        if not speculated:
            return
        counts = packed[:, -2][packed[:, -1] == 0]
        if counts.numel():
            self.observe(int(counts.max()) - 1)
        else:
            self.trial = False

    @property
    def launches(self) -> dict[int, int]:
        """Steps launched at each depth: K (verified) and 0 (first row)."""
        return {self.num_draft_tokens: self.verified, 0: self.first_row}

    def observe_cost(self, depth: int, seconds: float) -> None:
        """Nothing: the gate weighs acceptance alone (a lookup costs nothing)."""

    def admit(self, lane: int) -> None:
        """A request was admitted: a new prompt may be worth drafting from (`reset`)."""
        self.reset()

    def __repr__(self) -> str:
        return (
            f"DraftGate(rate={self.rate:.2f}, threshold={self.threshold}, pause={self.pause}, "
            f"verified={self.verified}, first_row={self.first_row})"
        )
