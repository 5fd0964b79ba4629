"""Which host variables a Harbor task may read by name (``--harbor-env``), and the option
that names the host folders its compose file may reach (``--harbor-mount``).

A leaf (the redaction rules only): the settings check the names as they are given,
before any task is loaded.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from pytest_automedbench.redact import SECRET_NAME

#: The option that lets a host variable reach Harbor tasks (named in every error about one).
ENV_OPTION = "--harbor-env"
#: The option that names a host folder a task's compose file may bind or read env_file from.
MOUNT_OPTION = "--harbor-mount"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def secret_env_problem(name: str, agent_keys: Collection[str] = ()) -> str | None:
    """Why ``name`` may not be passed to a task with :data:`ENV_OPTION`, or None: not a
    variable name, a credential-like name (:data:`~pytest_automedbench.redact.SECRET_NAME`),
    or the variable holding a key of one of the session's agents."""
    if not _ENV_NAME.fullmatch(name):
        return f"{ENV_OPTION} {name!r}: not an environment variable name"
    if SECRET_NAME.search(name) or name in agent_keys:
        return (
            f"{ENV_OPTION} {name}: a credential (a provider key, token, secret or password) "
            "never reaches a Harbor task, even when named: an agent gets model access through "
            "the harness's gateway, which holds the keys on the host"
        )
    return None


__all__ = ["ENV_OPTION", "MOUNT_OPTION", "secret_env_problem"]
