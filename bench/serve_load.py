"""Load and chaos runs of `fdecode serve` on localhost (docs/serving.md, "Load and chaos runs").

    python bench/serve_load.py [--quick] [--clients 4] [--requests 32] [--max-tokens 64] [--backend eager]
    python bench/serve_load.py --chaos [--requests 200]

Load: `fdecode serve` (bundled model) in a process of its own (with --quick: a thread of this one);
`--clients` concurrent streaming clients (httpx, SSE, `stream_options.include_usage`) send `--requests`
greedy completions to `--lanes` lanes (default: as many as clients; a client sends its next request once
its last one ended, so with clients = lanes a lane idles between the two, while more clients than lanes
keep a queue, as offline has); then `fdecode.generate` runs the same prompts offline on a second step of
the same config (the same batch size), with the engine's torch thread count (`--threads`). Rounds
alternate (server, offline), so the ratio is measured side by side. Reports throughput (completion tokens
per wall second), TTFT p50/p99 (client send to first text: queueing included) and inter-token latency
p50/p99 (per request: (last text - first text) / (tokens - 1)), and checks that every streamed text
equals the offline one.
Chaos: `--requests` requests from `2 * clients` concurrent clients, each at random one of: a streamed or
whole completion (checked against its run alone), a stream dropped after a few chunks, a whole request
whose client gives up, a bad body (must be a 4xx). Afterwards no lane or KV block may be held, /health
must say ok, and one more request must still equal its run alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import torch

import fdecode
from fdecode.serve import Server, load

PROMPTS = (
    "import os\nimport sys\n\n",
    "class Node:\n    def __init__(self",
    "def main():\n    ",
    "    for key, value in ",
    "from collections import ",
    "    def __repr__(self):\n        return ",
    "if __name__ == '__main__':\n",
    "    @property\n    def ",
)


@contextlib.contextmanager
def serving(args):
    """The server's URL for the block: in a thread of this process (--quick), else `fdecode serve` apart."""
    config = dict(backend=args.backend, max_batch=args.lanes, max_seq_len=args.max_seq_len)
    if args.quick:
        with Server(load(None, **config), max_waiting=4 * args.clients).in_thread() as url:
            yield url
        return
    port = 8000 + random.Random().randrange(1000)
    cmd = [sys.executable, "-m", "fdecode.cli", "serve", "--port", str(port), "--backend", args.backend,
           "--max-batch", str(args.lanes), "--max-seq-len", str(args.max_seq_len),
           "--max-waiting", str(4 * args.clients), "--log-level", "warning", "--threads", str(args.threads)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen(cmd, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            if process.poll() is not None:
                raise RuntimeError(f"fdecode serve exited with {process.returncode}")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=120)


def held(url: str) -> tuple[int, ...]:
    """(requests in flight, running, waiting, KV blocks held) as /health and /metrics report them."""
    values = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key.split("{")[0]] = float(value)
    names = ("fdecode_requests_running", "fdecode_requests_waiting", "fdecode_kv_blocks_used")
    return (httpx.get(f"{url}/health").json()["in_flight"], *(int(values[n]) for n in names))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


async def stream_one(client: httpx.AsyncClient, url: str, body: dict) -> dict:
    sent = time.perf_counter()
    first = last = None
    text, usage, finish = "", None, None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "body": (await r.aread()).decode()}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                if choice["text"]:
                    last = time.perf_counter()
                    first = first or last
                    text += choice["text"]
                finish = choice["finish_reason"] or finish
    return {"status": 200, "text": text, "finish": finish, "sent": sent, "first": first, "last": last, "usage": usage}


def body(prompt: str, max_tokens: int, stream: bool = True) -> dict:
    out = {"model": "fdecode-tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if stream:
        out["stream_options"] = {"include_usage": True}
    return out


async def load_round(url: str, jobs: list[tuple[str, int]], clients: int) -> tuple[float, list[dict]]:
    queue: asyncio.Queue = asyncio.Queue()
    for i, job in enumerate(jobs):
        queue.put_nowait((i, job))
    results: list[dict | None] = [None] * len(jobs)

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            i, (prompt, n) = queue.get_nowait()
            results[i] = await stream_one(client, url, body(prompt, n))

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(worker(client) for _ in range(clients)))
    return time.perf_counter() - start, results


def offline(step, tokenizer, jobs: list[tuple[str, int]]) -> tuple[float, list[str]]:
    start = time.perf_counter()
    out = fdecode.generate(step, [p for p, _ in jobs], [fdecode.SamplingParams(max_new_tokens=n) for _, n in jobs],
                           tokenizer=tokenizer, details=True, progress=False)  # fmt: skip
    return time.perf_counter() - start, out


def run_load(args) -> int:
    reference = load(None, backend=args.backend, max_batch=args.lanes, max_seq_len=args.max_seq_len)
    rng = random.Random(0)
    jobs = [(rng.choice(PROMPTS), args.max_tokens) for _ in range(args.requests)]
    if args.backend != "eager":
        reference.step.warmup()
    fdecode.generate(reference.step, [PROMPTS[0]], max_new_tokens=4, tokenizer=reference.tokenizer, progress=False)
    rows = []
    with serving(args) as url:
        for r in range(args.rounds):
            wall_s, results = asyncio.run(load_round(url, jobs, args.clients))
            wall_o, want = offline(reference.step, reference.tokenizer, [(p, n) for p, n in jobs])
            # EOS ids are the tokenizer's in both (generate's text path adds them as the server does)
            bad = [i for i, (got, w) in enumerate(zip(results, want)) if got.get("text") != w.text]
            tokens_s = sum(r["usage"]["completion_tokens"] for r in results if r.get("usage"))
            tokens_o = sum(len(w.tokens) for w in want)
            ttft = [r["first"] - r["sent"] for r in results if r.get("first")]
            itl = [(r["last"] - r["first"]) / (r["usage"]["completion_tokens"] - 1) for r in results
                   if r.get("first") and r["usage"]["completion_tokens"] > 1]  # fmt: skip
            rows.append((tokens_s / wall_s, tokens_o / wall_o, ttft, itl, bad, tokens_s, tokens_o))
            print(f"round {r + 1}: server {tokens_s / wall_s:7.1f} tok/s ({tokens_s} tokens, {wall_s:.1f} s), "
                  f"offline {tokens_o / wall_o:7.1f} tok/s ({tokens_o} tokens, {wall_o:.1f} s), "
                  f"ratio {tokens_s / wall_s / (tokens_o / wall_o):.2f}; texts differing: {len(bad)}", flush=True)  # fmt: skip
    ttft = [t for row in rows for t in row[2]]
    itl = [t for row in rows for t in row[3]]
    ratios = [row[0] / row[1] for row in rows]
    print(f"\n{args.requests} requests x {args.rounds} rounds, {args.clients} streaming clients, max_batch {args.lanes}, "
          f"{args.max_tokens} max tokens, greedy, backend {reference.step.backend}, K = {reference.config.K}, "
          f"{args.threads} torch thread(s)")  # fmt: skip
    print(f"{'':24}{'server':>10}{'offline':>10}")
    print(f"{'throughput (tok/s)':24}{statistics.median(r[0] for r in rows):10.1f}"
          f"{statistics.median(r[1] for r in rows):10.1f}   ratio {statistics.median(ratios):.2f} "
          f"(per round {min(ratios):.2f}-{max(ratios):.2f})")  # fmt: skip
    print(f"TTFT p50 / p99 (ms):    {1e3 * percentile(ttft, 50):8.1f} / {1e3 * percentile(ttft, 99):.1f}")
    print(f"ITL  p50 / p99 (ms):    {1e3 * percentile(itl, 50):8.1f} / {1e3 * percentile(itl, 99):.1f}")
    differing = sum(len(row[4]) for row in rows)
    print(f"streamed texts equal to offline: {sum(len(jobs) for _ in rows) - differing}/{len(jobs) * len(rows)}")
    return 1 if differing else 0


# --------------------------------------------------------------------------- chaos

BAD_BODIES = (
    b'{"prompt": ',
    b'{"prompt": "x", "max_tokens": -1}',
    b'{"prompt": "x", "max_tokens": "lots"}',
    b'{"prompt": "x", "n": 3}',
    b'{"model": "nope", "prompt": "x"}',
    b'{"prompt": "x", "guided_regex": "("}',
    b'{"prompt": "x", "functions": []}',
    b'{"prompt": "' + b"y" * 600 + b'"}',
)


async def chaos_one(client: httpx.AsyncClient, url: str, rng: random.Random, refs: dict) -> str:
    kind = rng.choices(["stream", "whole", "drop", "give_up", "bad"], weights=[4, 2, 2, 1, 2])[0]
    prompt, n = rng.choice(list(refs))
    if kind == "bad":
        r = await client.post(f"{url}/v1/completions", content=rng.choice(BAD_BODIES),
                              headers={"content-type": "application/json"})  # fmt: skip
        return "bad-4xx" if 400 <= r.status_code < 500 else f"bad-got-{r.status_code}"
    if kind == "stream":
        got = await stream_one(client, url, body(prompt, n))
        return "ok" if got.get("text") == refs[prompt, n] else f"MISMATCH {prompt!r} {n}"
    if kind == "whole":
        r = await client.post(f"{url}/v1/completions", json=body(prompt, n, stream=False))
        return "ok" if r.status_code == 200 and r.json()["choices"][0]["text"] == refs[prompt, n] else "MISMATCH"
    if kind == "drop":
        async with client.stream("POST", f"{url}/v1/completions", json=body(prompt, n)) as r:
            chunks = rng.randint(1, 4)
            async for line in r.aiter_lines():
                chunks -= line.startswith("data: ")
                if chunks <= 0:
                    break  # leaving the block closes the connection mid-stream
        return "dropped"
    try:  # give_up: a whole request whose client stops waiting
        await client.post(f"{url}/v1/completions", json=body(prompt, n, stream=False), timeout=rng.uniform(0.05, 0.5))
        return "ok-before-giving-up"
    except httpx.TimeoutException:
        return "gave-up"


def run_chaos(args) -> int:
    reference = load(None, backend=args.backend, max_batch=args.lanes, max_seq_len=args.max_seq_len)
    rng = random.Random(args.seed)
    prompts = PROMPTS[:2] if args.quick else PROMPTS
    pairs = sorted({(p, n) for p in prompts for n in (4, args.max_tokens)})
    want = fdecode.generate(reference.step, [p for p, _ in pairs], [fdecode.SamplingParams(max_new_tokens=n) for _, n in pairs],
                            tokenizer=reference.tokenizer, details=True, progress=False)  # fmt: skip
    refs = {pair: w.text for pair, w in zip(pairs, want)}
    outcomes: dict[str, int] = {}
    with serving(args) as url:

        async def main() -> None:
            sem = asyncio.Semaphore(2 * args.clients)
            async with httpx.AsyncClient(timeout=600) as client:

                async def one() -> None:
                    async with sem:
                        outcome = await chaos_one(client, url, rng, refs)
                        outcomes[outcome] = outcomes.get(outcome, 0) + 1

                await asyncio.gather(*(one() for _ in range(args.requests)))

        start = time.perf_counter()
        asyncio.run(main())
        seconds = time.perf_counter() - start
        deadline = time.monotonic() + 30
        while any(stuck := held(url)) and time.monotonic() < deadline:
            time.sleep(0.1)
        health = httpx.get(f"{url}/health").json()["status"]
        prompt, n = pairs[0]
        after = httpx.post(f"{url}/v1/completions", json=body(prompt, n, stream=False), timeout=120)
        still = after.status_code == 200 and after.json()["choices"][0]["text"] == refs[prompt, n]
    print(f"{args.requests} chaos requests in {seconds:.1f} s, {2 * args.clients} clients on {args.clients} lanes "
          f"(backend {reference.step.backend}):")  # fmt: skip
    for outcome, count in sorted(outcomes.items()):
        print(f"  {outcome:24} {count}")
    print(f"afterwards: in flight / running / waiting / KV blocks held = {stuck}; /health {health!r}; "
          f"a new request equals its run alone: {still}")  # fmt: skip
    failed = any(k.startswith(("MISMATCH", "bad-got")) for k in outcomes) or any(stuck) or health != "ok" or not still
    print("chaos: FAILED" if failed else "chaos: passed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few short requests, eager, one round (tests)")
    p.add_argument("--chaos", action="store_true")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--lanes", type=int, default=None, help="max_batch of both sides (default: --clients)")
    p.add_argument("--requests", type=int, default=None, help="default: 32 (load), 200 (chaos)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-seq-len", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backend", default="inductor")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads of both sides (default: torch's)")
    args = p.parse_args(argv)
    args.threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(args.threads)
    if args.quick:
        args.backend, args.rounds, args.max_tokens, args.clients = "eager", 1, 8, 2
        args.requests = args.requests or (12 if args.chaos else 4)
    args.requests = args.requests or (200 if args.chaos else 32)
    args.lanes = args.lanes or args.clients
    return run_chaos(args) if args.chaos else run_load(args)


if __name__ == "__main__":
    raise SystemExit(main())
