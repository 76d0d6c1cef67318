"""Draft trees on hybrid targets (Qwen3.5: Gated DeltaNet + gated attention) (issue 55).

Each tree node's conv window and delta-rule state continue its parent's, not the previous row's. Checked: the
recurrence over tree rows against chains over each root-to-node path.
"""

from __future__ import annotations

import torch

from fdecode.ops.delta_rule import causal_conv_rows, gated_delta_rows


def test_tree_rows_continue_their_parents_state():
    """Row j of a tree starts from the state after its parent row: its output and its state after it equal those
    of a chain over the rows of its root-to-node path."""
    gen = torch.Generator().manual_seed(0)
    parents = torch.tensor([[-1, 0, 0, 1, 2, 2, 4], [-1, 0, 1, 0, 3, 1, 5]])  # [B, Q], parents first
    b, q, hv, dk, dv, c = 2, 7, 2, 4, 3, 6
    x, window, weight = torch.randn(b, q, c, generator=gen), torch.randn(b, c, 3, generator=gen), torch.randn(c, 4)
    qk = torch.nn.functional.normalize(torch.randn(2, b, q, hv, dk, generator=gen), dim=-1)
    v, g = torch.randn(b, q, hv, dv, generator=gen), -torch.rand(b, q, hv, generator=gen)
    beta, rec = torch.rand(b, q, hv, generator=gen), torch.randn(b, hv, dk, dv, generator=gen)
    conv_out, windows = causal_conv_rows(x, window, weight, snapshots=True, parents=parents)
    o, states = gated_delta_rows(qk[0], qk[1], v, g, beta, rec, snapshots=True, parents=parents)
    for lane in range(b):
        for j in range(q):
            path = [j]
            while parents[lane, path[0]] >= 0:
                path.insert(0, int(parents[lane, path[0]]))
            rows = torch.tensor(path)
            one = slice(lane, lane + 1)
            chain_out, chain_window = causal_conv_rows(x[one, rows], window[one], weight)
            chain_o, chain_state = gated_delta_rows(*(t[one, rows] for t in (qk[0], qk[1], v, g, beta)), rec[one])
            torch.testing.assert_close(conv_out[lane, j], chain_out[0, -1], rtol=0, atol=1e-6)
            torch.testing.assert_close(windows[lane, j], chain_window[0], rtol=0, atol=0)
            torch.testing.assert_close(o[lane, j], chain_o[0, -1], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(states[lane, j], chain_state[0], rtol=1e-5, atol=1e-6)
