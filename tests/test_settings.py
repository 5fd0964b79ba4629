"""One declaration per setting and per word, and a plugin that costs nothing until cells
are collected."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_automedbench import settings, terms
from pytest_automedbench.config import ConfigError, RunConfig, build_config

from .conftest import REPO

#: RunConfig fields that are tables of their own, not settings of the table.
SUB_TABLES = {"slurm", "agent_definitions"}


def test_every_run_config_field_is_one_row_of_the_settings_table() -> None:
    fields = set(RunConfig.model_fields) - SUB_TABLES
    assert fields == set(settings.BY_FIELD)
    assert len(settings.SETTINGS) == len(settings.BY_FIELD) == len(settings.BY_PYPROJECT_KEY)
    for setting in settings.SETTINGS:
        model_field = RunConfig.model_fields[setting.field]
        assert model_field.description == setting.help, setting.field
        if setting.field != "amb_out":  # resolved against the rootdir when not given
            assert model_field.default == setting.default, setting.field


def test_the_configuration_hash_covers_exactly_the_scoring_settings(tmp_path: Path) -> None:
    base = build_config({}, {}, None, tmp_path)
    changed = {
        "sandbox": "process",
        "sandbox_network": "off",
        "sandbox_allow_hosts": ["mirror.lab"],
        "sandbox_allow_networks": ["10.0.0.0/8"],
        "sandbox_hosts": ["mirror.lab=10.1.2.3"],
        "sandbox_disk_mb": 1024,
        "sandbox_inodes": 5000,
        "judge": "llm:x/y",
        "judge_votes": 3,
        "data_root": str(tmp_path),
        "data_size": "realistic",
        "max_turns": 50,
        "time_factor": 2.0,
        "max_total_tokens": 1000,
        "max_cost_usd": 5.0,
        "request_timeout_s": 60.0,
        "harbor_base": ["ubuntu:24.04=local/ubuntu:24.04"],
        "harbor_env": ["AMB_DATASET_ROOT"],  # the names, never the values
        "harbor_judge_model": "gpt-4o",  # a Harbor verifier's judge decides its reward
        "holdout": "perturbed",
        "cases": "2",
    }
    assert set(changed) | {"holdout_seed", "cases_seed"} == set(settings.SCORING_FIELDS)
    for field, value in changed.items():
        other = build_config({field: value}, {}, None, tmp_path)
        assert other.scoring_hash() != base.scoring_hash(), field
    # The holdout's seed changes the perturbed split, and nothing of the original one.
    perturbed = build_config({"holdout": "perturbed"}, {}, None, tmp_path)
    reseeded = build_config({"holdout": "perturbed", "holdout_seed": 7}, {}, None, tmp_path)
    assert reseeded.scoring_hash() != perturbed.scoring_hash()
    original_seeded = build_config({"holdout_seed": 7}, {}, None, tmp_path)
    assert original_seeded.scoring_hash() == base.scoring_hash()
    same = build_config({"runs": 3, "progress_s": 0.0, "tier": ["lite", "pro"]}, {}, None, tmp_path)
    assert same.scoring_hash() == base.scoring_hash()
    # A limit given at its default is the default: the records stay comparable.
    defaults = {f: settings.BY_FIELD[f].default for f in ("max_turns", "time_factor")}
    assert build_config(defaults, {}, None, tmp_path).scoring_hash() == base.scoring_hash()


def test_the_hash_of_earlier_records_is_kept() -> None:
    """The hash payload is the one the ledgers of earlier releases were written with,
    where the settings mean what they meant: with the network off (unchanged since), the
    agent limits at their defaults and several tiers hash as they did; the old name of
    the bubblewrap backend hashes as the new one. (Measured with the release before the
    egress proxy.) With a route out, "on" meant the host's network then and means the
    egress proxy now, so those records are kept apart."""
    assert RunConfig(sandbox_network="off").scoring_hash() == "0225c57aa390"
    assert RunConfig(sandbox_network="off", sandbox="local").scoring_hash() == "aa15142b7197"
    assert RunConfig(sandbox_network="off", sandbox="bubblewrap").scoring_hash() == "aa15142b7197"
    assert RunConfig(sandbox="local").sandbox == "bubblewrap"
    off = {"sandbox_network": "off"}
    assert RunConfig(tier="lite,pro", **off).scoring_hash() == "0225c57aa390"
    assert (
        RunConfig(tier=["lite"], max_turns=200, time_factor=1, **off).scoring_hash()
        == "0225c57aa390"
    )
    # Before the egress proxy, the default ("on", the host's network) hashed to this.
    earlier_on = "0ea39169c148"
    assert RunConfig(sandbox_network="on").scoring_hash() != earlier_on
    assert RunConfig().scoring_hash() != earlier_on


@pytest.mark.parametrize(
    ("cli", "pyproject", "origin"),
    [
        ({"fail_under": "speed=3"}, {}, "--amb-fail-under:"),
        ({"max_regression": -1.0}, {}, "--amb-max-regression:"),
        ({}, {"max_regression": -1.0}, "[tool.automedbench] max_regression:"),
        ({"agents": ["reference"], "tier": "expert"}, {}, "--tier:"),
        ({}, {"agent": "reference", "sandbox": "vm"}, "[tool.automedbench] sandbox:"),
        ({"progress_s": -1.0}, {}, "--amb-progress:"),
    ],
)
def test_errors_name_a_flag_or_key_that_exists(
    tmp_path: Path, cli: dict[str, object], pyproject: dict[str, object], origin: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config(cli, pyproject, tmp_path / "pyproject.toml", tmp_path)
    message = str(caught.value)
    assert origin in message, message
    flag = message.split(":")[0]
    if flag.startswith("--"):
        assert flag in {s.flag for s in settings.SETTINGS}


def test_pytest_help_shows_every_flag_of_the_table() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for setting in settings.SETTINGS:
        assert setting.flag in out, setting.flag


def test_words_are_defined_once() -> None:
    from pytest_automedbench.scoring.models import StageScores
    from pytest_automedbench.tasks import TIERS as TASK_TIERS

    assert terms.TIERS == TASK_TIERS == ("lite", "standard", "pro")
    assert tuple(StageScores(s1=0, s2=0, s3=0, s4=0, s5=0).by_stage()) == terms.STAGES
    assert settings.BY_FIELD["tier"].choices == (*terms.TIERS, terms.ALL_TIERS)
    assert RunConfig(tier="all").tiers == terms.TIERS


def test_importing_the_plugin_imports_nothing_heavy() -> None:
    """Every pytest session of an environment with the plugin installed imports it: it
    must not pull in numpy, pydantic, the evaluators or the fixtures."""
    code = textwrap.dedent(
        """
        import sys
        import pytest_automedbench.plugin
        heavy = ["numpy", "pydantic", "scipy", "SimpleITK", "nibabel", "pydicom", "PIL",
                 "yaml", "pytest_automedbench.config", "pytest_automedbench.fixtures"]
        print(",".join(m for m in heavy if m in sys.modules))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == ""


def test_an_unrelated_session_registers_no_machinery(tmp_path: Path) -> None:
    """A one-line test in a project without AutoMedBench settings: the plugin's worker
    and controller are not registered, nothing heavy is imported, no daemon is asked."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "test_one.py").write_text(
        textwrap.dedent(
            """
            import sys

            def test_one(request):
                pm = request.config.pluginmanager
                assert pm.get_plugin("automedbench") is not None
                assert pm.get_plugin("automedbench-worker") is None
                assert pm.get_plugin("automedbench-controller") is None
                assert "numpy" not in sys.modules and "docker" not in sys.modules
            """
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_one.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "DOCKER_HOST": "unix:///nonexistent.sock"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "automedbench:" not in result.stdout
