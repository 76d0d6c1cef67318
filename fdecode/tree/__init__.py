"""Draft trees in the one step graph (docs/design.md, "Trees").

- `shape`: the tree a `DecodeConfig` asks for (`draft_topk`, `draft_depth`) and what refuses it;
- `auto`: what the default, `draft_topk="auto"`, resolves to (a tree on an accelerator, the chain on a CPU);
- `draft`: a draft LM drafting a tree level by level, keeping the N best nodes by path probability;
- `draft_state`: a recurrent (hybrid) draft LM's state, committed through the root and branched per node;
- `processing`: the request features per node (each row after its own path: penalties, min_tokens, grammars);
- `step`: the tree step: the target once over the N nodes (tree attention), greedy or lossless random
  verification (`fdecode.ops.tree`), the accepted path's KV moved to the lane's next positions.

`fdecode.step.decode_step` hands a tree config's step to `tree_step`; the chain's code is untouched.
"""
