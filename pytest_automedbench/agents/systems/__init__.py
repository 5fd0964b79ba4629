"""The built-in agent systems: one module each, found by looking in this package.

``--agent claude-code:<model>``, ``--agent codex:<model>``, ``--agent copilot:<model>`` and
``--agent mini-swe-agent:<model>`` run the pinned CLI with the model reached through the
cell's LLM gateway. Each system is one module here (``claude_code.py``, ``codex.py``,
``copilot.py``, ``mini_swe_agent.py``) whose ``SYSTEM`` (a
:class:`~pytest_automedbench.agents.systems.builtin.BuiltinSystem`) holds its pin and
installation, its launch command and its transcript; :data:`SYSTEMS` is read from the
modules, so adding a system is adding its module. The shared installer
(:mod:`pytest_automedbench.sandbox.agent_systems`) installs their pins once on the host;
both sandbox backends bind them read-only on the PATH.

Each launch command is bash run in the sandbox after the harness has exported:

* ``AMB_BRIEF``, ``AMB_WORKSPACE``, ``AMB_PUBLIC``, ``AMB_OUTPUTS`` (as for every command
  agent);
* ``AMB_GATEWAY_URL`` (``http://127.0.0.1:<port>``, the in-sandbox relay to the gateway),
  ``AMB_GATEWAY_TOKEN`` (the cell's bearer token: no provider key exists in the sandbox)
  and ``AMB_MODEL`` (the upstream model's name without its provider prefix; the gateway
  runs the cell's model whatever the client names);
* the same, as the variables OpenAI and Anthropic SDKs read: ``OPENAI_BASE_URL``,
  ``OPENAI_API_BASE``, ``OPENAI_API_KEY``, ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_AUTH_TOKEN``;
* every system's switches that turn off update checks, telemetry and error reports
  (:func:`quiet_environment`).

A user-defined system (an agents-file entry with ``command`` and ``model``) gets the same
environment, so grading a new one is its command line and nothing else.

``python -c 'from pytest_automedbench.agents.systems import main; main()'`` (what
``scripts/system-setup --project test`` runs) installs every system's pin.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

from pytest_automedbench.agents.systems.builtin import BuiltinSystem
from pytest_automedbench.sandbox import agent_systems as installer

__all__ = [
    "PINS",
    "SYSTEMS",
    "BuiltinSystem",
    "cli_model_name",
    "discover",
    "ensure_agent_tools",
    "main",
    "quiet_environment",
    "system_version",
]

#: The modules of this package that are not systems.
_NOT_SYSTEMS = frozenset({"builtin"})


def discover(package: ModuleType) -> dict[str, BuiltinSystem]:
    """Every system module's ``SYSTEM`` in ``package`` (this one: :data:`SYSTEMS`), by
    name, in the order of the modules' names."""
    found: dict[str, BuiltinSystem] = {}
    for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name):
        if module.name in _NOT_SYSTEMS or module.name.startswith("_"):
            continue
        name = f"{package.__name__}.{module.name}"
        system = getattr(importlib.import_module(name), "SYSTEM", None)
        if not isinstance(system, BuiltinSystem):
            raise TypeError(f"{name} defines no SYSTEM (a BuiltinSystem)")
        if system.name in found:
            raise ValueError(f"two agent systems are named {system.name!r}")
        found[system.name] = system
    return found


#: System name -> the system.
SYSTEMS: dict[str, BuiltinSystem] = discover(sys.modules[__name__])
#: Every system's pin, as the installer takes them.
PINS: tuple[installer.AgentSystem, ...] = tuple(system.pin for system in SYSTEMS.values())


def system_version(system: str | None) -> str | None:
    """The pinned version of a built-in system (None for a user-defined command)."""
    found = SYSTEMS.get(system) if system is not None else None
    return found.version if found is not None else None


def cli_model_name(model: str) -> str:
    """The model name a CLI is given: the litellm string without its provider prefix
    (``anthropic/claude-opus-4-6`` -> ``claude-opus-4-6``)."""
    return model.split("/", 1)[1] if "/" in model else model


def quiet_environment() -> dict[str, str]:
    """Every system's update/telemetry switches, as one environment."""
    return installer.quiet_environment(PINS)


def ensure_agent_tools(tools_dir: Path | None = None, *, log: bool = True) -> Path:
    """The tools folder with every system's pin installed
    (:func:`pytest_automedbench.sandbox.agent_systems.ensure_agent_tools`)."""
    return installer.ensure_agent_tools(PINS, tools_dir, log=log)


def main(argv: list[str] | None = None) -> int:
    """Install every system's pin (``scripts/system-setup --project test``)."""
    return installer.install_main(PINS, argv)
