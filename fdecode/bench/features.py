"""The request-features workload of `fdecode bench` (`--workloads request-features`)
(docs/design.md, "Logit processors and logprobs").

At V = 151,936 with the real-vocab workload's small random target and draft, greedy lanes: the step time
of the default `DecodeConfig` against steps compiled with logprobs (`max_logprobs=5`) and with the logit
processors (penalties, min_tokens, logit bias), each with lanes that use the features and with lanes that
do not, and compiled for grammars (whose mask every lane runs), side by side in one process
(`fdecode.bench.sampling.run_sampling_workload`'s timing).
"""

from __future__ import annotations

PROCESSORS = dict(penalties=True, min_tokens=True, max_logit_bias=4)
USED = dict(
    repetition_penalty=1.1,
    frequency_penalty=0.2,
    presence_penalty=0.1,
    min_tokens=4,
    logit_bias={11: 0.5, 12: -0.5, 13: 1.0, 14: -1.0},
)
# system: (DecodeConfig changes, SamplingParams of every lane); the first is the ratios' baseline.
FEATURE_SYSTEMS = {
    "default config": ({}, {}),
    "max_logprobs=5, lanes ask none": (dict(max_logprobs=5), {}),
    "max_logprobs=5, lanes ask top-5": (dict(max_logprobs=5), dict(logprobs=5)),
    "processors compiled, lanes use none": (PROCESSORS, {}),
    "processors used": (PROCESSORS, USED),
    "everything used": ({**PROCESSORS, "max_logprobs": 5}, {**USED, "logprobs": 5}),
    # Every lane of a step compiled for grammars runs the mask (a lane without one allows everything).
    "grammars compiled, lanes use none": (dict(max_grammar_states=512, max_grammar_transitions=1 << 16), {}),
}
