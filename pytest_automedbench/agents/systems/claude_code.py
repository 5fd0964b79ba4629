"""Claude Code: Anthropic's CLI from npm, run headless (``-p``) on the gateway's
Anthropic Messages endpoint; its stream-json output is the native transcript."""

from __future__ import annotations

from pytest_automedbench.agents.systems.builtin import TRANSCRIPT_DIR, BuiltinSystem
from pytest_automedbench.sandbox.agent_systems import AgentSystem

PIN = AgentSystem(
    name="claude-code",
    package="@anthropic-ai/claude-code",
    version="2.1.197",
    command="claude",
    version_text="2.1.197 (Claude Code)",
    env={
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    },
)

TRANSCRIPT = f"{TRANSCRIPT_DIR}/claude-code.jsonl"

# -p: one headless task; stream-json (needs --verbose) is its native transcript, one
# event per line; permissions are skipped because the sandbox is the boundary.
COMMAND = f"""mkdir -p "$AMB_WORKSPACE/{TRANSCRIPT_DIR}"
claude -p "$(cat "$AMB_BRIEF")" --model "$AMB_MODEL" --output-format stream-json \\
    --verbose --dangerously-skip-permissions > "$AMB_WORKSPACE/{TRANSCRIPT}\""""

SYSTEM = BuiltinSystem(PIN, "Claude Code", COMMAND, TRANSCRIPT)
