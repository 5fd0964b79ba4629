"""Real agent systems graded as cells: Claude Code, Codex CLI and mini-swe-agent run in
both sandbox backends, with the model reached only through the cell's LLM gateway.

Each cell is a real ``run_cell``: the pinned CLI (``.agent-tools``) runs headless as the
sandbox's uid, talks to the gateway over the in-sandbox relay and the bound unix socket
(in every network mode), and the gateway forwards through litellm to a scripted upstream
on 127.0.0.1 (:mod:`tests.scripted_upstream`) that plays the model: it asks for real
shell commands, which the system runs in the sandbox. The cell is then evaluated and
scored like any other, from the trajectory read off the wire.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import pytest

from pytest_automedbench.agents.systems import SYSTEMS
from pytest_automedbench.agents.trajectory import read_trajectory
from pytest_automedbench.config import RunConfig
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.gateway import read_history
from pytest_automedbench.results import CellKey, CellResult
from pytest_automedbench.runner import CellPlan, run_cell
from pytest_automedbench.sandbox import backend_class
from pytest_automedbench.tasks import load_task
from tests.scripted_upstream import ScriptedUpstream, Shell, Step, StepUsage, Text

from .conftest import CANARY, CANARY_ENV, SUITES

TASK = load_task(SUITES / "vqa" / "vqa-rad")
PRICE_IN, PRICE_OUT = 3.0, 15.0
#: The upstream model per system, and which base URL of the scripted upstream it needs.
UPSTREAM_MODEL = {
    "claude-code": "anthropic/claude-scripted-1",
    "codex": "openai/gpt-scripted-1",
    "copilot": "openai/gpt-scripted-1",
    "mini-swe-agent": "openai/gpt-scripted-1",
}

PLAN = """mkdir -p /workspace/plan && cat > /workspace/plan/plan.md <<'EOF'
# Plan
- inspect the questions and check each answer_type
- answer with rule-based question patterns (regex)
- validate: check that every question has an answer, then submit
EOF"""
INSPECT = (
    "python3 -c \"import json; q = json.load(open('/public/questions.json')); "
    "print(len(q), sorted({x['answer_type'] for x in q}))\"; env | sort > /workspace/seen_env.txt"
)
ANSWER = """python3 - <<'EOF'
import json
questions = json.load(open("/public/questions.json"))
with open("/workspace/outputs/answers.json", "w") as out:
    json.dump({q["question_id"]: "yes" for q in questions}, out)
print("answered", len(questions))
EOF"""
FAIL = "exit 3"


#: mini-swe-agent ends with this command, the others with a text reply.
MINI_DONE = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def the_script(system: str = "") -> list[Step]:
    done = "All questions are answered in /workspace/outputs/answers.json."
    last: Step = Shell(MINI_DONE) if system == "mini-swe-agent" else Text(done)
    return [
        Shell(PLAN, StepUsage(1200, 40)),
        Shell(INSPECT, StepUsage(1300, 30)),
        Shell(ANSWER, StepUsage(1400, 60)),
        Shell(FAIL, StepUsage(1500, 20)),
        replace(last, usage=StepUsage(1600, 15)),
    ]


def require(backend: str) -> None:
    problem = backend_class(backend).problem()
    if problem is not None:
        pytest.fail(f"{backend} cannot run here ({problem}): run scripts/system-setup test")


@dataclass
class SystemCell:
    result: CellResult
    events: list[dict[str, Any]]
    upstream: ScriptedUpstream
    cell_dir: Path

    def wire_calls(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == "tool_result" and e.get("source") == "wire"]

    def shell_calls(self) -> list[dict[str, Any]]:
        return [e for e in self.wire_calls() if e["tool"] == "execute"]

    def kinds(self) -> list[str]:
        return [e["kind"] for e in self.events]


@pytest.fixture
def system_cell(staged: StagedData, tmp_path: Path, canary: str) -> Iterator[Any]:
    upstreams: list[ScriptedUpstream] = []

    def run(
        system: str,
        backend: str,
        network: str,
        script: list[Step] | None = None,
        **settings: Any,
    ) -> SystemCell:
        require(backend)
        upstream = ScriptedUpstream(script if script is not None else the_script(system)).start()
        upstreams.append(upstream)
        model = UPSTREAM_MODEL[system]
        definitions = {
            "scripted-model": {
                "model": model,
                "api_base": upstream.url if model.startswith("anthropic/") else upstream.openai_url,
                "api_key_env": CANARY_ENV,
                "input_usd_per_mtok": PRICE_IN,
                "output_usd_per_mtok": PRICE_OUT,
            }
        }
        config = RunConfig(
            amb_out=tmp_path / "out",
            sandbox=backend,
            sandbox_network=network,
            agent_definitions=definitions,
            **settings,
        )
        agent = f"{system}:scripted-model"  # the prefix form, upstream from the agents table
        plan = CellPlan(
            key=CellKey(agent=agent, task=TASK.id, tier="lite", run=0),
            task=TASK,
            staged=staged,
            config=config,
            run_id="test-systems",
            cell_dir=tmp_path / "cell",
        )
        result = run_cell(plan)
        events = read_trajectory(plan.cell_dir / "trajectory.jsonl")
        return SystemCell(result, events, upstream, plan.cell_dir)

    yield run
    for upstream in upstreams:
        upstream.stop()


def expected_cost(cell: SystemCell) -> float:
    up = cell.upstream
    return (up.served_input_tokens * PRICE_IN + up.served_output_tokens * PRICE_OUT) / 1e6


def readable_text(root: Path) -> Iterator[tuple[Path, str]]:
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            yield path, path.read_bytes().decode("utf-8", errors="replace")


def assert_graded_from_the_wire(cell: SystemCell, system: str) -> None:
    result = cell.result
    assert result.status == "scored", (result.error, cell.kinds())
    assert result.termination == "finished"
    assert result.harness == system
    assert result.harness_version == SYSTEMS[system].version
    assert result.model == UPSTREAM_MODEL[system]
    # The system ran real shell commands in the sandbox: the plan and the answers exist,
    # and each call is in the trajectory with its code and exit status.
    shell = cell.shell_calls()
    codes = [c["code"] for c in shell]
    for command in (PLAN, INSPECT, ANSWER, FAIL):
        assert any(command.strip() in (code or "") for code in codes), (command, codes)
    exits = {c["code"].strip(): c["exit_code"] for c in shell}
    assert exits[FAIL] == 3 and exits[ANSWER.strip()] == 0, exits
    assert "answered 3" in next(c["stdout"] for c in shell if c["code"].strip() == ANSWER.strip())
    answers = json.loads((cell.cell_dir / "workspace" / "outputs" / "answers.json").read_text())
    assert len(answers) == 3
    assert result.format_valid is True and result.task_score is not None
    # The rule judge credits items from the wire's calls.
    rules = result.verdicts["rules"]
    assert rules["s1_plan_exists"] == 1.0 and rules["s1_model_class"] == 1.0, rules
    assert rules["s2_input_checked"] == 1.0 and rules["s2_environment"] == 1.0, rules
    assert any(activity.calls for activity in result.stage_activity)
    # Tokens and cost on the record are what the upstream served, at the configured prices.
    assert result.tokens_in == cell.upstream.served_input_tokens > 0
    assert result.tokens_out == cell.upstream.served_output_tokens > 0
    assert result.cost_usd == pytest.approx(expected_cost(cell), abs=1e-9)
    assert result.price_known is True
    assert result.turns >= 5
    # The provider key was used by the gateway on the host, and nowhere in the sandbox.
    sent = [json.dumps(r.headers) for r in cell.upstream.requests]
    assert sent and all(CANARY in headers for headers in sent)
    seen_env = (cell.cell_dir / "workspace" / "seen_env.txt").read_text()
    assert "AMB_GATEWAY_TOKEN=amb-" in seen_env or "OPENAI_API_KEY=amb-" in seen_env
    for path, text in readable_text(cell.cell_dir / "workspace"):
        assert CANARY not in text, path
    assert CANARY not in (cell.cell_dir / "trajectory.jsonl").read_text()
    # The native transcript and the gateway's log are kept.
    transcript = next(e for e in cell.events if e["kind"] == "transcript")
    assert transcript["found"] is True and transcript["bytes"] > 0
    (log,) = (cell.cell_dir / "gateway").glob("*.jsonl")
    lines = read_history(log)
    assert sum(len(line["attempts"]) for line in lines) == len(cell.upstream.requests)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("system", "backend", "network"),
    [
        ("claude-code", "docker", "off"),
        ("claude-code", "bubblewrap", "on"),
        ("codex", "docker", "on"),
        ("codex", "bubblewrap", "off"),
        ("copilot", "docker", "off"),
        ("copilot", "bubblewrap", "on"),
        ("mini-swe-agent", "bubblewrap", "off"),
        ("mini-swe-agent", "docker", "on"),
    ],
)
def test_a_real_agent_system_is_graded_through_the_gateway(
    system_cell: Any, system: str, backend: str, network: str
) -> None:
    cell = system_cell(system, backend, network)
    assert_graded_from_the_wire(cell, system)


@pytest.mark.slow
@pytest.mark.parametrize("system", ["claude-code", "codex", "copilot", "mini-swe-agent"])
def test_an_exhausted_token_budget_ends_the_cell_as_a_token_limit(
    system_cell: Any, system: str
) -> None:
    """1240 + 1330 tokens are served for the first two steps; the request after them is
    over the 2000-token budget: refused at the gateway, each system stops at once, and
    the cell ends as a token limit with what it did kept."""
    cell = system_cell(system, "bubblewrap", "off", max_total_tokens=2000)
    result = cell.result
    assert result.status == "scored" and result.termination == "token_limit", result.error
    served = cell.upstream.served_input_tokens + cell.upstream.served_output_tokens
    assert result.tokens_in + result.tokens_out == served >= 2000
    assert result.cost_usd == pytest.approx(expected_cost(cell), abs=1e-9)
    refused = [e for e in cell.events if e["kind"] == "request_failed"]
    assert refused and refused[0]["status"] == 403 and "token budget" in refused[0]["error"]
    limit = next(e for e in cell.events if e["kind"] == "limit")
    assert limit["limit"] == "token_limit"
    assert [c["code"].strip() for c in cell.shell_calls()][:1] == [PLAN]
    assert (cell.cell_dir / "workspace" / "plan" / "plan.md").is_file()


@pytest.mark.slow
def test_an_upstream_429_is_retried_at_the_gateway_and_recorded(system_cell: Any) -> None:
    from tests.scripted_upstream import Error

    script = the_script()
    script.insert(1, Error(429, retry_after=0.2))
    cell = system_cell("codex", "bubblewrap", "off", script=script)
    assert cell.result.status == "scored" and cell.result.termination == "finished"
    retries = [e for e in cell.events if e["kind"] == "retry"]
    assert [r["status"] for r in retries] == [429]
    statuses = [r.status for r in cell.upstream.requests]
    assert statuses.count(429) == 1
    log = read_history(next((cell.cell_dir / "gateway").glob("*.jsonl")))
    attempts = [a["status"] for line in log for a in line["attempts"]]
    assert attempts.count(429) == 1
    assert_graded_from_the_wire(cell, "codex")


#: A new agent system in a few lines (what the README shows): a chat-completions loop
#: that runs each `bash` call the model asks for and sends the result back, configured
#: in the agents table with `command` and `model`. It knows nothing of the gateway but
#: the variables every OpenAI SDK reads.
TOY_SYSTEM = r"""python3 - <<'EOF'
import json, os, subprocess, urllib.request
url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
tool = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}}}}
messages = [{"role": "user", "content": open(os.environ["AMB_BRIEF"]).read()}]
for _ in range(int(os.environ.get("TOY_STEPS", "10"))):
    request = urllib.request.Request(url, json.dumps(
        {"model": os.environ["AMB_MODEL"], "messages": messages, "tools": [tool]}).encode(),
        {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
         "Content-Type": "application/json"})
    reply = json.load(urllib.request.urlopen(request, timeout=60))["choices"][0]["message"]
    messages.append(reply)
    if not reply.get("tool_calls"):
        break
    for call in reply["tool_calls"]:
        command = json.loads(call["function"]["arguments"])["command"]
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        result = {"returncode": done.returncode, "output": done.stdout + done.stderr}
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
EOF"""


def toy_system(settings: dict[str, Any]) -> dict[str, Any]:
    return {"toy": {"command": TOY_SYSTEM, "model": "scripted-model", **settings}}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["docker", "bubblewrap"])
def test_a_system_defined_by_its_command_is_graded_the_same_way(
    staged: StagedData, tmp_path: Path, canary: str, backend: str
) -> None:
    require(backend)
    script = [*the_script()[:-1], Text("done", StepUsage(1600, 15))]
    with ScriptedUpstream(script) as upstream:
        cell = toy_cell(staged, tmp_path, upstream, backend, {})
    result = cell.result
    assert result.status == "scored" and result.termination == "finished", result.error
    assert result.harness == "cmd:toy" and result.harness_version is None
    exits = [(c["code"].strip(), c["exit_code"]) for c in cell.shell_calls()]
    assert exits == [(PLAN, 0), (INSPECT, 0), (ANSWER.strip(), 0), (FAIL, 3)]
    assert result.tokens_in == upstream.served_input_tokens == 1200 + 1300 + 1400 + 1500 + 1600
    assert result.cost_usd == pytest.approx(expected_cost(cell), abs=1e-9)
    assert result.verdicts["rules"]["s2_input_checked"] == 1.0


def toy_cell(
    staged: StagedData,
    tmp_path: Path,
    upstream: ScriptedUpstream,
    backend: str,
    settings: dict[str, Any],
    **config: Any,
) -> SystemCell:
    definitions = {
        "scripted-model": {
            "model": "openai/gpt-scripted-1",
            "api_base": upstream.openai_url,
            "api_key_env": CANARY_ENV,
            "input_usd_per_mtok": PRICE_IN,
            "output_usd_per_mtok": PRICE_OUT,
        },
        **toy_system(settings),
    }
    plan = CellPlan(
        key=CellKey(agent="toy", task=TASK.id, tier="lite", run=0),
        task=TASK,
        staged=staged,
        config=RunConfig(
            amb_out=tmp_path / "out",
            sandbox=backend,
            sandbox_network="off",
            agent_definitions=definitions,
            **config,
        ),
        run_id="test-systems",
        cell_dir=tmp_path / "cell",
    )
    result = run_cell(plan)
    return SystemCell(
        result, read_trajectory(plan.cell_dir / "trajectory.jsonl"), upstream, plan.cell_dir
    )


class StopsTheGateway(ScriptedUpstream):
    """Stops the cell's gateway (from another thread, as a crash would) while it serves
    the agent's second request; the reply waits until the gateway's listeners are closed
    (not merely told to close: a loaded machine served a third request in between), so
    that reply is the last one the agent gets."""

    gateways: ClassVar[list[Any]] = []

    def answer(
        self, path: str, protocol: Any, headers: dict[str, str], body: dict[str, Any]
    ) -> Any:
        reply = super().answer(path, protocol, headers, body)
        if len(self.agent_requests()) == 2:
            gateway = self.gateways[-1]
            server = gateway._server  # uvicorn's: its listeners close first on shutdown
            threading.Thread(target=gateway.stop, daemon=True).start()
            deadline = time.monotonic() + 30  # a loaded CI machine stops it slowly
            while time.monotonic() < deadline and (
                not getattr(server, "servers", None)
                or any(listener.is_serving() for listener in server.servers)
            ):
                time.sleep(0.01)
        return reply


@pytest.mark.slow
def test_a_gateway_killed_mid_run_is_an_infrastructure_error_with_the_trajectory_kept(
    staged: StagedData, tmp_path: Path, canary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_automedbench.gateway import Gateway

    require("bubblewrap")
    started = Gateway.start

    def start(self: Gateway) -> Gateway:
        StopsTheGateway.gateways.append(self)
        return started(self)

    monkeypatch.setattr(Gateway, "start", start)
    with StopsTheGateway(the_script()) as upstream:
        cell = toy_cell(staged, tmp_path, upstream, "bubblewrap", {})
    result = cell.result
    assert result.status == "infra_error" and result.termination == "gateway_error", result
    assert "stopped serving" in (result.error or "")
    # What happened before the gateway went is kept: both served turns and the first call.
    assert [e["turn"] for e in cell.events if e["kind"] == "message" and "turn" in e] == [1, 2]
    assert [c["code"].strip() for c in cell.shell_calls()] == [PLAN]
    assert result.tokens_in == 1200 + 1300 and result.turns == 2
    assert any(e["kind"] == "end_command" and e["exit_code"] != 0 for e in cell.events)


@pytest.mark.slow
def test_an_exhausted_cost_budget_ends_the_cell_as_a_cost_limit(
    staged: StagedData, tmp_path: Path, canary: str
) -> None:
    """$0.0042 then $0.00435 are served; the cell's $0.008 are spent after the second
    reply, so the third request is refused and the cell ends as a cost limit."""
    require("docker")
    with ScriptedUpstream(the_script()) as upstream:
        cell = toy_cell(staged, tmp_path, upstream, "docker", {"max_cost_usd": 0.008})
    result = cell.result
    assert result.status == "scored" and result.termination == "cost_limit", result.error
    assert result.cost_usd == pytest.approx(0.0042 + 0.00435, abs=1e-9)
    (refused,) = [e for e in cell.events if e["kind"] == "request_failed"]
    assert refused["status"] == 403 and "cost budget" in refused["error"]
    assert result.limits["max_cost_usd"] == 0.008
