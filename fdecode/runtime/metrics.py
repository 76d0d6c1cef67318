"""Acceptance metrics: what speculation paid, per request and over an `Engine`'s run
(docs/design.md, "Acceptance metrics").

Counted from the packed step outputs the Engine already reads (`StepOutput`: per lane the count L and
the drafts D its verified rows carried), so they cost no device read. A row is one of:
- a *verified step* (D > 0): D drafts proposed, min(L - 1, D) accepted: of the L tokens it commits the
  last is the target's own (the correction, or the bonus when all D pass);
- a *first-row step* (D == 0, L > 0): depth 0, a pause of the n-gram draft gate, or a window with no
  proposal: one token, nothing to accept;
- priming's first token (read apart by the Engine) or an empty row (L == 0): neither.
A step cut short by a stop id, the budget or a KV overflow may end on an accepted draft rather than the
target's token, so it may count one accepted draft too few. Either way a request that ran to its end
committed exactly 1 + drafts_accepted + verified_steps + first_row_steps tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class RequestMetrics:
    """One request's counts (on its finished `Event`, or a cancelled one's so far)."""

    drafts_proposed: int = 0  # drafts its verified steps checked (sum of D)
    drafts_accepted: int = 0  # of those, the accepted ones (sum of min(L - 1, D))
    verified_steps: int = 0  # steps that checked at least one draft
    first_row_steps: int = 0  # steps that committed one token with no draft to check

    @property
    def acceptance_rate(self) -> float:
        """drafts_accepted / drafts_proposed (0.0 when nothing was proposed)."""
        return self.drafts_accepted / self.drafts_proposed if self.drafts_proposed else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per verified step: (drafts_accepted + verified_steps) / verified_steps, the accepted
        drafts plus the target's token of each (0.0 with no verified step): what one target forward yields
        when it verifies drafts (first-row steps and priming's token are left out)."""
        return (self.drafts_accepted + self.verified_steps) / self.verified_steps if self.verified_steps else 0.0

    def counted(self, num_tokens: int, num_drafts: int) -> RequestMetrics:
        """These counts with one more step row read: L = `num_tokens` committed, D = `num_drafts` verified."""
        if num_tokens == 0:
            return self
        if num_drafts == 0:
            return replace(self, first_row_steps=self.first_row_steps + 1)
        accepted = min(num_tokens - 1, num_drafts)
        return RequestMetrics(
            self.drafts_proposed + num_drafts,
            self.drafts_accepted + accepted,
            self.verified_steps + 1,
            self.first_row_steps,
        )


class SpecMetrics:
    """An Engine's counts over every step row it read for a request (`Engine.metrics`, kept up to date):
    `totals` (a `RequestMetrics` summed over requests) and, per draft position i (0-based), of the verified
    steps whose window carried more than i drafts, how many accepted more than i."""

    def __init__(self, num_draft_tokens: int) -> None:
        self.totals = RequestMetrics()
        self.carried = [0] * num_draft_tokens  # [K] verified steps whose window carried > i drafts
        self.accepted = [0] * num_draft_tokens  # [K] of those, the steps that accepted > i

    def count(self, num_tokens: int, num_drafts: int) -> None:
        """One step row read for a request (the same L and D as `RequestMetrics.counted`)."""
        before = self.totals
        self.totals = before.counted(num_tokens, num_drafts)
        for i in range(self.totals.drafts_proposed - before.drafts_proposed):
            self.carried[i] += 1
        for i in range(self.totals.drafts_accepted - before.drafts_accepted):
            self.accepted[i] += 1

    @property
    def mean_accepted_length(self) -> float:
        return self.totals.mean_accepted_length

    @property
    def acceptance_by_position(self) -> list[float | None]:
        """[K]: per draft position, the fraction of the steps that carried it that accepted it (None where no
        step carried it: a depth never launched)."""
        return [a / c if c else None for a, c in zip(self.accepted, self.carried)]

    def __repr__(self) -> str:
        t = self.totals
        positions = ", ".join("-" if r is None else f"{r:.2f}" for r in self.acceptance_by_position)
        return (
            f"SpecMetrics(verified_steps={t.verified_steps}, first_row_steps={t.first_row_steps}, "
            f"drafts={t.drafts_accepted}/{t.drafts_proposed} accepted ({t.acceptance_rate:.2f}), "
            f"mean_accepted_length={t.mean_accepted_length:.2f}, by_position=[{positions}])"
        )
