"""``automedbench export-harbor``: a catalogue task as a Harbor task folder.

The folder is checked with Harbor's own models (in the Harbor venv that
``scripts/harbor-oracle`` builds), and its oracle and verifier are run end to end on
this host, without Docker, through the scripts' path overrides (AMB_PUBLIC, ...): the
reward must agree with what this project's own evaluator says of the same outputs.
The Docker round trip belongs to the Harbor runner's tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import SimpleITK as sitk

from pytest_automedbench.cli import main
from pytest_automedbench.evaluation import evaluate
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.harbor._export import (
    CONTAINER_PATHS,
    DEFAULT_EXPORT_BASE,
    ExportError,
    export_harbor_task,
)
from pytest_automedbench.session import stage_synthetic_task
from pytest_automedbench.tasks import TaskSpec, load_task

from .conftest import SUITES

TASK_ID = "kidney-tumor-seg"
TIER = "lite"
PYTHON = str(Path(sys.executable).absolute())


@pytest.fixture(scope="module")
def task() -> TaskSpec:
    return load_task(SUITES / "segmentation" / TASK_ID)


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data-cache")


@pytest.fixture(scope="module")
def exported(task: TaskSpec, data_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_harbor_task(task, TIER, tmp_path_factory.mktemp("export"), data_cache=data_cache)


@pytest.fixture(scope="module")
def staged(task: TaskSpec, data_cache: Path) -> StagedData:
    """The split a session stages for the task (the export's cache: staged once)."""
    return stage_synthetic_task(task, data_cache)


def _env(exported: Path, workspace: Path, logs: Path, tests: Path | None = None) -> dict[str, str]:
    return {
        **os.environ,
        "AMB_PUBLIC": str(exported / "environment" / "public"),
        "AMB_WORKSPACE": str(workspace),
        "AMB_TESTS": str(tests or exported / "tests"),
        "AMB_LOGS": str(logs),
        "AMB_PYTHON": PYTHON,
    }


def _bash(script: Path, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _reward(logs: Path) -> dict[str, Any]:
    value = json.loads((logs / "reward.json").read_text())
    assert isinstance(value, dict)
    return value


def test_the_folder_holds_a_complete_harbor_task(exported: Path, task: TaskSpec) -> None:
    assert exported.name == f"{TASK_ID}-{TIER}"
    for rel in (
        "task.toml",
        "instruction.md",
        "environment/Dockerfile",
        "environment/requirements.txt",
        "tests/test.sh",
        "tests/reward.py",
        "tests/spec.json",
        "tests/automedbench/pytest_automedbench/__init__.py",
        "tests/automedbench/pytest_automedbench/evaluators/__main__.py",
        "solution/solve.sh",
    ):
        assert (exported / rel).is_file(), rel
    for rel in ("tests/test.sh", "solution/solve.sh"):
        assert os.access(exported / rel, os.X_OK), rel
    cases = sorted(p.name for p in (exported / "environment" / "public").iterdir())
    assert len(cases) == task.data.synthetic.n_cases
    assert sorted(p.name for p in (exported / "tests" / "references").iterdir()) == cases
    # The hidden references never reach the agent's image.
    public_files = {p.name for p in (exported / "environment").rglob("*") if p.is_file()}
    assert "label.nii.gz" not in public_files
    spec = json.loads((exported / "tests" / "spec.json").read_text())
    assert spec["task_id"] == TASK_ID and spec["case_ids"] == cases

    dockerfile = (exported / "environment" / "Dockerfile").read_text()
    assert dockerfile.splitlines()[1] == f"FROM {DEFAULT_EXPORT_BASE}"
    for line in ("COPY public/ /public/", "WORKDIR /workspace", "/workspace/outputs"):
        assert line in dockerfile
    assert "[ -x /venv/bin/python ]" in dockerfile
    requirements = (exported / "environment" / "requirements.txt").read_text().splitlines()
    assert any(line.startswith("SimpleITK==") for line in requirements)
    assert any(line.startswith("scipy==") for line in requirements)

    instruction = (exported / "instruction.md").read_text()
    assert "{" not in instruction.split("## Harbor note")[0].replace("{0,1,2}", "")
    assert "/public/<case_id>/ct.nii.gz" in instruction
    assert "/workspace/outputs/<case_id>.nii.gz" in instruction
    assert "/workspace/plan/plan.md" in instruction
    assert f"{len(cases)} contrast-enhanced" in instruction


def test_task_toml_and_folder_load_with_harbors_own_code(
    exported: Path, harbor_python: Path, task: TaskSpec
) -> None:
    probe = (
        "import json, sys, warnings\n"
        "from pathlib import Path\n"
        "from harbor.models.task.config import TaskConfig\n"
        "from harbor.models.task.task import Task\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "folder = Path(sys.argv[1])\n"
        "config = TaskConfig.model_validate_toml((folder / 'task.toml').read_text())\n"
        "loaded = Task(folder)\n"
        "print(json.dumps({'name': config.task.name, 'keywords': config.task.keywords,\n"
        "    'metadata': config.metadata, 'agent': config.agent.timeout_sec,\n"
        "    'verifier': config.verifier.timeout_sec,\n"
        "    'network': config.environment.network_mode.value,\n"
        "    'cpus': config.environment.cpus, 'memory': config.environment.memory_mb,\n"
        "    'storage': config.environment.storage_mb,\n"
        "    'build': config.environment.build_timeout_sec,\n"
        "    'valid': Task.is_valid_dir(folder), 'task_name': loaded.name,\n"
        "    'instruction': loaded.instruction}))\n"
    )
    done = subprocess.run(
        [str(harbor_python), "-c", probe, str(exported)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["valid"] is True
    assert seen["name"] == seen["task_name"] == f"automedbench/{TASK_ID}-{TIER}"
    assert seen["keywords"] == ["segmentation", "ct", TIER]
    metadata = seen["metadata"]
    assert metadata["automedbench_task"] == TASK_ID
    assert metadata["tier"] == TIER
    assert metadata["track"] == metadata["category"] == "segmentation"
    assert metadata["pass_threshold"] == 1.0
    assert len(metadata["task_hash"]) == 16
    assert seen["agent"] == float(task.time_limit_s)
    assert seen["verifier"] == 600.0
    assert seen["network"] == "no-network"  # allow_internet = false
    assert (seen["cpus"], seen["memory"], seen["storage"]) == (2, 8192, 20480)
    assert seen["build"] == 1200.0
    assert seen["instruction"] == (exported / "instruction.md").read_text()


def test_oracle_and_verifier_agree_with_the_projects_evaluator(
    exported: Path, task: TaskSpec, staged: StagedData, tmp_path: Path
) -> None:
    workspace, logs = tmp_path / "workspace", tmp_path / "logs"
    env = _env(exported, workspace, logs)
    solved = _bash(exported / "solution" / "solve.sh", env, tmp_path)
    assert solved.returncode == 0, solved.stdout[-3000:] + solved.stderr[-3000:]
    outputs = workspace / "outputs"
    assert sorted(p.name for p in outputs.iterdir()) == [
        f"{case}.nii.gz" for case in staged.case_ids
    ]
    assert (workspace / "plan" / "plan.md").is_file()

    verified = _bash(exported / "tests" / "test.sh", env, tmp_path)
    assert verified.returncode == 0, verified.stderr[-3000:]
    reward = _reward(logs)
    ours = evaluate(
        task.eval_spec(list(staged.case_ids)), outputs, staged.private_dir, tmp_path / "eval"
    )
    assert ours.format.valid and ours.task_score >= task.rating.b
    assert reward["reward"] == 1.0
    assert reward["task"] == pytest.approx(ours.task_score, abs=1e-6)
    assert reward["format_valid"] == 1
    for name, value in ours.metrics.items():
        assert reward[name] == pytest.approx(value, abs=1e-6)
    assert all(isinstance(v, int | float) and not isinstance(v, bool) for v in reward.values())

    # No outputs at all: a valid verdict of 0, not an error.
    shutil.rmtree(outputs)
    verified = _bash(exported / "tests" / "test.sh", env, tmp_path)
    assert verified.returncode == 0, verified.stderr[-3000:]
    empty = _reward(logs)
    assert (empty["reward"], empty["task"], empty["format_valid"]) == (0.0, 0.0, 0)


def test_a_valid_submission_below_band_b_does_not_pass(
    exported: Path, task: TaskSpec, tmp_path: Path
) -> None:
    """All-background masks of the right geometry: format valid, TASK under B."""
    workspace, logs = tmp_path / "workspace", tmp_path / "logs"
    outputs = workspace / "outputs"
    outputs.mkdir(parents=True)
    public = exported / "environment" / "public"
    for case in sorted(p.name for p in public.iterdir()):
        image = sitk.ReadImage(str(public / case / "ct.nii.gz"))
        mask = sitk.GetImageFromArray(np.zeros(sitk.GetArrayFromImage(image).shape, np.uint8))
        mask.CopyInformation(image)
        sitk.WriteImage(mask, str(outputs / f"{case}.nii.gz"), True)
    verified = _bash(exported / "tests" / "test.sh", _env(exported, workspace, logs), tmp_path)
    assert verified.returncode == 0, verified.stderr[-3000:]
    reward = _reward(logs)
    assert reward["format_valid"] == 1
    assert reward["task"] < task.rating.b
    assert reward["reward"] == 0.0


def test_an_evaluator_that_cannot_run_leaves_no_reward(exported: Path, tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    shutil.copytree(exported / "tests", tests)
    (tests / "spec.json").write_text("{ not json")
    workspace, logs = tmp_path / "workspace", tmp_path / "logs"
    (workspace / "outputs").mkdir(parents=True)
    logs.mkdir()
    (logs / "reward.json").write_text('{"reward": 1.0}')  # stale: must not survive
    verified = _bash(tests / "test.sh", _env(exported, workspace, logs, tests), tmp_path)
    assert verified.returncode != 0
    assert not (logs / "reward.json").exists()
    assert "no reward written" in verified.stderr


def test_the_scripts_default_to_the_container_paths(exported: Path) -> None:
    uses = {
        exported / "tests" / "test.sh": ("AMB_TESTS", "AMB_WORKSPACE", "AMB_LOGS", "AMB_PYTHON"),
        exported / "solution" / "solve.sh": ("AMB_PUBLIC", "AMB_WORKSPACE", "AMB_PYTHON"),
    }
    for script, names in uses.items():
        text = script.read_text()
        for name in names:
            default = CONTAINER_PATHS[name]
            assert f'{name}="${{{name}:-{default}}}"' in text, (script.name, name)


def test_an_unknown_tier_is_refused(task: TaskSpec, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="unknown tier 'ultra'"):
        export_harbor_task(task, "ultra", tmp_path, data_cache=tmp_path / "cache")
    assert not any(tmp_path.iterdir())


def test_cli_refuses_an_unknown_task_naming_the_valid_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--suites", str(SUITES), "export-harbor", "no-such-task", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "unknown task 'no-such-task'" in err
    assert TASK_ID in err and "vqa-rad" in err
    assert not any(tmp_path.iterdir())


def test_cli_refuses_an_unknown_tier(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["export-harbor", TASK_ID, "--tier", "ultra", "--out", str(tmp_path)])
    assert exc.value.code == 2


def test_cli_refuses_an_existing_destination_unless_forced(
    tmp_path: Path, data_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    existing = tmp_path / f"{TASK_ID}-{TIER}"
    existing.mkdir()
    (existing / "mine.txt").write_text("keep me")
    argv = ["export-harbor", TASK_ID, "--suites", str(SUITES), "--out", str(tmp_path)]
    argv += ["--data-cache", str(data_cache)]
    assert main(argv) == 2
    assert "--force" in capsys.readouterr().err
    assert (existing / "mine.txt").read_text() == "keep me"

    assert main([*argv, "--force", "--base-image", "automedbench/agent:local"]) == 0
    assert not (existing / "mine.txt").exists()
    assert (existing / "task.toml").is_file()
    dockerfile = (existing / "environment" / "Dockerfile").read_text()
    assert "FROM automedbench/agent:local" in dockerfile
    assert not list(tmp_path.glob(".*partial"))
