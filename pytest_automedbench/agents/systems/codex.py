"""Codex CLI: OpenAI's CLI from npm (a Node launcher that execs its native binary), run
with ``codex exec --json`` on the gateway's Responses endpoint; its JSON events are the
native transcript."""

from __future__ import annotations

from pytest_automedbench.agents.systems.builtin import TRANSCRIPT_DIR, BuiltinSystem
from pytest_automedbench.sandbox.agent_systems import AgentSystem

PIN = AgentSystem(
    name="codex",
    package="@openai/codex",
    version="0.171.0",
    command="codex",
    version_text="codex-cli 0.171.0",
    # Codex reads no environment switch for these: config overrides (`-c key=value`,
    # the same keys as ~/.codex/config.toml); its OTEL exporters are "none" by default
    # and set so explicitly. CODEX_HOME (its config and state) is set by the launch.
    args=tuple(
        arg
        for override in (
            "check_for_update_on_startup=false",
            "analytics.enabled=false",
            "feedback.enabled=false",
            'otel.exporter="none"',
            'otel.trace_exporter="none"',
            'otel.metrics_exporter="none"',
        )
        for arg in ("-c", override)
    ),
)

TRANSCRIPT = f"{TRANSCRIPT_DIR}/codex.jsonl"

_QUIET = " ".join(f"'{arg}'" for arg in PIN.args)
# A provider of our own (the gateway, Responses API, the token from the environment);
# Codex's own sandbox is bypassed because the harness's sandbox is the boundary.
_PROVIDER = (
    'model_providers.amb={name="AutoMedBench gateway",'
    'base_url="\'"$AMB_GATEWAY_URL"\'/v1",env_key="AMB_GATEWAY_TOKEN",wire_api="responses"}'
)
COMMAND = f"""export CODEX_HOME="$AMB_WORKSPACE/.codex"
mkdir -p "$CODEX_HOME" "$AMB_WORKSPACE/{TRANSCRIPT_DIR}"
codex exec --json --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox \\
    -C "$AMB_WORKSPACE" -m "$AMB_MODEL" -c model_provider=amb -c '{_PROVIDER}' {_QUIET} \\
    "$(cat "$AMB_BRIEF")" > "$AMB_WORKSPACE/{TRANSCRIPT}\""""

SYSTEM = BuiltinSystem(PIN, "Codex CLI", COMMAND, TRANSCRIPT)
