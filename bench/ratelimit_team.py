"""The worker side of ``bench/ratelimit.py``: a team whose lead calls a model
provider on loopback through the official ``anthropic`` SDK (the built-in
``AnthropicModelClient``), with the provider's URL and the API key from
``BENCH_PROVIDER_URL`` / ``BENCH_API_KEY``. Each run is one model call (a
direct answer); the member is never called.
"""

from __future__ import annotations

import os

from lattice_worker import define_agent
from lattice_worker.team import create_team, team_member

MODEL = "claude-sonnet-4-6"
TEAM_REF = "ratelimit_team:team"

team = create_team(
    name="ratelimit",
    lead=define_agent(
        name="lead",
        model=MODEL,
        api_key=os.environ.get("BENCH_API_KEY", "bench-key"),
        base_url=os.environ.get("BENCH_PROVIDER_URL", "http://127.0.0.1:9"),
        system_prompt="Answer in one word.",
        max_turns=2,
        workspace=False,
    ),
    members=[team_member(name="idle", agent=define_agent(name="idle", model=MODEL, workspace=False))],
)
