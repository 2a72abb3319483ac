"""Shared model rate limits (issue 22) on real worker processes, beside the same load without them.

A model provider on loopback speaks the Anthropic Messages wire format (the
tests' ``FakeAnthropicServer``, ``tests/support/fake_anthropic.py``, with a
responder that enforces limits) and is called through the official
``anthropic`` SDK (the workers' built-in ``AnthropicModelClient``). Per API
key it enforces **300 requests/min** and **60,000 input tokens/min** (token
buckets refilled continuously, full at the start, like the provider's), and
answers a call past either with a **429** carrying ``retry-after`` (seconds,
as Anthropic does) and the ``anthropic-ratelimit-*-remaining`` headers; every
answer carries those headers, and ``usage.input_tokens`` is the provider's
own count (characters of the request's system, messages and tools / 4).
Each answer takes ``--latency`` seconds (0.5).

Two ``lattice worker`` processes (the default asyncio pool, 200 steps in
flight each) serve a team whose lead answers each run with one model call
(``bench/ratelimit_team.py``); ``--runs`` runs (400) of about 400 input
tokens each (the system prompt, the lead's member tool, a short prompt) are
submitted at once, so 400 calls are in flight or waiting and the token limit
binds (about 150 calls/min): the first minute's tokens go at once, the rest
take about 100 s. Two scenarios, in this order, with fresh workers and
a fresh API key (fresh provider buckets) each:

* ``limited``: ``LATTICE_MODEL_LIMITS`` set to the provider's limits;
* ``unlimited``: the same load without it (each process retries its 429s
  through the SDK, ``max_retries=2``).

Printed per scenario: runs completed / failed; what the provider accepted
as a fraction of the most its limits let through from its first request to
its last accepted call (a minute's worth at the start plus the refill: the
token bucket's exact ceiling; requests / 300 per min, input tokens / 60,000
per min; the binding one is the figure: target >= 0.9; without the limiter
the runs mostly fail within seconds, so its window is short); the share of 429s among the
requests after the first ten seconds from the first request (target <= 1%); the wall time. Then the
ratios limited / unlimited.

Run (about 2.5 minutes; a private redis-server unless ``--broker-url``)::

    python bench/ratelimit.py
    python bench/ratelimit.py --runs 400 --latency 0.5
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from distributed_procs import Bench  # noqa: E402
from ratelimit_team import MODEL, TEAM_REF  # noqa: E402

from tests.support.fake_anthropic import ErrorReply, FakeAnthropicServer, MessageReply, text_block  # noqa: E402

REQUESTS_PER_MINUTE = 300
TOKENS_PER_MINUTE = 60_000
WARM_UP_SECONDS = 10.0


@dataclass
class _Bucket:
    capacity: float
    level: float
    at: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.capacity / 60.0)
        self.at = now

    def wait_for(self, amount: float) -> float:
        return max(0.0, (amount - self.level) * 60.0 / self.capacity)


@dataclass
class Provider:
    """The limits of the loopback provider, per API key, and what it answered."""

    latency: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    buckets: dict[str, tuple[_Bucket, _Bucket]] = field(default_factory=dict)
    log: list[tuple[float, int, int]] = field(default_factory=list)
    """``(monotonic time, status, input tokens)`` per request, in arrival order."""

    @staticmethod
    def tokens(body: dict[str, Any]) -> int:
        parts = [body.get("system"), body.get("messages"), body.get("tools")]
        return max(1, sum(len(json.dumps(p, ensure_ascii=False)) for p in parts if p) // 4)

    def answer(self, request: Any) -> Any:
        key = request.headers.get("x-api-key", "")
        tokens = self.tokens(request.body)
        now = time.monotonic()
        with self.lock:
            requests, inputs = self.buckets.setdefault(
                key,
                (_Bucket(REQUESTS_PER_MINUTE, REQUESTS_PER_MINUTE, now), _Bucket(TOKENS_PER_MINUTE, TOKENS_PER_MINUTE, now)),
            )  # fmt: skip
            requests.refill(now)
            inputs.refill(now)
            wait = max(requests.wait_for(1), inputs.wait_for(tokens))
            if wait > 0:
                status = 429
            else:
                status = 200
                requests.level -= 1
                inputs.level -= tokens
            headers = {
                "anthropic-ratelimit-requests-limit": str(REQUESTS_PER_MINUTE),
                "anthropic-ratelimit-requests-remaining": str(max(0, math.floor(requests.level))),
                "anthropic-ratelimit-input-tokens-limit": str(TOKENS_PER_MINUTE),
                "anthropic-ratelimit-input-tokens-remaining": str(max(0, math.floor(inputs.level))),
            }
            self.log.append((now, status, tokens))
        if status == 429:
            headers["retry-after"] = str(max(1, math.ceil(wait)))
            return ErrorReply(
                429, "rate_limit_error", "Number of request tokens has exceeded your rate limit", headers
            )
        usage = {"input_tokens": tokens, "output_tokens": 3}
        return MessageReply([text_block("ok")], usage=usage, delay=self.latency, headers=headers)


def prompt(i: int) -> str:
    return f"run {i}: say ok"


def scenario(
    bench: Bench, provider: Provider, url: str, name: str, runs: int, limited: bool
) -> dict[str, Any]:
    from lattice_client import LatticeClient

    api_key = f"bench-{name}-{uuid.uuid4().hex[:8]}"
    env = {"BENCH_PROVIDER_URL": url, "BENCH_API_KEY": api_key}
    if limited:
        env["LATTICE_MODEL_LIMITS"] = json.dumps(
            {
                MODEL: {
                    "requests_per_minute": REQUESTS_PER_MINUTE,
                    "input_tokens_per_minute": TOKENS_PER_MINUTE,
                }
            }
        )
    workers = [bench.lattice_worker(env=env, team_ref=TEAM_REF) for _ in range(2)]
    for worker in workers:
        worker.wait_ready()
    start_log = len(provider.log)
    client = LatticeClient(broker_url=bench.broker, key_prefix=bench.prefix)
    try:
        t0 = time.monotonic()
        handles = [client.submit("ratelimit", prompt(i)) for i in range(runs)]
        statuses: dict[str, int] = {}
        deadline = t0 + 600
        for handle in handles:
            try:
                status = handle.wait(timeout=max(1.0, deadline - time.monotonic())).status
            except TimeoutError:
                status = "timeout"
            statuses[status] = statuses.get(status, 0) + 1
        wall = time.monotonic() - t0
    finally:
        client.close()
        for worker in workers:
            worker.stop()
    log = [entry for entry in provider.log[start_log:] if entry[0] >= t0]
    first = log[0][0] if log else t0  # the provider's minute starts with its first request
    later = [entry for entry in log if entry[0] >= first + WARM_UP_SECONDS]
    refused = [entry for entry in later if entry[1] == 429]
    accepted = [entry for entry in log if entry[1] == 200]
    # what the provider accepted beside the most it could have: its full buckets at the start
    # plus their refill until its last accepted call (a token bucket's exact ceiling)
    span = (accepted[-1][0] - first) if accepted else 0.0
    most_requests = REQUESTS_PER_MINUTE * (1 + span / 60.0)
    most_tokens = TOKENS_PER_MINUTE * (1 + span / 60.0)
    return {
        "name": name,
        "runs": runs,
        "completed": statuses.get("completed", 0),
        "not_completed": runs - statuses.get("completed", 0),
        "statuses": statuses,
        "requests": len(log),
        "refused_total": sum(1 for e in log if e[1] == 429),
        "requests_fraction": len(accepted) / most_requests,
        "tokens_fraction": sum(e[2] for e in accepted) / most_tokens,
        "refused_after_warm_up": len(refused) / len(later) if later else 0.0,
        "window_seconds": span,
        "wall_seconds": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=400, help="runs submitted at once per scenario (400)")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per provider answer (0.5)")
    parser.add_argument(
        "--broker-url", default=None, help="an existing Redis (default: a private redis-server)"
    )
    args = parser.parse_args()

    provider = Provider(latency=args.latency)
    bench = Bench(args.broker_url)
    results = []
    try:
        with FakeAnthropicServer(provider.answer) as server:
            for name, limited in (("limited", True), ("unlimited", False)):
                results.append(scenario(bench, provider, server.url, name, args.runs, limited))
                time.sleep(1)
    finally:
        bench.cleanup()

    print(f"provider: {REQUESTS_PER_MINUTE} requests/min, {TOKENS_PER_MINUTE} input tokens/min per key; "
          f"{args.latency} s per answer; 2 workers x 200 in flight; {args.runs} runs of ~400 input tokens at once")  # fmt: skip
    print(f"{'scenario':<10} {'completed':>10} {'failed':>7} {'req/limit':>10} {'tok/limit':>10} "
          f"{'429s>10s':>9} {'429s all':>9} {'window s':>9} {'wall s':>7}")  # fmt: skip
    for r in results:
        print(
            f"{r['name']:<10} {r['completed']:>10} {r['not_completed']:>7} {r['requests_fraction']:>10.3f} "
            f"{r['tokens_fraction']:>10.3f} {r['refused_after_warm_up']:>8.1%} {r['refused_total']:>9} "
            f"{r['window_seconds']:>9.1f} {r['wall_seconds']:>7.1f}"
        )
    lim, unl = results
    binding = max(lim["requests_fraction"], lim["tokens_fraction"])
    print(f"limited: binding limit reached {binding:.3f} of the limit (target >= 0.9); "
          f"429s after {WARM_UP_SECONDS:.0f} s {lim['refused_after_warm_up']:.2%} (target <= 1%); "
          f"{lim['completed']}/{lim['runs']} runs completed (target all)")  # fmt: skip
    if unl["completed"]:
        unl_binding = max(unl["requests_fraction"], unl["tokens_fraction"])
        print(f"ratio limited/unlimited: limit reached {binding / unl_binding:.2f}x, "
              f"runs completed {lim['completed'] / unl['completed']:.2f}x, "
              f"429s sent {lim['refused_total']}/{unl['refused_total']}")  # fmt: skip
    print(json.dumps(results))


if __name__ == "__main__":
    main()
