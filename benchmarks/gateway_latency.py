"""What the gateway adds to a model request beyond ``litellm.completion``'s own cost.

Not a test: wall-clock numbers depend on the machine, so this only prints them. Both sides
run in this process, interleaved, against the same fake upstream on 127.0.0.1 (an OpenAI
Chat Completions endpoint that answers at once, with keep-alive and ``TCP_NODELAY`` on
its sockets: without it Nagle's algorithm and delayed ACKs add ~40 ms to every keep-alive
reply and the figure would measure the fake):

* ours: the agent's request through a real :class:`~pytest_automedbench.gateway.Gateway`
  lease (an ``httpx`` client with keep-alive, as an agent's SDK), i.e. the gateway's HTTP
  server (its connections ``TCP_NODELAY`` too: tests/test_gateway_latency_nodelay.py), its
  checks, metering and log line (fsynced off the reply's path), and its ``litellm`` call to
  the upstream;
* reference: ``litellm.completion`` of the same messages straight to the upstream.

At each conversation length (turns of ~3 KB each after a ~2 KB system prompt), median of
``--repeats``; target: the difference <= 3 ms at any length.

    .venv/bin/python benchmarks/gateway_latency.py                   # 10..80 turns, median of 30
    .venv/bin/python benchmarks/gateway_latency.py --quick --json gateway.json   # 10, 80; of 10
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from _record import add_json_option, figure, write_json

from pytest_automedbench.gateway import Gateway, Prices, RetryPolicy

KEY_ENV = "AMB_GATEWAY_LATENCY_BENCH_KEY"
MODEL = "openai/fake-model"
TURN_BYTES = 3000
SYSTEM_PROMPT = "You are a careful medical-imaging engineer. " * 48
TARGET_MS = 3.0
REPLY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "fake-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "done"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
    }
).encode()


class _Upstream(http.server.BaseHTTPRequestHandler):
    """Answers every POST with one fixed chat completion, keep-alive, no Nagle delay."""

    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(REPLY)))
        self.end_headers()
        self.wfile.write(REPLY)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def fake_upstream() -> Iterator[str]:
    """The fake's OpenAI base URL (``.../v1``) while it serves."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def conversation(turns: int) -> list[dict[str, Any]]:
    """A system prompt, a task, then ``turns`` exchanges of ~3 KB each."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "Segment the liver in every CT volume under /data."},
    ]
    for turn in range(turns):
        messages.append({"role": "assistant", "content": f"step {turn}: ls /data"})
        messages.append({"role": "user", "content": f"turn {turn} " + "x" * TURN_BYTES})
    return messages


def interleaved_medians(repeats: int, *fns: Callable[[], None]) -> list[float]:
    """Each function once to warm up, then ``repeats`` rounds in turn: median seconds."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def measure(turn_counts: list[int], repeats: int, folder: Path) -> list[tuple[int, float, float]]:
    """(turns, through the gateway, litellm.completion) median seconds at each length."""
    import litellm

    os.environ[KEY_ENV] = "sk-fake-upstream-key"
    retry = RetryPolicy(max_attempts=1, base_delay_s=0.01, max_delay_s=0.05, timeout_s=30)
    prices = Prices(input_per_mtok=3.0, output_per_mtok=15.0)
    out = []
    with fake_upstream() as api_base, Gateway(folder, retry=retry) as gateway:
        lease = gateway.open_cell(
            "bench/latency", MODEL, api_base=api_base, api_key_env=KEY_ENV, prices=prices
        )
        headers = {"Authorization": f"Bearer {lease.token}"}
        with httpx.Client(base_url=lease.openai_base_url, headers=headers, timeout=60) as client:
            for turns in turn_counts:
                messages = conversation(turns)

                def through_gateway(messages: list[dict[str, Any]] = messages) -> None:
                    answer = client.post(
                        "/chat/completions", json={"model": "gpt-4o", "messages": messages}
                    )
                    answer.raise_for_status()
                    if answer.json()["choices"][0]["message"]["content"] != "done":
                        raise SystemExit(f"unexpected reply through the gateway: {answer.text}")

                def direct(messages: list[dict[str, Any]] = messages) -> None:
                    reply: Any = litellm.completion(
                        model=MODEL, messages=messages, api_base=api_base, api_key="sk-fake"
                    )
                    if reply.choices[0].message.content != "done":
                        raise SystemExit(f"unexpected reply from litellm: {reply}")

                ours, reference = interleaved_medians(repeats, through_gateway, direct)
                out.append((turns, ours, reference))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="10 and 80 turns, median of 10")
    parser.add_argument("--repeats", type=int, help="median of this many (default 30)")
    add_json_option(parser)
    args = parser.parse_args()
    repeats = args.repeats or (10 if args.quick else 30)
    turn_counts = [10, 80] if args.quick else [10, 20, 40, 80]
    print(f"gateway latency, median of {repeats}; load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="amb-bench-gateway-") as folder:
        results = measure(turn_counts, repeats, Path(folder))
    print(f"{'turns':>5}  {'gateway':>10}  {'litellm.completion':>18}  {'beyond':>9}  target")
    for turns, ours, reference in results:
        beyond = (ours - reference) * 1e3
        met = "met" if beyond <= TARGET_MS else "NOT met"
        print(
            f"{turns:>5}  {ours * 1e3:7.1f} ms  {reference * 1e3:15.1f} ms  {beyond:+6.1f} ms"
            f"  <= {TARGET_MS:g} ms: {met}"
        )
        figure(f"request through the gateway at {turns} turns, median", ours * 1e3, "ms")
        figure(f"litellm.completion at {turns} turns, median", reference * 1e3, "ms")
        figure(
            f"gateway beyond litellm.completion at {turns} turns", beyond, "ms", at_most=TARGET_MS
        )
    write_json(args.json, {"repeats": repeats, "turns": turn_counts})


if __name__ == "__main__":
    main()
