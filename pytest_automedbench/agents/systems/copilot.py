"""GitHub Copilot CLI from npm, in BYOK mode: the gateway as its OpenAI chat-completions
provider (no GitHub sign-in); its JSON-lines output is the native transcript."""

from __future__ import annotations

from pytest_automedbench.agents.systems.builtin import TRANSCRIPT_DIR, BuiltinSystem
from pytest_automedbench.sandbox.agent_systems import AgentSystem

PIN = AgentSystem(
    name="copilot",
    package="@github/copilot",
    version="1.0.102",
    command="copilot",
    version_text="GitHub Copilot CLI 1.0.102",
    env={
        # No GitHub sign-in, telemetry, web tools, GitHub MCP server or auto-update
        # (needs a model provider of its own: the gateway, in BYOK mode).
        "COPILOT_OFFLINE": "true",
        "COPILOT_AUTO_UPDATE": "false",
    },
    args=("--disable-client-telemetry", "--no-auto-update"),
)

TRANSCRIPT = f"{TRANSCRIPT_DIR}/copilot.jsonl"

# --allow-all: no permission prompts, the sandbox is the boundary.
COMMAND = f"""export COPILOT_PROVIDER_TYPE=openai COPILOT_PROVIDER_WIRE_API=completions
export COPILOT_PROVIDER_BASE_URL="$AMB_GATEWAY_URL/v1" COPILOT_MODEL="$AMB_MODEL"
export COPILOT_PROVIDER_API_KEY="$AMB_GATEWAY_TOKEN"
mkdir -p "$AMB_WORKSPACE/{TRANSCRIPT_DIR}"
copilot -p "$(cat "$AMB_BRIEF")" --allow-all {" ".join(PIN.args)} --output-format json \
    -C "$AMB_WORKSPACE" > "$AMB_WORKSPACE/{TRANSCRIPT}"
"""

SYSTEM = BuiltinSystem(PIN, "GitHub Copilot CLI", COMMAND, TRANSCRIPT)
