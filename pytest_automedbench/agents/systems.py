"""The built-in agent systems: how each is launched headless inside the sandbox.

``--agent claude-code:<model>``, ``--agent codex:<model>``, ``--agent copilot:<model>`` and
``--agent mini-swe-agent:<model>`` run the pinned CLI
(:mod:`pytest_automedbench.sandbox.agent_systems` installs them; both sandbox backends bind
them read-only on the PATH) with the model reached through the cell's LLM gateway. Each
launch command is bash run in the sandbox after the harness has exported:

* ``AMB_BRIEF``, ``AMB_WORKSPACE``, ``AMB_PUBLIC``, ``AMB_OUTPUTS`` (as for every command
  agent);
* ``AMB_GATEWAY_URL`` (``http://127.0.0.1:<port>``, the in-sandbox relay to the gateway),
  ``AMB_GATEWAY_TOKEN`` (the cell's bearer token: no provider key exists in the sandbox)
  and ``AMB_MODEL`` (the upstream model's name without its provider prefix; the gateway
  runs the cell's model whatever the client names);
* the same, as the variables OpenAI and Anthropic SDKs read: ``OPENAI_BASE_URL``,
  ``OPENAI_API_BASE``, ``OPENAI_API_KEY``, ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_AUTH_TOKEN``;
* every system's switches that turn off update checks, telemetry and error reports.

A user-defined system (an agents-file entry with ``command`` and ``model``) gets the same
environment, so grading a new one is its command line and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_automedbench.agents.base import LimitSettings
from pytest_automedbench.agents.registry import SYSTEM_NAMES, ModelAgent, SystemAgent
from pytest_automedbench.agents.tools import DEFAULT_EXEC_TIMEOUT_S

__all__ = ["SYSTEMS", "BuiltinSystem", "cli_model_name", "system_version"]

#: Where a built-in system's native transcript goes (relative to the workspace).
TRANSCRIPT_DIR = ".amb"


@dataclass(frozen=True)
class BuiltinSystem:
    """One built-in agent system: its launch command and where it writes its transcript."""

    name: str
    description: str
    command: str
    transcript: str

    def agent(
        self, name: str, upstream: ModelAgent, description: str, limits: LimitSettings
    ) -> SystemAgent:
        """This system on ``upstream`` as an agent named ``name``."""
        return SystemAgent(
            name,
            description or f"{self.description} on {upstream.model}",
            upstream=upstream,
            system=self.name,
            command=self.command,
            transcript=self.transcript,
            limits=limits,
        )


def _claude_code() -> BuiltinSystem:
    transcript = f"{TRANSCRIPT_DIR}/claude-code.jsonl"
    # -p: one headless task; stream-json (needs --verbose) is its native transcript, one
    # event per line; permissions are skipped because the sandbox is the boundary.
    command = f"""mkdir -p "$AMB_WORKSPACE/{TRANSCRIPT_DIR}"
claude -p "$(cat "$AMB_BRIEF")" --model "$AMB_MODEL" --output-format stream-json \\
    --verbose --dangerously-skip-permissions > "$AMB_WORKSPACE/{transcript}\""""
    return BuiltinSystem("claude-code", "Claude Code", command, transcript)


def _codex() -> BuiltinSystem:
    from pytest_automedbench.sandbox.agent_systems import AGENT_SYSTEMS

    transcript = f"{TRANSCRIPT_DIR}/codex.jsonl"
    quiet = " ".join(f"'{arg}'" for arg in AGENT_SYSTEMS["codex"].args)
    # A provider of our own (the gateway, Responses API, the token from the environment);
    # Codex's own sandbox is bypassed because the harness's sandbox is the boundary.
    provider = (
        'model_providers.amb={name="AutoMedBench gateway",'
        'base_url="\'"$AMB_GATEWAY_URL"\'/v1",env_key="AMB_GATEWAY_TOKEN",wire_api="responses"}'
    )
    command = f"""export CODEX_HOME="$AMB_WORKSPACE/.codex"
mkdir -p "$CODEX_HOME" "$AMB_WORKSPACE/{TRANSCRIPT_DIR}"
codex exec --json --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox \\
    -C "$AMB_WORKSPACE" -m "$AMB_MODEL" -c model_provider=amb -c '{provider}' {quiet} \\
    "$(cat "$AMB_BRIEF")" > "$AMB_WORKSPACE/{transcript}\""""
    return BuiltinSystem("codex", "Codex CLI", command, transcript)


def _copilot() -> BuiltinSystem:
    from pytest_automedbench.sandbox.agent_systems import AGENT_SYSTEMS

    transcript = f"{TRANSCRIPT_DIR}/copilot.jsonl"
    quiet = " ".join(AGENT_SYSTEMS["copilot"].args)
    # BYOK mode: the gateway as an OpenAI chat-completions provider (no GitHub sign-in);
    # its JSON-lines output is the native transcript. --allow-all: no permission prompts,
    # the sandbox is the boundary.
    command = f"""export COPILOT_PROVIDER_TYPE=openai COPILOT_PROVIDER_WIRE_API=completions
export COPILOT_PROVIDER_BASE_URL="$AMB_GATEWAY_URL/v1" COPILOT_MODEL="$AMB_MODEL"
export COPILOT_PROVIDER_API_KEY="$AMB_GATEWAY_TOKEN"
mkdir -p "$AMB_WORKSPACE/{TRANSCRIPT_DIR}"
copilot -p "$(cat "$AMB_BRIEF")" --allow-all {quiet} --output-format json \
    -C "$AMB_WORKSPACE" > "$AMB_WORKSPACE/{transcript}"
"""
    return BuiltinSystem("copilot", "GitHub Copilot CLI", command, transcript)


def _mini_swe_agent() -> BuiltinSystem:
    from pytest_automedbench.sandbox.agent_systems import AGENT_TOOLS

    transcript = f"{TRANSCRIPT_DIR}/mini-swe-agent.traj.json"
    # The tool-calling configuration (a `bash` tool; results carry the return code), by
    # absolute path: mini looks a bare name up in the working directory first. Each of
    # its commands may run as long as the harness's own execute calls (default 30 s).
    config = f"{AGENT_TOOLS}/python/minisweagent/config/mini.yaml"
    # No retries of its own (4-60 s apart, 10 times): the gateway already retries what a
    # retry can fix, and a budget refusal is final.
    command = f"""export MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT=1
mkdir -p "$AMB_WORKSPACE/{TRANSCRIPT_DIR}"
cd "$AMB_WORKSPACE" && mini -y --exit-immediately -m "openai/$AMB_MODEL" \
    -c {config} -c environment.timeout={int(DEFAULT_EXEC_TIMEOUT_S)} \
    -t "$(cat "$AMB_BRIEF")" -o "$AMB_WORKSPACE/{transcript}" </dev/null"""
    return BuiltinSystem("mini-swe-agent", "mini-swe-agent", command, transcript)


def _builtin() -> dict[str, BuiltinSystem]:
    systems = [_claude_code(), _codex(), _copilot(), _mini_swe_agent()]
    return {system.name: system for system in systems}


#: System name -> how it is launched.
SYSTEMS: dict[str, BuiltinSystem] = _builtin()
assert tuple(SYSTEMS) == SYSTEM_NAMES, "the registry's prefixes name every built-in system"


def system_version(system: str | None) -> str | None:
    """The pinned version of a built-in system (None for a user-defined command)."""
    from pytest_automedbench.sandbox.agent_systems import AGENT_SYSTEMS

    pinned = AGENT_SYSTEMS.get(system) if system is not None else None
    return pinned.version if pinned is not None else None


def cli_model_name(model: str) -> str:
    """The model name a CLI is given: the litellm string without its provider prefix
    (``anthropic/claude-opus-4-6`` -> ``claude-opus-4-6``)."""
    return model.split("/", 1)[1] if "/" in model else model
