"""`fdecode serve` on 127.0.0.1, driven by the official `openai` client and by httpx.

One server (the bundled model, eager backend: nothing compiles) is shared by the whole file. Every
answer is checked against `fdecode.generate` on a second step of the same model and config (the
server's step belongs to its engine thread), run alone.
"""

from __future__ import annotations

import functools
import json
import threading
import time

import pytest

pytest.importorskip("fastapi", reason='needs the serve extra: pip install -e ".[serve]"')
openai = pytest.importorskip("openai", reason='needs the openai client: pip install -e ".[test]"')
httpx = pytest.importorskip("httpx", reason='needs httpx: pip install -e ".[test]"')

from support.serving import running  # noqa: E402

import fdecode  # noqa: E402
from fdecode.serve import Server, load, server_config  # noqa: E402
from fdecode.serve.errors import APIError  # noqa: E402
from fdecode.serve.loop import EngineLoop, Job  # noqa: E402

CONFIG = dict(backend="eager", max_batch=3, max_seq_len=128, max_grammar_states=256, max_grammar_transitions=8192)
NAME = "fdecode-tiny"
PROMPTS = ("import os\nimport sys\n\n", "class Node:\n    def __init__(self", "def main():\n    ")


@pytest.fixture(scope="module")
def server():
    server = Server(load(None, **CONFIG), drain_timeout=5)
    with running(server) as url:
        server.url = url
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@functools.cache
def reference_step():
    model = load(None, **CONFIG)
    return model.step, model.tokenizer


def alone(prompt, max_tokens: int, **params) -> fdecode.Completion:
    """The request run alone by the library: `fdecode.generate`, greedy, on its own step."""
    step, tokenizer = reference_step()
    return fdecode.generate(step, [prompt], max_new_tokens=max_tokens, temperature=0, tokenizer=tokenizer,
                            details=True, **params)[0]  # fmt: skip


def streamed(chunks) -> tuple[str, str | None]:
    text, finish = "", None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        piece = choice.delta.content if hasattr(choice, "delta") else choice.text
        text += piece or ""
        finish = choice.finish_reason or finish
    return text, finish


def wait_idle(server, timeout=30.0) -> None:
    deadline = time.monotonic() + timeout
    while server.loop.in_flight or server.loop.engine.num_active or server.loop.engine.num_waiting:
        assert time.monotonic() < deadline, f"lanes still held: {server.loop!r}"
        time.sleep(0.05)


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list()] == [NAME]
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"


def test_a_tree_config_serves_the_chains_text():
    """`fdecode serve -k 4 --draft-topk 2 --draft-depth 2 --no-adaptive-depth`: the bundled model drafts a tree
    with its MTP head at every step (adaptive, a CPU's Engine starts at the chain: `Step.first_depth`), and greedy
    completions equal the chain config's run alone."""
    tree = load(None, **{**CONFIG, "num_draft_tokens": 4, "draft_topk": 2, "draft_depth": 2, "adaptive_depth": False})
    assert tree.step.config.tree and tree.step.depths == (0, 1, 2, 3, 4)
    with running(Server(tree, drain_timeout=5)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for prompt in PROMPTS:
            got = client.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0)
            assert got.choices[0].text == alone(prompt, 12).text


def test_serve_refuses_a_tree_that_cannot_be_before_loading(monkeypatch, capsys):
    from fdecode.serve import cli
    from fdecode.serve import model as served

    monkeypatch.setattr(served, "load_pair", lambda *a: pytest.fail("loaded weights for a config it refuses"))
    assert cli.main(["-k", "4", "--draft-topk", "2", "--draft-depth", "5", "--backend", "eager"]) == 2
    assert "draft_depth=5 needs at least one node a level" in capsys.readouterr().err


def test_serve_passes_the_draft_flags_to_the_config(monkeypatch, capsys):
    """`fdecode serve`'s draft flags reach `load` (then `DecodeConfig`): --no-adaptive-depth, a tree's shape."""
    import fdecode.serve
    from fdecode.serve import cli

    seen = []

    def refuse(*args, **config):
        seen.append(config)
        raise ValueError("stopped before loading")

    monkeypatch.setattr(fdecode.serve, "load", refuse)
    assert cli.main(["-k", "6", "--draft-topk", "2", "--draft-depth", "3", "--no-adaptive-depth"]) == 2
    assert cli.main(["-k", "4"]) == 2
    assert cli.main(["-k", "4", "--draft-topk", "1"]) == 2
    assert "stopped before loading" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):  # argparse refuses it
        cli.main(["--draft-topk", "wide"])
    assert "expected 'auto' or an int, got 'wide'" in capsys.readouterr().err
    tree, auto, chain = (
        {f: c[f] for f in ("num_draft_tokens", "draft_topk", "draft_depth", "adaptive_depth")} for c in seen
    )
    assert tree == dict(num_draft_tokens=6, draft_topk=2, draft_depth=3, adaptive_depth=False)
    assert auto == dict(num_draft_tokens=4, draft_topk="auto", draft_depth=None, adaptive_depth=True)
    assert chain == dict(auto, draft_topk=1)


@pytest.mark.parametrize("stream", [False, True])
def test_completion_equals_generate(client, stream):
    want = alone(PROMPTS[0], 20)
    response = client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=20, temperature=0, stream=stream)
    text, finish = streamed(response) if stream else (response.choices[0].text, response.choices[0].finish_reason)
    assert text == want.text and finish == want.reason == "length"
    if not stream:
        assert response.usage.completion_tokens == len(want.tokens)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_equals_generate_and_reports_usage(client, stream):
    messages = [{"role": "system", "content": "python"}, {"role": "user", "content": "def add(a, b):"}]
    want = alone(messages, 16)
    response = client.chat.completions.create(model=NAME, messages=messages, max_tokens=16, temperature=0,
                                              stream=stream, stream_options={"include_usage": True} if stream else None)  # fmt: skip
    if stream:
        chunks = list(response)
        text, finish = streamed(chunks)
        usage = chunks[-1].usage
        assert not chunks[-1].choices and all(c.usage is None for c in chunks[:-1])
        assert chunks[0].choices[0].delta.role == "assistant"
    else:
        text, finish, usage = response.choices[0].message.content, response.choices[0].finish_reason, response.usage
    assert text == want.text and finish == want.reason
    assert usage.completion_tokens == len(want.tokens) and usage.total_tokens == usage.prompt_tokens + len(want.tokens)


def test_concurrent_requests_each_equal_their_run_alone(client):
    """Five at once on three lanes: two wait for a lane; each gets what it gets alone."""
    jobs = [(PROMPTS[i % 3], 8 + 5 * i) for i in range(5)]
    results: dict[int, str] = {}

    def ask(i: int) -> None:
        prompt, n = jobs[i]
        stream = client.completions.create(model=NAME, prompt=prompt, max_tokens=n, temperature=0, stream=True)
        results[i] = streamed(stream)[0]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == {i: alone(p, n).text for i, (p, n) in enumerate(jobs)}


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_match_across_tokens(client, stream):
    """Every token of the bundled model is one byte: a 3-character stop string spans 3 tokens."""
    full = alone(PROMPTS[1], 24).text
    stop = full[6:9]
    response = client.completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=24, temperature=0, stop=[stop, "@@@"],
                                         stream=stream)  # fmt: skip
    text, finish = streamed(response) if stream else (response.choices[0].text, response.choices[0].finish_reason)
    assert (text, finish) == (full[: full.index(stop)], "stop")


def test_multibyte_text_never_streams_broken_characters(client):
    """A regex forcing 'é' (two bytes, two tokens of the byte vocabulary) over and over: every chunk is
    whole characters."""
    response = client.completions.create(model=NAME, prompt="x = '", max_tokens=9, temperature=0, stream=True,
                                         extra_body={"guided_regex": "(é|日){2,4}"})  # fmt: skip
    pieces = [c.choices[0].text for c in response if c.choices]
    text = "".join(pieces)
    assert 2 <= len(text) <= 4 and set(text) <= {"é", "日"}
    assert not any("\ufffd" in p for p in pieces)


def test_json_schema_output_parses(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
              "required": ["ok", "n"], "additionalProperties": False}  # fmt: skip
    response = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "answer in JSON"}], max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    )  # fmt: skip
    value = json.loads(response.choices[0].message.content)
    assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and isinstance(value["n"], int)
    assert response.choices[0].finish_reason == "stop"


def test_logprobs_with_top_alternatives_equal_the_library(client):
    messages = [{"role": "user", "content": "for i in range(10):"}]
    step, tokenizer = reference_step()
    want = fdecode.generate(step, [messages], fdecode.SamplingParams(max_new_tokens=10, logprobs=3,
                            eos_token_id=tokenizer.eos_token_id), tokenizer=tokenizer, details=True)[0]  # fmt: skip
    response = client.chat.completions.create(model=NAME, messages=messages, max_tokens=10, temperature=0,
                                              logprobs=True, top_logprobs=3)  # fmt: skip
    content = response.choices[0].logprobs.content
    assert [bytes(c.bytes) for c in content] == [bytes([t]) for t in want.tokens if t < 256]
    for got, lp in zip(content, want.logprobs):
        assert got.logprob == pytest.approx(lp.logprob, abs=1e-5)
        assert len(got.top_logprobs) == 3
        assert got.top_logprobs[0].bytes == got.bytes  # greedy: the chosen token is the most probable
        assert [t.logprob for t in got.top_logprobs] == pytest.approx(list(lp.top.values()), abs=1e-5)
    eos = client.chat.completions.create(model=NAME, messages=messages, max_tokens=4, temperature=0, logprobs=True,
                                         top_logprobs=2, logit_bias={"257": 100})  # the EOS id: no text  # fmt: skip
    assert eos.choices[0].finish_reason == "stop" and eos.choices[0].message.content == ""
    assert [(c.token, c.bytes) for c in eos.choices[0].logprobs.content] == [("", [])]
    completion = client.completions.create(model=NAME, prompt=PROMPTS[2], max_tokens=5, temperature=0, logprobs=2)
    lps = completion.choices[0].logprobs
    assert len(lps.tokens) == len(lps.token_logprobs) == len(lps.top_logprobs) == 5
    assert all(1 <= len(top) <= 2 and lp <= 0 for top, lp in zip(lps.top_logprobs, lps.token_logprobs))


BAD = [
    ("malformed JSON", b'{"model": "fdecode-tiny", "prompt": ', 400),
    ("not an object", b"[1, 2]", 400),
    ("wrong type", {"prompt": "x", "max_tokens": "many"}, 400),
    ("wrong type of messages", {"messages": "hello"}, 400),
    ("negative max_tokens", {"prompt": "x", "max_tokens": -5}, 400),
    ("absurd max_tokens", {"prompt": "x", "max_tokens": 10**9}, 400),
    ("prompt longer than the context", {"prompt": "x" * 300}, 400),
    ("unknown model", {"model": "gpt-9", "prompt": "x"}, 404),
    ("grammar refused", {"prompt": "x", "guided_regex": "(unclosed"}, 400),
    ("grammar too big for the pool", {"prompt": "x", "guided_regex": "[a-z]{300}"}, 400),
    ("unsupported parameter", {"prompt": "x", "tools": [{"type": "function"}]}, 400),
    ("n > 1", {"prompt": "x", "n": 2}, 400),
    ("several prompts", {"prompt": ["a", "b"]}, 400),
    ("token id outside the vocabulary", {"prompt": [1, 2, 100000]}, 400),
    ("temperature out of range", {"prompt": "x", "temperature": -1}, 400),
    ("top_logprobs past the limit", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 99}, 400),
    ("logit_bias key not an id", {"prompt": "x", "logit_bias": {"abc": 1}}, 400),
]  # fmt: skip


@pytest.mark.parametrize("name, body, status", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_4xx_with_an_openai_error_body_and_the_server_keeps_serving(server, name, body, status):
    chat = isinstance(body, dict) and "messages" in body
    url = f"{server.url}/v1/{'chat/completions' if chat else 'completions'}"
    if isinstance(body, bytes):
        r = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=60)
    else:
        r = httpx.post(url, json={"model": NAME, **body}, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["type"]
    ok = httpx.post(f"{server.url}/v1/completions", json={"model": NAME, "prompt": "x", "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_the_official_client_raises_its_own_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError, match="n=3"):
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}], n=3)


def test_a_dropped_stream_frees_its_lane(server):
    body = {"model": NAME, "prompt": PROMPTS[0], "max_tokens": 100, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        assert server.loop.in_flight == 1
    wait_idle(server)  # the client left after one chunk: cancelled long before its 100 tokens
    assert server.loop.engine.allocator.num_free == server.loop.engine.allocator.capacity


def test_an_engine_failure_ends_that_request_only(server, client):
    engine = server.loop.engine

    def fail():
        raise RuntimeError("injected")

    engine.step = fail  # the next step of this Engine raises; the loop then starts a fresh one
    with pytest.raises(openai.InternalServerError, match="injected"):
        client.completions.create(model=NAME, prompt="x", max_tokens=4, temperature=0)
    assert server.loop.engine is not engine
    again = client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=6, temperature=0)
    assert again.choices[0].text == alone(PROMPTS[0], 6).text


def test_a_full_queue_is_refused_with_429():
    step = reference_step()[0]
    loop = EngineLoop(step, max_waiting=1)  # not started: jobs stay queued
    jobs = [Job([1, 2], fdecode.SamplingParams(max_new_tokens=2), lambda item: None) for _ in range(5)]
    for job in jobs[:4]:  # 3 lanes + 1 waiting
        loop.submit(job)
    with pytest.raises(APIError) as refused:
        loop.submit(jobs[4])
    assert refused.value.status == 429 and "full" in refused.value.message


def test_metrics_page(server, client):
    client.completions.create(model=NAME, prompt=PROMPTS[2], max_tokens=12, temperature=0)
    assert httpx.post(f"{server.url}/v1/completions", json={"model": "nope", "prompt": "x"}).status_code == 404
    page = httpx.get(f"{server.url}/metrics").text
    values = {}
    for line in page.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    label = f'{{model="{NAME}"}}'
    assert values[f"fdecode_generation_tokens_total{label}"] >= 12
    assert values[f"fdecode_time_to_first_token_seconds_count{label}"] >= 1
    assert values[f"fdecode_inter_token_latency_seconds_count{label}"] >= 1
    assert (
        values[f"fdecode_draft_tokens_proposed_total{label}"]
        >= values[f"fdecode_draft_tokens_accepted_total{label}"]
        > 0
    )
    assert values[f"fdecode_mean_accepted_length{label}"] > 1
    assert f"fdecode_requests_running{label}" in values and f"fdecode_requests_waiting{label}" in values
    assert 0 <= values[f"fdecode_draft_depth{label}"] <= server.model.config.K
    assert values[f'fdecode_requests_rejected_total{{model="{NAME}",status="404"}}'] >= 1


def test_server_config_switches_every_request_feature_on():
    cfg = server_config(max_batch=2, max_seq_len=64)
    assert cfg.penalties and cfg.min_tokens and cfg.max_logprobs == 20 and cfg.max_logit_bias > 0
    assert cfg.max_grammar_states > 0 and cfg.max_grammar_transitions > 0


def test_sigterm_finishes_the_streams_in_flight_then_exits(tmp_path):
    """`fdecode serve` in its own process: SIGTERM mid-stream; the stream still ends with all its tokens
    (equal to its run alone), then the process exits cleanly and stops listening."""
    import os
    import signal
    import subprocess
    import sys

    from support.serving import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-m", "fdecode.cli", "serve", "--port", str(port), "--backend", "eager",
           "--max-batch", "2", "--max-seq-len", "128", "--drain-timeout", "60", "--log-level", "warning"]  # fmt: skip
    process = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
            time.sleep(0.1)
        body = {"model": NAME, "prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0, "stream": True}
        text, finish = "", None
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                if finish is None and not text:
                    process.send_signal(signal.SIGTERM)  # after the first chunk
                choice = json.loads(line[5:])["choices"][0]
                text += choice["text"]
                finish = choice["finish_reason"] or finish
        assert (text, finish) == (alone(PROMPTS[0], 12).text, "length")
        assert process.wait(timeout=60) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=2)
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.parametrize("mode", [[], ["--chaos"]], ids=["load", "chaos"])
def test_the_load_bench_runs_quick(mode, capsys):
    """bench/serve_load.py --quick: every streamed text equals the offline one; the chaos run ends with no
    lane or KV block held and the server healthy."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "serve_load.py"
    spec = importlib.util.spec_from_file_location("serve_load", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--quick", *mode]) == 0
    out = capsys.readouterr().out
    assert ("chaos: passed" in out) if mode else ("streamed texts equal to offline: 4/4" in out and "TTFT" in out)
