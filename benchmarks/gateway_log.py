"""The gateway log's size as a conversation grows: bytes per turn at 10 / 20 / 40 / 80 turns
and the growth exponent of the log's size from 20 to 80 turns, for the log as written
(each repeated part once, :mod:`pytest_automedbench.gateway._history`) and for the earlier
format (every request's line whole: the lines the lease's listener gets, written out).

An agent (this script) talks OpenAI Chat Completions to a real gateway in front of a
scripted upstream on 127.0.0.1; each turn adds the model's tool call and a ~3 KB tool
result to the conversation, after a ~2 KB system prompt and tool schemas.

    .venv/bin/python benchmarks/gateway_log.py [--turns 80]
    .venv/bin/python benchmarks/gateway_log.py --json gateway_log.json   # and the figures
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import string
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _record import add_json_option, figure, write_json

from pytest_automedbench.gateway import CellLease, Gateway, Prices, RetryPolicy
from pytest_automedbench.upstream import RecordedRequest, ScriptedUpstream, Shell

KEY_ENV = "AMB_GATEWAY_LOG_BENCH_KEY"
MODEL = "openai/fake-model"
PRICES = Prices(input_per_mtok=3.0, output_per_mtok=15.0)
#: The turn counts the figures are given at.
CHECKPOINTS = (10, 20, 40, 80)
RESULT_BYTES = 3000
SYSTEM_PROMPT = "You are a careful medical-imaging engineer. " * 48
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name}: "
            + "Runs the step in the workspace and says what it did. " * 4,
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "what to run"}},
                "required": ["command"],
            },
        },
    }
    for name in ("bash", "read_file", "write_file", "list_files")
]


@dataclass
class Conversation:
    """What one run left: the log's size after each turn, each body the agent sent, each
    request the upstream received, and each line the lease's listener got (the earlier
    format's lines)."""

    lease: CellLease
    sizes: list[int] = field(default_factory=list)
    sent: list[dict[str, Any]] = field(default_factory=list)
    received: list[RecordedRequest] = field(default_factory=list)
    heard: list[dict[str, Any]] = field(default_factory=list)

    def old_format_bytes(self, turns: int) -> int:
        """The size of the earlier format's log after ``turns`` turns."""
        return sum(len(json.dumps(line)) + 1 for line in self.heard[:turns])


def _tool_result(rng: random.Random) -> str:
    words = ("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(800))
    return " ".join(words)[:RESULT_BYTES]


def converse(folder: Path, turns: int, *, seed: int = 7) -> Conversation:
    """``turns`` turns of a tool-calling conversation through a gateway logging to
    ``folder``; the upstream answers every request with a shell call."""
    os.environ[KEY_ENV] = "sk-scripted-upstream-key"
    rng = random.Random(seed)
    retry = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05, timeout_s=30)
    with (
        ScriptedUpstream([Shell("ls /data")] * turns, chat_only=True) as upstream,
        Gateway(folder, retry=retry) as gateway,
    ):
        heard: list[dict[str, Any]] = []
        lease = gateway.open_cell(
            "bench/long-conversation",
            MODEL,
            api_base=upstream.openai_url,
            api_key_env=KEY_ENV,
            prices=PRICES,
            chat_only=True,
            listener=heard.append,
        )
        run = Conversation(lease, heard=heard)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "Segment the liver in every CT volume under /data."},
        ]
        headers = {"Authorization": f"Bearer {lease.token}"}
        with httpx.Client(base_url=lease.openai_base_url, headers=headers, timeout=60) as client:
            for _ in range(turns):
                body = {"model": "gpt-4o", "messages": messages, "tools": TOOLS}
                answer = client.post("/chat/completions", json=body)
                answer.raise_for_status()
                run.sent.append(json.loads(json.dumps(body)))
                run.sizes.append(lease.log_path.stat().st_size)
                message = answer.json()["choices"][0]["message"]
                said = {k: message[k] for k in ("role", "content", "tool_calls") if k in message}
                results = [
                    {"role": "tool", "tool_call_id": call["id"], "content": _tool_result(rng)}
                    for call in message.get("tool_calls") or []
                ]
                messages = [*messages, said, *results]
        run.received = list(upstream.requests)
    return run


def growth_exponent(turns: Sequence[int], sizes: Sequence[float]) -> float:
    """The least-squares slope of log(size) over log(turns)."""
    xs, ys = [math.log(t) for t in turns], [math.log(s) for s in sizes]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    num = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return num / sum((x - mx) ** 2 for x in xs)


def figures(run: Conversation, checkpoints: Sequence[int] = CHECKPOINTS) -> dict[str, float]:
    """The figures of one run: bytes per turn at each checkpoint for the log and for the
    earlier format, and both growth exponents from 20 turns on."""
    out: dict[str, float] = {}
    for n in checkpoints:
        out[f"log bytes per turn at {n} turns"] = round(run.sizes[n - 1] / n)
        out[f"earlier format bytes per turn at {n} turns"] = round(run.old_format_bytes(n) / n)
    span = [n for n in range(20, len(run.sizes) + 1)]
    out["log growth exponent, 20..80 turns"] = round(
        growth_exponent(span, [run.sizes[n - 1] for n in span]), 3
    )
    out["earlier format growth exponent, 20..80 turns"] = round(
        growth_exponent(span, [run.old_format_bytes(n) for n in span]), 3
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=max(CHECKPOINTS))
    parser.add_argument("--quick", action="store_true", help="the same (sizes, not times)")
    add_json_option(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="amb-gateway-log-") as folder:
        run = converse(Path(folder), args.turns)
        checkpoints = [n for n in CHECKPOINTS if n <= args.turns]
        for name, value in figures(run, checkpoints).items():
            print(f"{name:<50} {value:>12}")
            exponent = "exponent" in name
            target = 1.1 if name.startswith("log growth exponent") else None
            figure(name, value, "" if exponent else "B/turn", at_most=target)
    write_json(args.json, {"turns": args.turns})


if __name__ == "__main__":
    main()
