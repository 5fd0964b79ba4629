"""A Harbor verifier that calls an LLM judge (HealthAgentBench's report correction does):
its model is served through the cell's gateway, never with a provider key in a container.

The task says so as Harbor tasks do (``[verifier] env`` naming ``OPENAI_API_KEY``, or the
compose file's ``main`` environment holding it); the session names the model with
``--harbor-judge-model`` (or ``--judge llm:MODEL``), else the task is skipped saying so.
For real: a task folder whose ``tests/test.sh`` runs a Python verifier that posts the
agent's report to ``$OPENAI_BASE_URL/chat/completions`` with ``$OPENAI_API_KEY`` and
writes reward 1 when the judge says PASS, run on Docker with ``oracle`` and ``nop``
against a scripted OpenAI-protocol judge on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.config import RunConfig
from pytest_automedbench.events import VerifierEvent, read_events
from pytest_automedbench.gateway import read_history
from pytest_automedbench.harbor import load_harbor_task
from pytest_automedbench.harbor._judge import (
    JUDGE_OPTION,
    JudgeUsage,
    judge_model,
    unavailable_reason,
    wants_judge,
)
from pytest_automedbench.harbor._runner import agent_compose_environment
from pytest_automedbench.harbor._task import HarborTask
from pytest_automedbench.results import CellResult

from .conftest import run_harbor_attempt
from .scripted_upstream import Protocol, ScriptedUpstream, StepUsage, Text

#: The provider key of the judge's model: on the host only.
REAL_KEY = "sk-judge-host-only-5150"
FINDING = "small left pleural effusion"
JUDGE_USAGE = StepUsage(input_tokens=321, output_tokens=7)
AGENT_USAGE = StepUsage(input_tokens=1000, output_tokens=50)
#: The judge's model definition's prices (USD per million tokens).
PRICES = (2.0, 8.0)

TASK_TOML = """\
version = "1.0"
[metadata]
category = "report_correction"
[verifier]
timeout_sec = 120.0
[verifier.env]
OPENAI_API_KEY = "${OPENAI_API_KEY}"
OPENAI_BASE_URL = "https://api.openai.com/v1"
JUDGE_MODEL = "gpt-judge-as-the-task-names-it"
[agent]
timeout_sec = 120.0
[environment]
allow_internet = false
"""

#: The verifier: prints its environment (each value also reversed: a copy of the real key
#: kept by the harness would be masked, a reversed one would not), asks the judge, and
#: writes reward 1 on PASS.
JUDGE_PY = """\
import json, os, urllib.request
env = dict(os.environ)
print("ENV", json.dumps(env, sort_keys=True))
print("ENV-REVERSED", json.dumps({k: v[::-1] for k, v in env.items()}, sort_keys=True))
try:
    report = open("/app/corrected.txt").read()
except OSError:
    report = "(no report)"
body = {"model": env["JUDGE_MODEL"], "messages": [
    {"role": "system", "content": "Say PASS if the report is right, else FAIL."},
    {"role": "user", "content": "Report: " + report}]}
request = urllib.request.Request(
    env["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + env["OPENAI_API_KEY"],
             "Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=60) as reply:
    verdict = json.load(reply)["choices"][0]["message"]["content"].strip()
print("VERDICT", verdict)
reward = 1 if verdict == "PASS" else 0
json.dump({"reward": reward, "judged": 1}, open("/logs/verifier/reward.json", "w"))
"""

TASK = {
    "task.toml": TASK_TOML,
    "instruction.md": f"Write the corrected report to /app/corrected.txt: {FINDING}.\n",
    "environment/Dockerfile": "FROM python:3.11-slim-bookworm\nWORKDIR /app\n",
    "solution/solve.sh": f"#!/bin/bash\necho '{FINDING.capitalize()}.' > /app/corrected.txt\n",
    "tests/test.sh": "#!/bin/bash\nexec python3 /tests/judge.py\n",
    "tests/judge.py": JUDGE_PY,
}


def _write(folder: Path, files: dict[str, str]) -> HarborTask:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return load_harbor_task(folder)


def _judge_definition(api_base: str) -> dict[str, Any]:
    return {"model": "openai/judge-scripted", "api_base": api_base,
            "api_key_env": "AMB_TEST_JUDGE_KEY", "input_usd_per_mtok": PRICES[0],
            "output_usd_per_mtok": PRICES[1]}  # fmt: skip


# --------------------------------------------------------------------------- the rule


def test_a_verifier_that_names_the_openai_variables_calls_a_judge(tmp_path: Path) -> None:
    judged = _write(tmp_path / "judged", TASK)
    plain = _write(tmp_path / "plain", {**TASK, "task.toml": TASK_TOML.split("[verifier.env]")[0]})
    assert wants_judge(judged, {}) and not wants_judge(plain, {})
    # HealthAgentBench's way: the key in main's environment (its env_file), none in task.toml.
    assert wants_judge(plain, {"OPENAI_API_KEY": "sk-from-env-file", "PYTHONUNBUFFERED": "1"})
    # The judge's variables are the route's, never the host's: no --harbor-env refusal.
    assert judged.unavailable_reason() is None
    assert judged.verifier_env() == {"JUDGE_MODEL": "gpt-judge-as-the-task-names-it"}


def test_the_chexprompt_and_azure_variables_call_a_judge_too(tmp_path: Path) -> None:
    """The newer CheXprompt verifier's variables, and an Azure deployment's, are a judge's
    as well: the task is judged, and neither the verifier (from the host) nor the agent
    (from main's environment) gets any of them."""
    from pytest_automedbench.harbor._compose import PreparedCompose

    task = _write(tmp_path / "chexprompt", CHEXPROMPT_TASK)
    assert wants_judge(task, {}) and task.unavailable_reason() is None
    assert task.verifier_env() == {"CHEXPROMPT_DEPLOYMENT": "gpt-5.4"}
    reason = unavailable_reason(task, RunConfig())
    named = "CHEXPROMPT_AZURE_OPENAI_API_KEY, CHEXPROMPT_OPENAI_API_KEY, CHEXPROMPT_OPENAI_BASE_URL"
    assert reason is not None and f"LLM judge ({named})" in reason  # those the task names
    plain = _write(tmp_path / "plain", {**TASK, "task.toml": TASK_TOML.split("[verifier.env]")[0]})
    assert wants_judge(plain, {"AZURE_OPENAI_ENDPOINT": "https://x.openai.azure.com/"})
    compose = PreparedCompose(
        image="x",
        environment={name: "from-env-file" for name in (*HOST_JUDGE_ENV, "MODE")},
        working_dir=None,
        user=None,
        mounts=[],
    )
    assert agent_compose_environment(compose) == {"MODE": "from-env-file"}


def test_a_judged_task_is_skipped_naming_the_option_unless_a_model_is_named(
    tmp_path: Path,
) -> None:
    from pytest_automedbench.harbor._format import FORMAT

    task = _write(tmp_path / "judged", TASK)
    reason = unavailable_reason(task, RunConfig())
    assert reason is not None and JUDGE_OPTION in reason and "task.toml" in reason
    assert FORMAT.unavailable_reason(task, RunConfig()) == reason  # what collection skips with
    named = RunConfig(harbor_judge_model="judge", agent_definitions={"judge": _judge_definition(
        "http://127.0.0.1:9/v1")})  # fmt: skip
    assert unavailable_reason(task, named) is None
    assert unavailable_reason(task, RunConfig(judge="llm:openai/other")) is None


def test_the_judge_model_is_the_option_else_the_sessions_llm_judge() -> None:
    named = RunConfig(harbor_judge_model="judge", agent_definitions={"judge": _judge_definition(
        "http://127.0.0.1:9/v1")})  # fmt: skip
    model = judge_model(named)
    assert model is not None and model.model == "openai/judge-scripted"
    assert model.api_key_env == "AMB_TEST_JUDGE_KEY" and model.api_base == "http://127.0.0.1:9/v1"
    session = judge_model(RunConfig(judge="llm:openai/gpt-x", judge_api_base="http://127.0.0.1:8"))
    assert session is not None and (session.model, session.api_base) == (
        "openai/gpt-x", "http://127.0.0.1:8",
    )  # fmt: skip
    assert judge_model(RunConfig()) is None  # the rules judge names no model


def test_the_agent_never_gets_the_judges_variables_from_mains_environment() -> None:
    from pytest_automedbench.harbor._compose import PreparedCompose

    compose = PreparedCompose(
        image="x",
        environment={"OPENAI_API_KEY": REAL_KEY, "OPENAI_BASE_URL": "https://x/v1", "MODE": "a"},
        working_dir=None,
        user=None,
        mounts=[],
    )
    assert agent_compose_environment(compose) == {"MODE": "a"}
    assert agent_compose_environment(None) == {}


def test_judge_usage_adds_up() -> None:
    one = JudgeUsage("m", 1, 1, 10, 2, 0.5, True)
    two = JudgeUsage("m", 2, 1, 5, 1, 0.25, False)
    assert (one + two).as_dict() == {
        "model": "m", "requests": 3, "served": 2, "tokens_in": 15, "tokens_out": 3,
        "cost_usd": 0.75, "price_known": False,
    }  # fmt: skip


# --------------------------------------------------------------------------- for real


class ReportJudge(ScriptedUpstream):
    """The scripted upstream as a judge: each chat request takes one verdict step, PASS
    when the report it was sent names the finding, else FAIL; a request that sends no
    report (an agent's own) is answered with :data:`AGENT_USAGE`."""

    def answer(
        self, path: str, protocol: Protocol, headers: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        said = json.dumps(body.get("messages")).lower()
        verdict = "PASS" if FINDING in said else "FAIL"
        usage = JUDGE_USAGE if "report: " in said else AGENT_USAGE
        with self._lock:
            self._script.append(Text(verdict, usage))
        return super().answer(path, protocol, headers, body)


@pytest.fixture(scope="module")
def python_image() -> str:
    """The task's ``python:3.11-slim-bookworm`` as the project's local agent image (no
    registry is reachable here)."""
    from pytest_automedbench.sandbox.docker import docker_client
    from pytest_automedbench.sandbox.images import ensure_images

    return ensure_images(docker_client(), "debootstrap").agent


def run_judged(
    task: HarborTask,
    agent: str,
    cell_dir: Path,
    judge: ReportJudge,
    image: str,
    run_id: str = "test-harbor-judge",
    **more: Any,
) -> CellResult:
    """One attempt of ``task`` by ``agent`` on Docker, its verifier's judge the scripted
    ``judge`` (named ``judge``, a model agent), with ``more`` of the session's settings
    (``agents``: more agent definitions)."""
    agents = {"judge": _judge_definition(judge.openai_url), **more.pop("agents", {})}
    result: CellResult = run_harbor_attempt(
        task,
        agent,
        cell_dir,
        run_id,
        agent_definitions=agents,
        harbor_base=(f"python:3.11-slim-bookworm={image}",),
        harbor_judge_model="judge",
        **more,
    )
    return result


@pytest.mark.slow
def test_an_llm_judging_verifier_is_served_through_the_gateway(
    tmp_path: Path, python_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Oracle passes and nop fails on the judge's verdicts; the judge's upstream saw the
    real key only from the gateway, the verifier only a lease token and a loopback URL;
    the record and the trajectory have the judge's tokens and cost as the verifier's
    (the agents spent nothing); the relay and the lease are gone after the verifier."""
    from pytest_automedbench.sandbox.docker import docker_client
    from pytest_automedbench.sandbox.images import LABEL

    monkeypatch.setenv("AMB_TEST_JUDGE_KEY", REAL_KEY)
    task = _write(tmp_path / "tasks" / "judged", TASK)
    with ReportJudge([]) as judge:
        records = {
            agent: run_judged(task, agent, tmp_path / agent, judge, python_image)
            for agent in ("oracle", "nop")
        }
        requests = list(judge.requests)
    oracle, nop = records["oracle"], records["nop"]
    assert oracle.status == "scored" and nop.status == "scored", (oracle.error, nop.error)
    assert (oracle.reward, oracle.passed) == (1.0, True)
    assert (nop.reward, nop.passed) == (0.0, False)
    # The upstream got the real key, from the gateway, and the configured model.
    assert [r.step for r in requests] == [Text("PASS", JUDGE_USAGE), Text("FAIL", JUDGE_USAGE)]
    for request in requests:
        assert request.headers["authorization"] == f"Bearer {REAL_KEY}"
        assert request.body["model"] == "judge-scripted"
    cost = (JUDGE_USAGE.input_tokens * PRICES[0] + JUDGE_USAGE.output_tokens * PRICES[1]) / 1e6
    for agent, record in records.items():
        cell = tmp_path / agent
        log = (cell / "verifier" / "test-stdout.txt").read_text()
        env = json.loads(log.split("ENV ", 1)[1].splitlines()[0])
        assert env["OPENAI_API_KEY"].startswith("amb-"), env  # a lease token
        assert env["OPENAI_BASE_URL"].startswith("http://127.0.0.1:"), env
        assert REAL_KEY not in log and REAL_KEY[::-1] not in log
        assert env["JUDGE_MODEL"] == "gpt-judge-as-the-task-names-it"
        # The judge's spending is the verifier's; the agents (oracle, nop) spent nothing.
        spent = record.judge["verifier"]
        assert spent["model"] == "openai/judge-scripted" and spent["served"] == 1, spent
        assert (spent["tokens_in"], spent["tokens_out"]) == (321, 7), spent
        assert spent["cost_usd"] == pytest.approx(cost) and spent["price_known"] is True
        assert (record.tokens_in, record.tokens_out, record.cost_usd) == (0, 0, 0.0)
        (event,) = [e for e in read_events(cell / "trajectory.jsonl") if e.kind == "verifier"]
        assert isinstance(event, VerifierEvent) and event.get("judge") == spent
        (lease_log,) = (cell / "gateway").glob("*-verifier-1.jsonl")  # the verifier's lease
        logged = read_history(lease_log)
        assert [line["status"] for line in logged] == [200]
        assert REAL_KEY not in lease_log.read_text()
    left = docker_client().containers.list(
        all=True, filters={"label": f"{LABEL}.role=harbor-judge-relay"}
    )
    assert not [c for c in left if c.labels.get(f"{LABEL}.run") == "test-harbor-judge"]


#: HealthAgentBench's way (its report-correction compose files): the repository's ``.env``
#: as ``main``'s env_file holds the judge's key and endpoint; task.toml names none. The
#: oracle's solution (Python) prints its environment reversed to its log.
ENV_FILE_KEY = "sk-env-file-key-7070"
COMPOSE_TASK = {
    **TASK,
    "task.toml": TASK_TOML.replace(
        'OPENAI_API_KEY = "${OPENAI_API_KEY}"\nOPENAI_BASE_URL = "https://api.openai.com/v1"\n', ""
    ),
    "environment/docker-compose.yaml": """
services:
  main:
    build: {context: .., dockerfile: environment/Dockerfile}
    image: ${COMPOSE_PROJECT_NAME}-img
    env_file: ../../../../.env
    environment: [PYTHONUNBUFFERED=1]
""",
    "solution/solve.sh": (
        "#!/usr/bin/env python3\nimport json, os\n"
        f"open('/app/corrected.txt', 'w').write('{FINDING}')\n"
        "print(json.dumps({k: v[::-1] for k, v in os.environ.items()}))\n"
    ),
}


@pytest.mark.slow
def test_a_judge_key_in_mains_env_file_reaches_neither_agent_nor_verifier(
    tmp_path: Path, python_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task laid out as HealthAgentBench's, run unchanged with its repository named:
    the judge is found through main's environment (skipped without a judge model), the
    oracle passes on the gateway's judge, and the env file's key and endpoint reach no
    container and no upstream (the agent gets the env file's other variables)."""
    monkeypatch.setenv("AMB_TEST_JUDGE_KEY", REAL_KEY)
    repo = tmp_path / "repo"
    (repo / ".env").parent.mkdir(parents=True)
    (repo / ".env").write_text(
        f"OPENAI_API_KEY={ENV_FILE_KEY}\nOPENAI_BASE_URL=https://judge.invalid/v1\nMODE=hab\n"
    )
    folder = repo / "tasks" / "report_correction" / "case_01"
    _write(folder, COMPOSE_TASK)
    task = load_harbor_task(folder, mounts=(repo,))
    assert "OPENAI_API_KEY" not in task.config.verifier.env
    reason = unavailable_reason(task, RunConfig())
    assert reason is not None and JUDGE_OPTION in reason
    named = RunConfig(harbor_judge_model="judge", agent_definitions={"judge": _judge_definition(
        "http://127.0.0.1:9/v1")})  # fmt: skip
    assert unavailable_reason(task, named) is None
    with ReportJudge([]) as judge:
        more: dict[str, Any] = {"harbor_mount": (repo,), "run_id": "test-harbor-judge-compose"}
        record = run_judged(task, "oracle", tmp_path / "oracle", judge, python_image, **more)
        requests = list(judge.requests)
    assert record.status == "scored" and record.passed is True, record.error
    assert [r.headers["authorization"] for r in requests] == [f"Bearer {REAL_KEY}"]
    assert record.judge["verifier"]["served"] == 1
    agent_env = json.loads((tmp_path / "oracle" / "agent-logs" / "oracle.txt").read_text())
    assert agent_env["MODE"] == "bah"  # the env file's other variables reach the agent
    assert "OPENAI_API_KEY" not in agent_env and "OPENAI_BASE_URL" not in agent_env
    log = (tmp_path / "oracle" / "verifier" / "test-stdout.txt").read_text()
    env = json.loads(log.split("ENV ", 1)[1].splitlines()[0])
    assert env["OPENAI_API_KEY"].startswith("amb-") and "127.0.0.1" in env["OPENAI_BASE_URL"]
    for secret in (ENV_FILE_KEY, REAL_KEY):
        assert secret not in log and secret[::-1] not in log


#: The newer CheXprompt verifier's way (HealthAgentBench's report tasks): its own
#: variables, Azure preferred when its key, endpoint and version are all set, else the
#: OpenAI protocol at ``CHEXPROMPT_OPENAI_BASE_URL``. The image sets an Azure endpoint and
#: version, as a task could; the host has values for every one of them.
CHEXPROMPT_TOML = TASK_TOML.replace(
    'OPENAI_API_KEY = "${OPENAI_API_KEY}"\nOPENAI_BASE_URL = "https://api.openai.com/v1"\n'
    'JUDGE_MODEL = "gpt-judge-as-the-task-names-it"\n',
    'CHEXPROMPT_OPENAI_API_KEY = "${CHEXPROMPT_OPENAI_API_KEY}"\n'
    'CHEXPROMPT_OPENAI_BASE_URL = "${CHEXPROMPT_OPENAI_BASE_URL:-https://api.openai.com/v1}"\n'
    'CHEXPROMPT_AZURE_OPENAI_API_KEY = "${CHEXPROMPT_AZURE_OPENAI_API_KEY}"\n'
    'CHEXPROMPT_DEPLOYMENT = "gpt-5.4"\n',
)
CHEXPROMPT_PY = """\
import json, os, urllib.request
env = dict(os.environ)
print("ENV", json.dumps(env, sort_keys=True))
print("ENV-REVERSED", json.dumps({k: v[::-1] for k, v in env.items()}, sort_keys=True))
azure = [env.get("CHEXPROMPT_AZURE_OPENAI_" + part) for part in
         ("API_KEY", "ENDPOINT", "API_VERSION")]
if all(azure):
    print("ROUTE azure")
    raise SystemExit("the Azure route was taken")
print("ROUTE openai")
report = open("/app/corrected.txt").read()
body = {"model": env["CHEXPROMPT_DEPLOYMENT"], "messages": [
    {"role": "user", "content": "Report: " + report}]}
request = urllib.request.Request(
    env["CHEXPROMPT_OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + env["CHEXPROMPT_OPENAI_API_KEY"],
             "Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=60) as reply:
    verdict = json.load(reply)["choices"][0]["message"]["content"].strip()
json.dump({"reward": 1 if verdict == "PASS" else 0}, open("/logs/verifier/reward.json", "w"))
"""
CHEXPROMPT_TASK = {
    **TASK,
    "task.toml": CHEXPROMPT_TOML,
    "environment/Dockerfile": (
        "FROM python:3.11-slim-bookworm\nWORKDIR /app\n"
        "ENV CHEXPROMPT_AZURE_OPENAI_ENDPOINT=https://image.openai.azure.com/ "
        "CHEXPROMPT_AZURE_OPENAI_API_VERSION=2024-02-15-preview\n"
    ),
    "tests/judge.py": CHEXPROMPT_PY,
}
#: The host's values of the judge's variables: none may reach a container.
HOST_JUDGE_ENV = {
    "CHEXPROMPT_OPENAI_API_KEY": "sk-host-chexprompt-6161",
    "CHEXPROMPT_OPENAI_BASE_URL": "https://host-judge.invalid/v1",
    "CHEXPROMPT_AZURE_OPENAI_API_KEY": "host-azure-key-6262",
    "AZURE_OPENAI_API_KEY": "host-azure-key-6363",
    "OPENAI_API_KEY": "sk-host-openai-6464",
}


@pytest.mark.slow
def test_a_chexprompt_verifier_takes_the_gateways_openai_route(
    tmp_path: Path, python_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CheXprompt verifier's variables get the route's key and endpoint; the Azure ones
    are empty whatever the image sets, so the verifier takes the OpenAI protocol through
    the gateway; the host's values reach neither the verifier nor the upstream."""
    monkeypatch.setenv("AMB_TEST_JUDGE_KEY", REAL_KEY)
    for name, value in HOST_JUDGE_ENV.items():
        monkeypatch.setenv(name, value)
    task = _write(tmp_path / "tasks" / "chexprompt", CHEXPROMPT_TASK)
    with ReportJudge([]) as judge:
        run_id = "test-harbor-judge-chexprompt"
        record = run_judged(task, "oracle", tmp_path / "oracle", judge, python_image, run_id)
        requests = list(judge.requests)
    log = (tmp_path / "oracle" / "verifier" / "test-stdout.txt").read_text()
    assert record.status == "scored" and record.passed is True, (record.error, log[-2000:])
    assert "ROUTE openai" in log
    assert [r.headers["authorization"] for r in requests] == [f"Bearer {REAL_KEY}"]
    env = json.loads(log.split("ENV ", 1)[1].splitlines()[0])
    assert env["CHEXPROMPT_OPENAI_API_KEY"].startswith("amb-"), env  # a lease token
    assert env["CHEXPROMPT_OPENAI_BASE_URL"].startswith("http://127.0.0.1:"), env
    assert env["CHEXPROMPT_AZURE_OPENAI_ENDPOINT"] == "", env  # the image's, emptied
    assert env["CHEXPROMPT_AZURE_OPENAI_API_KEY"] == "", env
    for secret in (REAL_KEY, *HOST_JUDGE_ENV.values()):
        assert secret not in log and secret[::-1] not in log


#: An agent system of its own command: one request to its model through the cell's
#: gateway (its own lease), then the corrected report.
AGENT_COMMAND = """python3 - <<'PY'
import json, os, urllib.request
body = {"model": "any", "messages": [{"role": "user", "content": "hello"}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
             "Content-Type": "application/json"})
urllib.request.urlopen(request, timeout=60).read()
open("/app/corrected.txt", "w").write("Small left pleural effusion.")
PY"""


@pytest.mark.slow
def test_an_agent_systems_cell_serves_the_judge_on_its_gateway_with_its_own_lease(
    tmp_path: Path, python_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent system's cell has a gateway already: the verifier's judge gets a lease of
    its own on it; the agent's request is the agent's usage, the judge's the verifier's."""
    monkeypatch.setenv("AMB_TEST_JUDGE_KEY", REAL_KEY)
    task = _write(tmp_path / "tasks" / "judged", TASK)
    with ReportJudge([]) as judge:
        more: dict[str, Any] = {"agents": {"writer": {"command": AGENT_COMMAND, "model": "judge"}}}
        run_id = "test-harbor-judge-system"
        record = run_judged(task, "writer", tmp_path / "cell", judge, python_image, run_id, **more)
        requests = list(judge.requests)
    assert record.status == "scored" and record.passed is True, record.error
    assert [r.step for r in requests] == [Text("FAIL", AGENT_USAGE), Text("PASS", JUDGE_USAGE)]
    assert (record.tokens_in, record.tokens_out) == (1000, 50)  # the agent's request only
    spent = record.judge["verifier"]
    assert (spent["tokens_in"], spent["tokens_out"], spent["served"]) == (321, 7, 1), spent
    # Two leases, two logs: the agent's and the verifier's.
    logs = {path.name for path in (tmp_path / "cell" / "gateway").glob("*.jsonl")}
    assert logs == {"judged-harbor-r0.jsonl", "judged-harbor-r0-verifier-1.jsonl"}, logs


def test_the_judges_lease_serves_only_while_the_verifier_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """The route's token is served through the gateway during the verifier run and
    refused (401) once it ends; the run's usage is kept, the provider key was the host's.
    (The relay sidecar is Docker's; here its URL is the gateway's own loopback one.)"""
    import shutil
    import tempfile
    from collections.abc import Iterator
    from contextlib import contextmanager

    import httpx

    from pytest_automedbench.gateway import Gateway
    from pytest_automedbench.harbor import _judge

    monkeypatch.setenv("AMB_TEST_JUDGE_KEY", REAL_KEY)
    folder = Path(tempfile.mkdtemp(prefix="amb-k2-"))  # a short path: a socket's name
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    with ReportJudge([]) as upstream, Gateway(tmp_path / "gw", unix_socket=folder / "g.sock") as gw:

        @contextmanager
        def loopback_relay(box: object, socket_dir: Path) -> Iterator[str]:
            assert socket_dir == folder  # the socket's folder is what the relay binds
            yield gw.url

        monkeypatch.setattr(_judge, "relay_sidecar", loopback_relay)
        config = RunConfig(harbor_judge_model="judge", agent_definitions={
            "judge": _judge_definition(upstream.openai_url)})  # fmt: skip
        model = judge_model(config)
        assert model is not None
        judge = _judge.Judge(
            model, "cell", tmp_path / "gw", gw, request_timeout_s=30, max_cost_usd=1.0
        )
        body = {"model": "m", "messages": [{"role": "user", "content": f"Report: {FINDING}"}]}

        def ask(env: dict[str, str]) -> httpx.Response:
            headers = {"Authorization": f"Bearer {env['OPENAI_API_KEY']}"}
            url = f"{env['OPENAI_BASE_URL']}/chat/completions"
            return httpx.post(url, json=body, headers=headers, timeout=30)

        with judge.route(box=None, timeout_s=60) as env:  # type: ignore[arg-type]
            served = ask(env)
            assert env["OPENAI_API_KEY"] != REAL_KEY and env["OPENAI_API_BASE"].endswith("/v1")
        assert served.status_code == 200, served.text
        assert served.json()["choices"][0]["message"]["content"] == "PASS"
        assert ask(env).status_code == 401  # the lease ended with the verifier run
    assert [r.headers["authorization"] for r in upstream.requests] == [f"Bearer {REAL_KEY}"]
    cost = (JUDGE_USAGE.input_tokens * PRICES[0] + JUDGE_USAGE.output_tokens * PRICES[1]) / 1e6
    assert judge.total() == JudgeUsage("openai/judge-scripted", 1, 1, 321, 7, pytest.approx(cost))
