"""Helpers the tests share (tests/ is on sys.path, so a test imports `from support.<module> import ...`).

- llama_models:     tiny random Llamas, their draft kinds and MTP heads; transformers' greedy output (`hf_greedy`)
- hybrid_models:    tiny Qwen3.5 / Qwen3-Next hybrids (Gated DeltaNet + attention), their oracle and run loops
- deepseek_models:  tiny DeepSeek-V3 (MLA, MoE) models and checkpoints with MTP layers, their oracle
- glm_models:       tiny GLM-4.5 (`glm4_moe`) models and checkpoints with MTP layers, their oracle
- runs:             run loops over the tiny Llama pair (`build`, `run`, `partial_step`, `run_lanes`)
- ngram_steps:      n-gram (prompt-lookup) steps and prompts with matches of every kind
- tiny_vocab:       the 5-token vocabulary: tiny models, the exact distribution of the next three tokens
- hand_grammar:     token automata written by hand, their pool tables and a Python walker (grammar tests' oracle)
- processor_oracle: transformers' greedy generate under a request's penalties, logit bias and min_tokens
- stats:            chi-square p-values at ALPHA, the sort-based filter reference, a two-token distribution check
- prepare_cases:    random inputs of `prepare_next_draft` compared with its reference (CPU, CUDA, Triton)
- device_reads:     `DeviceReads`, a mode that raises where the host would wait for the device, on a CPU
- probes:           the largest CPU allocation of a call; steps under a device's sync debug mode "error"
- kernel_semantics: device attention kernels as documented, in plain torch, installed as fakes
- tokenizers:       a tiny byte-level BPE and a tiny SentencePiece-style tokenizer, built offline
- tp_worker:        the rank side of the tensor-parallel tests (spawned gloo processes)
- kernel_files:     the kernel C++ files in an Inductor cache: fdecode's batches and Inductor's single kernels
- serving:          a free port; a `fdecode.serve.Server` served from a background thread (`running`)
"""
