"""mini-swe-agent from PyPI (into the tools folder's own ``python/``, run by a launcher
that sees only it), on the gateway's chat-completions endpoint with its tool-calling
configuration; its trajectory file is the native transcript."""

from __future__ import annotations

from pytest_automedbench.agents.systems.builtin import TRANSCRIPT_DIR, BuiltinSystem
from pytest_automedbench.agents.tools import DEFAULT_EXEC_TIMEOUT_S
from pytest_automedbench.sandbox.agent_systems import AGENT_TOOLS, AgentSystem

PIN = AgentSystem(
    name="mini-swe-agent",
    package="mini-swe-agent",
    version="2.4.6",
    command="mini",
    # mini has no --version: the launcher answers it by importing mini and litellm.
    version_text="mini-swe-agent 2.4.6",
    env={
        # Skip the first-run setup prompt (model and key questions on the terminal).
        "MSWEA_CONFIGURED": "true",
        # No start-up banner (version, migration guide, global config path).
        "MSWEA_SILENT_STARTUP": "1",
        # Cost from litellm's map: the gateway's model names are not in it (0 is fine).
        "MSWEA_COST_TRACKING": "ignore_errors",
        # Its global config (a .env it loads), prompt history and default trajectory;
        # the sandbox's private /tmp rather than $HOME/.config in the workspace.
        "MSWEA_GLOBAL_CONFIG_DIR": "/tmp/mini-swe-agent",
        # litellm fetches its model cost map from GitHub at import unless told.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    },
    installer="pip",
    module="minisweagent.run.mini",
    # Only the SWE-bench batch runners import it (pyarrow, pandas, numpy: ~350 MB).
    leave_out=("datasets",),
)

TRANSCRIPT = f"{TRANSCRIPT_DIR}/mini-swe-agent.traj.json"

# The tool-calling configuration (a `bash` tool; results carry the return code), by
# absolute path: mini looks a bare name up in the working directory first. Each of
# its commands may run as long as the harness's own execute calls (default 30 s).
_CONFIG = f"{AGENT_TOOLS}/python/minisweagent/config/mini.yaml"
# No retries of its own (4-60 s apart, 10 times): the gateway already retries what a
# retry can fix, and a budget refusal is final.
COMMAND = f"""export MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT=1
mkdir -p "$AMB_WORKSPACE/{TRANSCRIPT_DIR}"
cd "$AMB_WORKSPACE" && mini -y --exit-immediately -m "openai/$AMB_MODEL" \
    -c {_CONFIG} -c environment.timeout={int(DEFAULT_EXEC_TIMEOUT_S)} \
    -t "$(cat "$AMB_BRIEF")" -o "$AMB_WORKSPACE/{TRANSCRIPT}" </dev/null"""

SYSTEM = BuiltinSystem(PIN, "mini-swe-agent", COMMAND, TRANSCRIPT)
