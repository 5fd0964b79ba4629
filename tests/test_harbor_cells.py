"""Harbor-format tasks as cells, for real: the example dataset in ``examples/harbor-tasks``
(a pytest-style verifier writing reward.txt, a multi-key reward.json, a task whose oracle
fails, an agent time-out, a verifier that leaves no reward, ``allow_internet`` false and
true) built and run on the Docker daemon with Harbor's ``oracle`` and ``nop``, a replay
(scripted) agent and a model agent against an OpenAI-protocol server on 127.0.0.1.

The records must say what happened: rewards and passes as the verifiers wrote them,
verifier errors as infrastructure errors (never a silent 0), the agent's time-out as its
termination, the egress proxy's connections only where the task allows the internet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.harbor import HarborTaskError, discover_harbor_tasks, load_harbor_task
from pytest_automedbench.results import CellResult
from pytest_automedbench.stats import summarise

from .conftest import REPO
from .fake_openai import FakeOpenAI, TokenUsage, ToolCall, ToolCallReply
from .local_http import LocalServer

EXAMPLES = REPO / "examples" / "harbor-tasks"
VALUE = "harbor-value-7"


def _records(out: Path) -> list[CellResult]:
    lines = (out / "ledger.jsonl").read_text().splitlines()
    return [CellResult.model_validate_json(line) for line in lines]


def _by(records: list[CellResult]) -> dict[tuple[str, str, int], CellResult]:
    return {(r.agent, r.task, r.run): r for r in records}


def _session(
    out: Path, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest", f"--amb-out={out}", "-p", "no:cacheprovider",
               "-q", "--sandbox", "docker", *args]  # fmt: skip
    return subprocess.run(
        command,
        cwd=cwd or out.parent,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=900,
    )


# --------------------------------------------------------------------------- collection


def test_the_example_tasks_load_with_categories_ids_and_markers() -> None:
    tasks = {t.id: t for t in discover_harbor_tasks([EXAMPLES])}
    assert set(tasks) == {
        "basics.csv-stats",
        "basics.hello-pytest",
        "edge.broken-oracle",
        "edge.no-reward",
        "edge.slow-solution",
        "net.offline",
        "net.online",
    }
    assert tasks["basics.csv-stats"].category == "data_analysis"  # [metadata] category wins
    assert tasks["basics.hello-pytest"].category == "basics"  # else the category folder
    assert tasks["basics.hello-pytest"].markers == ("harbor", "basics", "files", "easy")
    assert tasks["edge.slow-solution"].time_limit_s == 15.0
    assert tasks["net.offline"].internet is False and tasks["net.online"].internet is True


def _write_task(folder: Path, toml: str, instruction: str | None = "Do it.") -> Path:
    (folder / "environment").mkdir(parents=True)
    (folder / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\n")
    (folder / "tests").mkdir()
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (folder / "task.toml").write_text(toml)
    if instruction is not None:
        (folder / "instruction.md").write_text(instruction)
    return folder


@pytest.mark.parametrize(
    ("toml", "instruction", "names"),
    [
        ('version = "1.0"\n[agent]\ntimeout_sec = "soon"\n', "Do it.", ["[agent] timeout_sec"]),
        ('version = "1.0"\n[environment]\ncpus = -1\n', "Do it.", ["[environment] cpus"]),
        ('version = "1.0"\n[metadata]\npass_threshold = "high"\n', "Do it.", ["pass_threshold"]),
        ("version = = 1", "Do it.", ["not valid TOML"]),
        ('version = "1.0"\n', None, ["instruction.md", "missing"]),
    ],
)
def test_a_malformed_task_is_an_error_naming_the_file_and_field(
    tmp_path: Path, toml: str, instruction: str | None, names: list[str]
) -> None:
    folder = _write_task(tmp_path / "bad", toml, instruction)
    with pytest.raises(HarborTaskError) as caught:
        load_harbor_task(folder)
    message = str(caught.value)
    assert str(folder) in message
    for name in names:
        assert name in message


def test_collection_ids_markers_errors_and_the_tasks_own_tests(tmp_path: Path) -> None:
    """One cell per task x agent x attempt with readable ids; ``-m`` selects by category
    and keyword; a malformed task is a collection error naming the file and field; a
    task's own ``tests/test_*.py`` is never collected; an unset variable skips its task."""
    root = tmp_path / "tasks"
    _write_task(root / "bad", 'version = "1.0"\n[verifier]\ntimeout_sec = 0\n')
    good = _write_task(root / "good", 'version = "1.0"\n[task]\nkeywords = ["Quick Win"]\n')
    (good / "tests" / "test_outputs.py").write_text(
        "def test_never_collected():\n    raise SystemExit(9)\n"
    )
    needs = _write_task(
        root / "needs-key", 'version = "1.0"\n[environment.env]\nTOKEN = "${AMB_UNSET_TOKEN_VAR}"\n'
    )
    out = tmp_path / "out"
    args = ["--harbor", str(root), "--agent", "nop", "--runs", "2", "--co", "--strict-markers"]
    collected = _session(out, *args)
    text = collected.stdout + collected.stderr
    assert collected.returncode != 0, text  # the collection error fails the session
    assert f"{root / 'bad' / 'task.toml'}: [verifier] timeout_sec" in text
    assert "good/task.toml::test_harbor[good-harbor-r0]" in text
    assert "good/task.toml::test_harbor[good-harbor-r1]" in text
    assert "test_never_collected" not in text and "test_outputs" not in text
    (root / "bad" / "task.toml").unlink()  # now the rest runs: -m by keyword marker
    chosen = _session(out, "--harbor", str(root), "--agent", "nop", "--co", "-m", "quick_win",
                      "--strict-markers")  # fmt: skip
    assert chosen.returncode == 0, chosen.stdout + chosen.stderr
    assert "good-harbor-r0" in chosen.stdout and "needs-key" not in chosen.stdout
    ran = _session(out, "--harbor", str(needs), "--agent", "nop", "-rs")
    assert "1 skipped" in ran.stdout, ran.stdout + ran.stderr
    assert "AMB_UNSET_TOKEN_VAR" in ran.stdout and "[environment].env.TOKEN" in ran.stdout


def test_the_harbor_paths_may_come_from_pyproject(tmp_path: Path) -> None:
    """``harbor = [...]`` under ``[tool.automedbench]``, relative to the rootdir: only the
    Harbor tasks are collected when no path is given (not the rootdir's own tests)."""
    project = tmp_path / "project"
    _write_task(project / "tasks" / "one", 'version = "1.0"\n')
    (project / "test_unrelated.py").write_text("def test_not_a_cell():\n    pass\n")
    (project / "pyproject.toml").write_text(
        '[tool.automedbench]\nharbor = ["tasks"]\nagent = ["nop"]\n'
    )
    done = _session(project / "out", "--co", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tasks/one/task.toml::test_harbor[one-harbor-r0]" in done.stdout
    assert "test_not_a_cell" not in done.stdout


# --------------------------------------------------------------------------- on Docker


class _ValueHandler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = f"{VALUE}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def base_images() -> dict[str, str]:
    """The example tasks' base images mapped to the project's local ones (no registry is
    reachable here): ubuntu to the debootstrap base, python to the agent image (its
    /venv has pytest, which the pytest-style verifier uses)."""
    from pytest_automedbench.sandbox.docker import docker_client
    from pytest_automedbench.sandbox.images import ensure_images

    images = ensure_images(docker_client(), "debootstrap")
    return {"ubuntu:24.04": images.base, "python:3.11-slim-bookworm": images.agent}


def _network_args(server: LocalServer, bases: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    port = server.origin.rsplit(":", 1)[1]
    args = ["--sandbox-host", "harbor-data.test=127.0.0.1",
            "--sandbox-allow-host", f"harbor-data.test:{port}",
            "--sandbox-allow-network", "127.0.0.1/32",
            "--harbor-env", "AMB_HARBOR_DATA_URL"]  # fmt: skip
    for image, local in bases.items():
        args += ["--harbor-base", f"{image}={local}"]
    return args, {"AMB_HARBOR_DATA_URL": f"http://harbor-data.test:{port}/value.txt"}


#: The tests that read :func:`builtin_session` run on one xdist worker (``scripts/test``
#: uses --dist loadgroup), so the session, ~40 s of Docker trials, runs once per test run
#: rather than once on each worker that draws one of them.
READS_BUILTIN_SESSION = pytest.mark.xdist_group("harbor-builtin-session")


@pytest.fixture(scope="module")
def builtin_session(
    tmp_path_factory: pytest.TempPathFactory, base_images: dict[str, str]
) -> Iterator[tuple[Path, subprocess.CompletedProcess[str]]]:
    """``oracle`` and ``nop`` on every example task, once, on Docker."""
    out = tmp_path_factory.mktemp("harbor") / "out"
    out.parent.mkdir(exist_ok=True)
    with LocalServer(_ValueHandler) as server:
        args, env = _network_args(server, base_images)
        reports = [f"--alluredir={out / 'allure'}", f"--junitxml={out / 'junit.xml'}"]
        done = _session(out, "--harbor", str(EXAMPLES), "--agent", "oracle", "--agent", "nop",
                        "-n", "2", *reports, *args, env=env)  # fmt: skip
    yield out, done


@pytest.mark.slow
@READS_BUILTIN_SESSION
def test_oracle_and_nop_get_the_rewards_the_verifiers_wrote(
    builtin_session: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, done = builtin_session
    records = _by(_records(out))
    text = done.stdout + done.stderr
    assert len(records) == 14, text
    oracle = {task: records["oracle", task, 0] for _, task, _ in records}
    passed = {t for t, r in oracle.items() if r.passed}
    assert passed == {"basics.csv-stats", "basics.hello-pytest", "net.online"}, text
    csv = oracle["basics.csv-stats"]
    assert csv.reward == 1.0 and csv.task_metrics == {
        "reward": 1.0, "mean_ok": 1.0, "count_ok": 1.0, "abs_error": 0.0,
    }  # fmt: skip
    assert csv.track == "data_analysis" and csv.category == "data_analysis"
    assert csv.resolved and csv.status == "scored" and csv.tier == "harbor"
    assert csv.overall == pytest.approx(0.5 * (csv.agentic or 0) + 0.5 * 1.0, abs=1e-6)
    assert set(csv.phase_s) == {"environment", "agent", "verifier"}
    for record in records.values():  # wall_s is the whole attempt, its phases inside it
        assert record.wall_s >= sum(record.phase_s.values()) - 0.01, record
    assert oracle["basics.hello-pytest"].task_metrics == {"reward": 1.0}  # from reward.txt
    broken = oracle["edge.broken-oracle"]
    assert broken.status == "scored" and broken.reward == 0.0 and broken.passed is False
    slow = oracle["edge.slow-solution"]
    assert slow.termination == "time_limit" and slow.reward == 0.0, slow
    assert slow.phase_s["agent"] < 40  # cut at the task's 15 s, not the call's 60 s
    # E1-E5 from the trajectory as for any cell: the time-out is E4, the missing
    # submission E5; the oracle that ran its solution read its inputs (no E2).
    assert {"E4", "E5"} <= {c.code for c in slow.error_codes}, slow.error_codes
    assert not any(c.code == "E2" for c in csv.error_codes), csv.error_codes
    assert oracle["net.offline"].reward == 0.0  # allow_internet = false: no route at all
    for agent in ("oracle", "nop"):
        missing = records[agent, "edge.no-reward", 0]
        assert missing.status == "infra_error" and missing.termination == "verifier_error"
        assert missing.reward is None and missing.passed is None
        assert "reward_missing" in str(missing.error), missing.error
    nop = [r for (a, _, _), r in records.items() if a == "nop" and r.status == "scored"]
    assert nop and all(r.reward == 0.0 and not r.passed for r in nop)
    # pytest's verdicts say the same: 3 passed, the rest failed, 2 errors (verifier).
    assert "3 passed" in done.stdout and "2 errors" in done.stdout, done.stdout[-3000:]


@pytest.mark.slow
@READS_BUILTIN_SESSION
def test_only_a_task_that_allows_the_internet_gets_a_route_out(
    builtin_session: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, _ = builtin_session
    records = _by(_records(out))

    def egress(task: str) -> list[dict[str, Any]]:
        trajectory = Path(records["oracle", task, 0].cell_dir) / "trajectory.jsonl"
        events = [json.loads(line) for line in trajectory.read_text().splitlines()]
        return [e for e in events if e["kind"] == "egress"]

    online = egress("net.online")
    assert online and online[0]["host"] == "harbor-data.test" and online[0]["allowed"]
    assert egress("net.offline") == []
    offline_dir = Path(records["oracle", "net.offline", 0].cell_dir)
    assert not (offline_dir / "egress.jsonl").exists()


@pytest.mark.slow
@READS_BUILTIN_SESSION
def test_the_verifier_runs_after_the_agent_and_the_agent_never_sees_tests_or_solution(
    builtin_session: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, _ = builtin_session
    records = _by(_records(out))
    nop = Path(records["nop", "basics.hello-pytest", 0].cell_dir)
    kinds = [
        json.loads(line)["kind"] for line in (nop / "trajectory.jsonl").read_text().splitlines()
    ]
    assert kinds.index("end") < kinds.index("verifier")
    phases = [json.loads(line) for line in (nop / "trajectory.jsonl").read_text().splitlines()]
    names = [e["name"] for e in phases if e["kind"] == "phase"]
    assert names == ["environment", "agent", "verifier"]
    assert (nop / "verifier" / "test-stdout.txt").read_text().count("failed") >= 1


@pytest.mark.slow
@READS_BUILTIN_SESSION
def test_each_attempt_is_a_harbor_trial_that_harbors_own_models_accept(
    builtin_session: tuple[Path, subprocess.CompletedProcess[str]], harbor_python: Path
) -> None:
    out, _ = builtin_session
    records = _records(out)
    trial_dirs = [
        Path((Path(r.cell_dir) / "harbor-trial.txt").read_text().strip()) for r in records
    ]
    program = textwrap.dedent(
        """
        import json, sys
        from pathlib import Path
        from harbor.models.job.config import JobConfig
        from harbor.models.job.result import JobResult
        from harbor.models.trial.result import TrialResult
        from harbor.viewer.scanner import JobScanner
        out = {}
        job = Path(sys.argv[1]).parent  # every trial of the session is in one job folder
        JobConfig.model_validate_json((job / "config.json").read_text())
        result = JobResult.model_validate_json((job / "result.json").read_text())
        listed = JobScanner(job.parent).list_trials(job.name)
        out["job"] = {"n_total_trials": result.n_total_trials, "listed": len(listed)}
        for path in sys.argv[1:]:
            result = TrialResult.model_validate_json(open(path + "/result.json").read())
            rewards = result.verifier_result.rewards if result.verifier_result else None
            exc = result.exception_info.exception_type if result.exception_info else None
            out[path] = {"rewards": rewards, "exception": exc}
        print(json.dumps(out))
        """
    )
    checked = subprocess.run(
        [str(harbor_python), "-c", program, *map(str, trial_dirs)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    seen = json.loads(checked.stdout)
    assert seen.pop("job") == {"n_total_trials": len(records), "listed": len(records)}
    for record, folder in zip(records, trial_dirs, strict=True):
        trial = seen[str(folder)]
        if record.status == "infra_error":
            assert trial["rewards"] is None and trial["exception"] is not None
        else:
            assert trial["rewards"] == record.task_metrics


def _reply(call_id: str, name: str, arguments: dict[str, Any]) -> ToolCallReply:
    return ToolCallReply(
        (ToolCall(call_id, name, json.dumps(arguments)),), usage=TokenUsage(1000, 100)
    )


@pytest.mark.slow
def test_a_model_agent_and_a_replay_agent_work_inside_the_task_container(
    tmp_path: Path, base_images: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model agent through litellm to a local OpenAI-protocol server, two attempts (one
    right, one wrong: pass@2 = 1, pass^2 = 0), and a hand-written replay on the
    multi-key task; tokens and cost are the server's numbers times the prices."""
    hello = EXAMPLES / "basics" / "hello-pytest"
    plan = {
        "language": "bash",
        "code": "mkdir -p /logs/agent/plan && echo '# Plan: write it' > /logs/agent/plan/plan.md",
    }
    script = [
        _reply("a1", "execute", plan),
        _reply("a2", "write_file", {"path": "/app/hello.txt", "content": "Hello, world!\n"}),
        _reply("a3", "submit_results", {}),
        _reply("b1", "write_file", {"path": "/app/hello.txt", "content": "Goodbye\n"}),
        _reply("b2", "submit_results", {}),
    ]
    agents = tmp_path / "agents.yaml"
    agents.write_text(
        "fake-model:\n  model: openai/fake-model\n  api_key_env: AMB_FAKE_PROVIDER_KEY\n"
        "  input_usd_per_mtok: 2.0\n  output_usd_per_mtok: 8.0\n"
    )
    steps = tmp_path / "csv.yaml"
    steps.write_text(textwrap.dedent(
        """
        - tool: execute
          arguments:
            language: bash
            code: |
              python3 - <<'PY'
              import csv, json
              v = [float(r["value"]) for r in csv.DictReader(open("/app/data.csv"))]
              json.dump({"mean": sum(v) / len(v), "count": len(v)}, open("/app/answer.json", "w"))
              PY
        - tool: submit_results
          arguments: {}
        """
    ))  # fmt: skip
    bases = [
        a for image, local in base_images.items() for a in ("--harbor-base", f"{image}={local}")
    ]
    out = tmp_path / "out"
    with FakeOpenAI(script) as server:
        done = _session(out, "--harbor", str(hello), "--agent", "fake-model", "--runs", "2",
                        "--agents-file", str(agents), "--agent-api-base", server.url, *bases,
                        env={"AMB_FAKE_PROVIDER_KEY": "k"})  # fmt: skip
    text = done.stdout + done.stderr
    records = _by(_records(out))
    first, second = (
        records["fake-model", "hello-pytest", 0],  # a task folder given alone: no category
        records["fake-model", "hello-pytest", 1],
    )
    assert first.passed is True and second.passed is False, text
    assert first.tokens_in == 3000 and first.tokens_out == 300
    assert first.cost_usd == pytest.approx((3000 * 2.0 + 300 * 8.0) / 1e6)
    assert first.stages is not None  # the plan was found where the brief said: /logs/agent
    (plan_item,) = [i for i in first.stages.items if i.id == "s1_plan_exists"]
    assert plan_item.evidence.startswith("plan.md:"), plan_item
    (group,) = summarise(list(records.values()))
    assert group.pass_at_k == 1.0 and group.pass_hat_k == 0.0 and group.k == 2
    replay = _session(tmp_path / "out2", "--harbor", str(EXAMPLES / "basics" / "csv-stats"),
                      "--agent", f"replay:{steps}", *bases)  # fmt: skip
    (csv,) = _records(tmp_path / "out2")
    assert csv.passed is True and csv.task_metrics["mean_ok"] == 1.0, replay.stdout[-2000:]
    # --amb-resume takes the finished attempt over (same task content, same settings).
    again = _session(tmp_path / "out2", "--harbor", str(EXAMPLES / "basics" / "csv-stats"),
                     "--agent", f"replay:{steps}", "--amb-resume", *bases)  # fmt: skip
    assert "1 passed" in again.stdout, again.stdout[-2000:]
    assert len(_records(tmp_path / "out2")) == 1  # nothing new in the ledger


@pytest.mark.slow
def test_an_exported_catalogue_task_run_back_with_the_oracle_scores_the_reference(
    tmp_path: Path, base_images: dict[str, str]
) -> None:
    """``automedbench export-harbor`` of the kidney task, run back through ``--harbor`` with
    ``oracle`` on Docker, gives the TASK score the reference agent gets on the catalogue
    cell itself (the same staged data, the same evaluator)."""
    cache = tmp_path / "out" / "data"
    exported = subprocess.run(
        [sys.executable, "-m", "pytest_automedbench.cli", "export-harbor", "kidney-tumor-seg",
         "--tier", "lite", "--out", str(tmp_path / "tasks"), "--data-cache", str(cache)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stdout + exported.stderr
    agent_image = base_images["python:3.11-slim-bookworm"]
    harbor = _session(tmp_path / "out", "--harbor", str(tmp_path / "tasks"), "--agent", "oracle",
                      "--harbor-base", f"python:3.11-slim-bookworm={agent_image}")  # fmt: skip
    (attempt,) = _records(tmp_path / "out")
    assert attempt.passed is True, harbor.stdout[-3000:]
    assert attempt.category == "segmentation" and attempt.task == "kidney-tumor-seg-lite"
    catalogue = _session(tmp_path / "ref", str(REPO / "suites" / "segmentation"), "-k",
                         "kidney-tumor-seg", "--tier", "lite", "--agent", "reference")  # fmt: skip
    (reference,) = _records(tmp_path / "ref")
    assert reference.status == "scored", catalogue.stdout[-3000:]
    assert attempt.task_metrics["task"] == pytest.approx(reference.task_score, abs=1e-6)
    assert attempt.task_metrics["macro_dice"] == pytest.approx(
        reference.task_metrics["macro_dice"], abs=1e-6
    )


@pytest.mark.slow
@READS_BUILTIN_SESSION
def test_allure_shows_an_attempt_with_its_category_and_the_verifiers_output(
    builtin_session: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, _ = builtin_session
    results = [json.loads(p.read_text()) for p in (out / "allure").glob("*-result.json")]
    (csv,) = [r for r in results if "oracle-basics.csv-stats" in r["name"]]
    labels = {(label["name"], label["value"]) for label in csv["labels"]}
    assert ("epic", "data_analysis") in labels and ("story", "harbor") in labels
    attached = {a["name"] for a in csv.get("attachments", [])}
    assert {"verifier output", "reward.json", "trajectory"} <= attached, attached
    assert csv["status"] == "passed"


COMPOSE_TASK = {
    "task.toml": (
        'version = "1.0"\n[agent]\ntimeout_sec = 120.0\n[environment]\nallow_internet = false\n'
    ),
    "instruction.md": "Read the case id in /data/cases.json and write it to /app/answer.txt.\n",
    "environment/Dockerfile": (
        "FROM ubuntu:24.04\nWORKDIR /app\nCOPY environment/bootstrap.sh /bootstrap.sh\n"
    ),
    "environment/bootstrap.sh": (
        "set -eu\nmkdir -p /data\n"
        'echo \'{"case": "opaque-7"}\' > /data/cases.json\n'
        "echo opaque-7 > /tests/gold.txt\n"
    ),
    "environment/docker-compose.yaml": """
services:
  main:
    build: {context: .., dockerfile: environment/Dockerfile}
    image: ${COMPOSE_PROJECT_NAME}-img
    volumes: ["case-data:/data:ro"]
    depends_on: {bootstrap: {condition: service_completed_successfully}}
  bootstrap:
    image: ${COMPOSE_PROJECT_NAME}-img
    volumes: ["../tests:/tests:rw", "case-data:/data"]
    command: ["/bin/bash", "/bootstrap.sh"]
volumes:
  case-data:
""",
    "tests/test.sh": (
        'if [ "$(cat /app/answer.txt)" = "$(cat /tests/gold.txt)" ]; then r=1; else r=0; fi\n'
        'echo "{\\"reward\\": $r}" > /logs/verifier/reward.json\n'
    ),
    "solution/solve.sh": (
        "python3 -c \"import json; print(json.load(open('/data/cases.json'))['case'])\""
        " > /app/answer.txt\n"
    ),
}


@pytest.mark.slow
def test_a_compose_environment_runs_its_bootstrap_before_the_agent(
    tmp_path: Path, base_images: dict[str, str]
) -> None:
    """HealthAgentBench's pattern: a one-shot ``bootstrap`` service fills a shared volume
    and writes the gold into ``tests/`` (the attempt's copy of it) before ``main``, the
    agent's container, starts with the volume read-only; the verifier then finds the gold
    at /tests, and the task folder itself is left as it was."""
    folder = tmp_path / "compose-case"
    for name, text in COMPOSE_TASK.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    bases = ["--harbor-base", f"ubuntu:24.04={base_images['ubuntu:24.04']}"]
    done = _session(tmp_path / "out", "--harbor", str(folder), "--agent", "oracle",
                    "--agent", "nop", *bases)  # fmt: skip
    records = _by(_records(tmp_path / "out"))
    oracle, nop = records["oracle", "compose-case", 0], records["nop", "compose-case", 0]
    assert oracle.passed is True and nop.passed is False, done.stdout[-3000:]
    assert not (folder / "tests" / "gold.txt").exists()  # written into the attempt's copy


SHEBANG_TASK = {
    "task.toml": 'version = "1.0"\nartifacts = ["/app/out.txt", '
    '{source = "/app/out.txt", destination = "copies/out.txt"}]\n'
    '[metadata]\ncategory = "scripts"\n',
    "instruction.md": "Write /app/out.txt.\n",
    # BuildKit syntax, as current Terminal-Bench tasks write it (the syntax line is left out).
    "environment/Dockerfile": textwrap.dedent(
        """\
        # syntax=docker/dockerfile:1
        FROM python:3.11-slim-bookworm
        WORKDIR /app
        RUN <<'EOF' bash
        echo built > /app/heredoc.txt
        EOF
        COPY --chmod=755 check.sh /usr/local/bin/amb-check
        RUN --mount=type=cache,target=/root/.cache/amb echo cached > /root/.cache/amb/x \\
            && cp /root/.cache/amb/x /app/cached.txt
        """
    ),
    "environment/check.sh": "#!/bin/sh\ncat /app/heredoc.txt /app/cached.txt\n",
    # Python scripts: their shebang decides the interpreter; relative paths are WORKDIR's.
    "solution/solve.sh": textwrap.dedent(
        """\
        #!/usr/bin/env python3
        import os
        print("the oracle ran in", os.getcwd())
        with open("out.txt", "w") as out:
            out.write(os.environ.get("DEBIAN_FRONTEND", "unset"))
        with open("/logs/artifacts/note.txt", "w") as note:
            note.write("an artifact")
        """
    ),
    "tests/test.sh": textwrap.dedent(
        """\
        #!/usr/bin/env python3
        import json, os, pathlib
        out = pathlib.Path("out.txt")
        ok = out.is_file() and out.read_text() == "noninteractive"
        import subprocess
        built = subprocess.run(["amb-check"], capture_output=True, text=True).stdout
        ok = ok and built.split() == ["built", "cached"]
        logs = pathlib.Path("/logs/verifier")
        (logs / "reward.txt").write_text("1" if ok else "0")
        (logs / "reward.json").write_text(json.dumps({"reward": 0.5}))  # 0.3.x: txt decides
        """
    ),
}
NO_SHEBANG_TASK = {
    "task.toml": 'version = "1.0"\n[metadata]\ncategory = "scripts"\n',
    "instruction.md": "Write /app/x.txt.\n",
    "environment/Dockerfile": "FROM python:3.11-slim-bookworm\nWORKDIR /app\n",
    "solution/solve.sh": "printf done > x.txt\n",
    "tests/test.sh": 'if [[ "$(cat x.txt)" == done ]]; then r=1; else r=0; fi\n'
    "echo $r > /logs/verifier/reward.txt\n",
}


def _write_files(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


@pytest.mark.slow
def test_scripts_run_by_their_shebang_in_workdir_with_the_oracles_log_and_artifacts(
    tmp_path: Path, base_images: dict[str, str]
) -> None:
    """A Dockerfile in BuildKit syntax (heredoc ``RUN``, ``RUN --mount=type=cache``,
    ``COPY --chmod``) builds, its output in the cell's build.log. Harbor's way of running
    scripts: a Python ``solve.sh`` and ``test.sh`` (their
    shebang decides), scripts without one run by bash, both in the image's WORKDIR; the
    oracle gets ``DEBIAN_FRONTEND=noninteractive`` and its output goes to
    ``/logs/agent/oracle.txt``; ``/logs/artifacts`` reaches the trial folder; with both
    reward files, a 0.3.x-schema task's ``reward.txt`` decides."""
    tasks = tmp_path / "tasks"
    _write_files(tasks / "py-scripts", SHEBANG_TASK)
    _write_files(tasks / "plain-scripts", NO_SHEBANG_TASK)
    seed = tasks / "py-scripts" / "environment" / "seed.txt"  # a content never built before
    seed.write_text(uuid.uuid4().hex)
    agent_image = base_images["python:3.11-slim-bookworm"]
    done = _session(tmp_path / "out", "--harbor", str(tasks), "--agent", "oracle",
                    "--agent", "nop", "--harbor-base",
                    f"python:3.11-slim-bookworm={agent_image}")  # fmt: skip
    records = _by(_records(tmp_path / "out"))
    text = done.stdout[-3000:]
    for task in ("py-scripts", "plain-scripts"):
        assert records["oracle", task, 0].passed is True, (task, text)
        assert records["nop", task, 0].passed is False, (task, text)
    oracle = records["oracle", "py-scripts", 0]
    assert oracle.task_metrics == {"reward": 1.0}
    trial = Path((Path(oracle.cell_dir) / "harbor-trial.txt").read_text().strip())
    assert "the oracle ran in /app" in (trial / "agent" / "oracle.txt").read_text()
    assert (trial / "artifacts" / "note.txt").read_text() == "an artifact"
    for declared in ("app/out.txt", "copies/out.txt"):  # the task's [[artifacts]]
        assert (trial / "artifacts" / declared).read_text() == "noninteractive"
    built = [(Path(records[a, "py-scripts", 0].cell_dir) / "build.log").read_text() for a in
             ("oracle", "nop")]  # fmt: skip
    assert sum("RUN <<'EOF' bash" in log for log in built) == 1, built  # the one that built
    assert sum("already built" in log for log in built) == 1, built
    from pytest_automedbench.sandbox.docker import docker_client

    tag = next(log for log in built if "already built" in log).split(":", 2)
    docker_client().images.remove(f"{tag[0]}:{tag[1]}", force=True)


TWO_STEP_TASK = {
    "task.toml": textwrap.dedent(
        """\
        version = "1.0"
        [metadata]
        category = "steps"
        [[steps]]
        name = "one"
        min_reward = 1.0
        [[steps]]
        name = "two"
        """
    ),
    "instruction.md": "A task of two steps.\n",
    "environment/Dockerfile": "FROM python:3.11-slim-bookworm\nWORKDIR /app\n",
    # The top-level placeholder that once let nop pass a multi-step task.
    "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
    "steps/one/instruction.md": "Write one.txt holding 1.\n",
    "steps/one/solution/solve.sh": "#!/bin/bash\necho 1 > one.txt\n",
    "steps/one/tests/test.sh": "#!/bin/bash\n"
    'if [ "$(cat /app/one.txt)" = 1 ]; then r=1; else r=0; fi\n'
    "echo $r > /logs/verifier/reward.txt\n",
    "steps/two/instruction.md": "Copy seed.txt to two.txt.\n",
    "steps/two/workdir/setup.sh": "#!/bin/bash\necho planted > seed.txt\n",
    "steps/two/solution/solve.sh": "#!/usr/bin/env python3\n"
    "open('two.txt', 'w').write(open('seed.txt').read())\n",
    "steps/two/tests/test.sh": "#!/bin/bash\n"
    'if [ "$(cat /app/two.txt)" = planted ] && [ -f /app/one.txt ]; then r=1; else r=0; fi\n'
    'echo "{\\"reward\\": $r, \\"two_ok\\": $r}" > /logs/verifier/reward.json\n',
}


@pytest.mark.slow
def test_a_two_step_task_gives_per_step_rewards_and_nop_fails_it(
    tmp_path: Path, base_images: dict[str, str], harbor_python: Path
) -> None:
    """``[[steps]]``: each step staged (its workdir's setup.sh run), its solution run by the
    oracle and its tests verified in turn; the task's reward the per-key mean over the
    steps (a key one step lacks counted 0); ``min_reward`` stops nop after the first
    step; the placeholder top-level test.sh decides nothing. The trial folder has the
    steps' results as Harbor writes them, and Harbor's TrialResult accepts it."""
    _write_files(tmp_path / "tasks" / "two-steps", TWO_STEP_TASK)
    agent_image = base_images["python:3.11-slim-bookworm"]
    done = _session(tmp_path / "out", "--harbor", str(tmp_path / "tasks"), "--agent", "oracle",
                    "--agent", "nop", "--harbor-base",
                    f"python:3.11-slim-bookworm={agent_image}")  # fmt: skip
    records = _by(_records(tmp_path / "out"))
    oracle, nop = records["oracle", "two-steps", 0], records["nop", "two-steps", 0]
    text = done.stdout[-3000:]
    assert oracle.step_rewards == {
        "one": {"reward": 1.0}, "two": {"reward": 1.0, "two_ok": 1.0},
    }, text  # fmt: skip
    assert oracle.task_metrics == {"reward": 1.0, "two_ok": 0.5} and oracle.passed is True
    assert nop.step_rewards == {"one": {"reward": 0.0}}, text  # min_reward stopped it
    assert nop.reward == 0.0 and nop.passed is False
    assert oracle.phase_s["verifier"] > 0 and oracle.wall_s >= sum(oracle.phase_s.values()) - 0.01
    trial = Path((Path(oracle.cell_dir) / "harbor-trial.txt").read_text().strip())
    assert (trial / "steps" / "one" / "verifier" / "reward.txt").read_text().strip() == "1"
    assert (trial / "steps" / "two" / "agent" / "oracle.txt").is_file()
    # The second step is a further run of the same agent: one start event, one watch.
    from pytest_automedbench.events import read_events

    kinds = [e.kind for e in read_events(Path(oracle.cell_dir) / "trajectory.jsonl")]
    assert kinds.count("start") == 1 and kinds.count("end") == 2, kinds
    program = (
        "import sys; from harbor.models.trial.result import TrialResult\n"
        "r = TrialResult.model_validate_json(open(sys.argv[1]).read())\n"
        "print([(s.step_name, s.verifier_result.rewards) for s in r.step_results])"
    )
    checked = subprocess.run(
        [str(harbor_python), "-c", program, str(trial / "result.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    assert "('two', {'reward': 1" in checked.stdout, checked.stdout


@pytest.mark.slow
def test_claude_code_solves_a_harbor_task_through_the_gateway(
    tmp_path: Path, base_images: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real Claude Code CLI, headless in the task's container as its root user, its
    model reached only through the cell's gateway (a scripted Anthropic-protocol upstream
    on 127.0.0.1): its commands act in the container, the verifier passes the attempt and
    the record has the upstream's tokens and their price."""
    from pytest_automedbench.config import RunConfig
    from pytest_automedbench.results import CellKey
    from pytest_automedbench.runner import CellPlan, run_cell
    from tests.scripted_upstream import ScriptedUpstream, Shell, StepUsage, Text

    monkeypatch.setenv("AMB_TEST_HARBOR_KEY", "sk-test-host-only")
    task = load_harbor_task(EXAMPLES / "basics" / "hello-pytest")
    script = [
        Shell(
            "mkdir -p /logs/agent/plan && echo '# Plan' > /logs/agent/plan/plan.md",
            StepUsage(1000, 20),
        ),
        Shell("echo 'Hello, world!' > /app/hello.txt", StepUsage(1100, 20)),
        Text("Done.", usage=StepUsage(1200, 10)),
    ]
    upstream = ScriptedUpstream(script).start()
    try:
        definition = {"model": "anthropic/claude-scripted-1", "api_base": upstream.url,
                      "api_key_env": "AMB_TEST_HARBOR_KEY", "input_usd_per_mtok": 3.0,
                      "output_usd_per_mtok": 15.0}  # fmt: skip
        config = RunConfig(
            amb_out=tmp_path / "out",
            sandbox="docker",
            sandbox_network="off",
            agent_definitions={"scripted-model": definition},
            harbor_base=tuple(f"{image}={local}" for image, local in base_images.items()),
        )
        agent = "claude-code:scripted-model"
        plan = CellPlan(
            key=CellKey(agent=agent, task=task.id, tier="harbor", run=0),
            task=task,
            staged=task.staged(),
            config=config,
            run_id="test-harbor-claude",
            cell_dir=tmp_path / "cell",
        )
        result = run_cell(plan)
        served = (upstream.served_input_tokens, upstream.served_output_tokens)
    finally:
        upstream.stop()
    assert result.status == "scored" and result.termination == "finished", result.error
    assert result.passed is True and result.harness == "claude-code"
    assert (result.tokens_in, result.tokens_out) == served
    assert result.cost_usd == pytest.approx((served[0] * 3.0 + served[1] * 15.0) / 1e6)
    assert result.stages is not None  # its plan was read where the brief put it
    (plan_item,) = [i for i in result.stages.items if i.id == "s1_plan_exists"]
    assert plan_item.evidence.startswith("plan.md:"), plan_item


@pytest.mark.slow
@READS_BUILTIN_SESSION
def test_junit_says_what_the_ledger_says_of_each_attempt(
    builtin_session: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    import xml.etree.ElementTree as ET

    out, _ = builtin_session
    cases = ET.parse(out / "junit.xml").getroot().iter("testcase")
    seen = {}
    for case in cases:
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        outcome = (
            "error"
            if case.find("error") is not None
            else ("failure" if case.find("failure") is not None else "passed")
        )
        seen[case.get("name")] = (outcome, properties)
    outcome, properties = seen["test_harbor[oracle-basics.csv-stats-harbor-r0]"]
    assert outcome == "passed"
    assert (properties["amb_reward"], properties["amb_passed"]) == ("1", "true")
    assert properties["amb_category"] == "data_analysis"
    outcome, properties = seen["test_harbor[nop-basics.csv-stats-harbor-r0]"]
    assert outcome == "failure" and properties["amb_passed"] == "false"
    outcome, properties = seen["test_harbor[oracle-edge.no-reward-harbor-r0]"]
    assert outcome == "error" and properties["amb_status"] == "infra_error"
    assert properties["amb_reward"] == ""
