"""A Harbor verifier that calls an LLM judge, its model served through the cell's gateway.

HealthAgentBench's report-correction verifier asks an OpenAI model (the OpenAI SDK, its
key in ``OPENAI_API_KEY``, its endpoint in ``OPENAI_BASE_URL`` or the older SDK's
``OPENAI_API_BASE``; the newer CheXprompt verifier's ``CHEXPROMPT_OPENAI_API_KEY`` and
``CHEXPROMPT_OPENAI_BASE_URL``, or an Azure deployment's variables) whether the agent's
report is right. Here no provider key enters a
container: the verifier gets a lease token of the cell's LLM gateway as its key and a
loopback URL of that gateway as its endpoint, and the gateway runs the model the user
configured (:func:`judge_model`) whatever model the verifier names.

**Which verifiers.** A task's verifier calls a model (:func:`wants_judge`) when its
task.toml's ``[verifier] env`` names one of :data:`JUDGE_VARIABLES` (Harbor's way of
giving a verifier a key: ``OPENAI_API_KEY = "${OPENAI_API_KEY}"``), or when its compose
file's ``main`` service has one in its environment (HealthAgentBench's way: the
repository's ``.env`` as ``env_file``). Those variables are never read from the host nor
given to the agent: the verifier's are the route's (:meth:`Judge.route`).

**The route.** For each verifier run a lease of its own is opened on the cell's gateway
(an agent system's, else one started for the verifier), with the session's cost cap
and the verifier's time-out as its budget, logging to the cell's ``gateway/`` folder.
The verifier reaches it through a relay sidecar (the project's base image, unprivileged,
read-only) in the task container's network namespace: the gateway's unix socket is bound
into the sidecar only, never into the agent's container, and the sidecar and the lease
end when the verifier ends. What the judge spent is the verifier's, never the agent's
(:class:`JudgeUsage`: in the ``verifier`` event and the record's ``judge["verifier"]``).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pytest_automedbench.harbor._task import (
    JUDGE_AZURE,
    JUDGE_KEYS,
    JUDGE_URLS,
    JUDGE_VARIABLES,
    HarborTask,
    HarborTaskError,
)
from pytest_automedbench.sandbox.base import GATEWAY_SOCKET_NAME, SandboxError

if TYPE_CHECKING:
    from pytest_automedbench.agents.model import ModelAgent
    from pytest_automedbench.config import RunConfig
    from pytest_automedbench.gateway import CellLease, Gateway
    from pytest_automedbench.harbor._environment import HarborContainer

#: The option that names the judge's model (in every message about it).
JUDGE_OPTION: Final = "--harbor-judge-model"
#: Where the relay sidecar finds the gateway's socket, and writes the port it serves.
RELAY_SOCKET_DIR: Final = "/run/amb-gateway"
RELAY_PORT_DIR: Final = "/run/amb-relay"
#: How long the relay sidecar may take to serve its port.
RELAY_START_S: Final = 20.0


def judge_variables_named(task: HarborTask, main_environment: Mapping[str, str]) -> set[str]:
    """The :data:`JUDGE_VARIABLES` the task names: in its ``[verifier] env`` or its compose
    file's ``main`` service's environment (``main_environment``)."""
    return (set(task.config.verifier.env) | set(main_environment)) & JUDGE_VARIABLES


def wants_judge(task: HarborTask, main_environment: Mapping[str, str]) -> bool:
    """Whether the task's verifier calls a model: it names one of :data:`JUDGE_VARIABLES`
    (:func:`judge_variables_named`)."""
    return bool(judge_variables_named(task, main_environment))


def main_environment_of(task: HarborTask) -> Mapping[str, str]:
    """The compose file's ``main`` service's environment as collection reads it ({} for
    a task without a compose file, or one whose problems are reported elsewhere)."""
    if not task.uses_compose:
        return {}
    from pytest_automedbench.harbor._environment import HarborImageError

    try:
        plan = task.compose_plan()
    except (HarborImageError, HarborTaskError, OSError):
        return {}
    main = plan.services.get("main")
    return main.environment if main is not None else {}


def judge_model(config: RunConfig) -> ModelAgent | None:
    """The model a verifier's judge runs on: :data:`JUDGE_OPTION` (a model agent's name,
    a named model or a litellm model string), else the session's ``--judge llm:MODEL``
    (with ``--judge-api-base``); None when the session names neither."""
    from pytest_automedbench.agents.registry import upstream_model

    ref, api_base = config.harbor_judge_model, None
    if ref is None and config.judge.startswith("llm:"):
        ref, api_base = config.judge.removeprefix("llm:"), config.judge_api_base
    if not ref:
        return None
    model = upstream_model(ref, config.agent_entries())
    return replace(model, api_base=api_base) if api_base and model.api_base is None else model


def unavailable_reason(task: HarborTask, config: RunConfig) -> str | None:
    """Why a task whose verifier calls a model cannot run in this session (it names no
    judge model), known at collection; None otherwise."""
    named = judge_variables_named(task, main_environment_of(task))
    if not named or judge_model(config) is not None:
        return None
    return (
        f"{task.toml}: its verifier calls an LLM judge ({', '.join(sorted(named))}); "
        f"name the judge's model with {JUDGE_OPTION} MODEL (or --judge llm:MODEL): it is "
        "served through the cell's gateway, and no provider key enters the container"
    )


@dataclass(frozen=True)
class JudgeUsage:
    """What a verifier's judge spent (one verifier run, or every run of an attempt)."""

    model: str
    requests: int = 0
    served: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    price_known: bool = True

    @classmethod
    def of(cls, lease: CellLease) -> JudgeUsage:
        usage = lease.usage()
        return cls(
            model=lease.model,
            requests=lease.requests,
            served=lease.served,
            tokens_in=usage.tokens_in,
            tokens_out=usage.tokens_out,
            cost_usd=round(usage.cost_usd, 9),
            price_known=usage.price_known,
        )

    def __add__(self, other: JudgeUsage) -> JudgeUsage:
        return JudgeUsage(
            model=self.model,
            requests=self.requests + other.requests,
            served=self.served + other.served,
            tokens_in=self.tokens_in + other.tokens_in,
            tokens_out=self.tokens_out + other.tokens_out,
            cost_usd=round(self.cost_usd + other.cost_usd, 9),
            price_known=self.price_known and other.price_known,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Judge:
    """The judge of one attempt's verifier runs: its model, the gateway that serves it
    (the cell's, else one of its own per run), and what every run spent."""

    def __init__(
        self,
        model: ModelAgent,
        cell_id: str,
        log_dir: Path,
        gateway: Gateway | None,
        *,
        request_timeout_s: float,
        max_cost_usd: float | None,
    ) -> None:
        self.model = model
        self.cell_id = cell_id
        self.log_dir = log_dir
        self.gateway = gateway
        self.request_timeout_s = request_timeout_s
        self.max_cost_usd = max_cost_usd
        #: One entry per verifier run, in order.
        self.runs: list[JudgeUsage] = []

    def total(self) -> JudgeUsage | None:
        """What every verifier run's judge spent (None when none ran)."""
        if not self.runs:
            return None
        total = self.runs[0]
        for usage in self.runs[1:]:
            total = total + usage
        return total

    @contextmanager
    def route(self, box: HarborContainer, timeout_s: float) -> Iterator[dict[str, str]]:
        """A lease and a relay for one verifier run in ``box``: the verifier's variables
        (the lease's token as the key, the relay's URL as the endpoint, an Azure
        deployment's empty). The relay is removed and the lease closed (its usage kept
        in :attr:`runs`) when it ends."""
        from pytest_automedbench.gateway import Budget

        with self._serving() as gateway:
            model = self.model
            lease = gateway.open_cell(
                f"{self.cell_id}-verifier-{len(self.runs) + 1}",
                model=model.model,
                api_base=model.api_base,
                api_key_env=model.api_key_env,
                prices=model.prices,
                budget=Budget(max_cost=self.max_cost_usd, deadline_s=timeout_s),
            )
            try:
                assert gateway.unix_socket is not None  # _serving's gateways serve one
                with relay_sidecar(box, gateway.unix_socket.parent) as url:
                    yield {
                        **dict.fromkeys(JUDGE_KEYS, lease.token),
                        **dict.fromkeys(JUDGE_URLS, f"{url}/v1"),
                        **dict.fromkeys(JUDGE_AZURE, ""),
                    }
            finally:
                gateway.close_cell(lease)
                self.runs.append(JudgeUsage.of(lease))

    @contextmanager
    def _serving(self) -> Iterator[Gateway]:
        """The cell's gateway when it has one (an agent system's), else one started for
        this verifier run on a unix socket of its own, logging to the same folder."""
        if self.gateway is not None and self.gateway.unix_socket is not None:
            yield self.gateway
            return
        from pytest_automedbench.gateway import Gateway, RetryPolicy

        folder = Path(tempfile.mkdtemp(prefix="amb-jg-"))  # short: a socket's name is bounded
        folder.chmod(0o755)
        gateway = Gateway(
            self.log_dir,
            retry=RetryPolicy(timeout_s=self.request_timeout_s),
            unix_socket=folder / GATEWAY_SOCKET_NAME,
        )
        try:
            with gateway:
                yield gateway
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def judge_for(
    task: HarborTask,
    config: RunConfig,
    cell_id: str,
    cell_dir: Path,
    gateway: Gateway | None,
    main_environment: Mapping[str, str],
) -> Judge | None:
    """The attempt's :class:`Judge` when its verifier calls a model (None otherwise);
    raises :class:`HarborTaskError` when the session names no judge model."""
    if not wants_judge(task, main_environment):
        return None
    model = judge_model(config)
    if model is None:
        raise HarborTaskError(str(unavailable_reason(task, config)))
    return Judge(
        model,
        cell_id,
        cell_dir / "gateway",
        gateway,
        request_timeout_s=config.request_timeout_s,
        max_cost_usd=config.max_cost_usd,
    )


@contextmanager
def relay_sidecar(box: HarborContainer, socket_dir: Path) -> Iterator[str]:
    """A relay from a loopback port of ``box``'s network namespace to the gateway socket
    in ``socket_dir`` (bound into the sidecar only), as ``http://127.0.0.1:<port>``:
    the project's base image (it has python3), unprivileged, read-only, removed after."""
    from pytest_automedbench.gateway import relay_argv
    from pytest_automedbench.harbor._environment import relay_image_for
    from pytest_automedbench.sandbox.docker import bind, owner_label
    from pytest_automedbench.sandbox.images import LABEL

    if box.container_id is None:
        raise SandboxError("the judge's relay needs the task's running container")
    client = box.engine.client()
    port_file = f"{RELAY_PORT_DIR}/port"
    relay = client.containers.run(
        relay_image_for(client, box.spec.docker_base),
        relay_argv("python3", f"{RELAY_SOCKET_DIR}/{GATEWAY_SOCKET_NAME}", port_file),
        detach=True,
        init=True,
        network_mode=f"container:{box.container_id}",
        mounts=[bind(socket_dir, RELAY_SOCKET_DIR, read_only=True)],
        tmpfs={RELAY_PORT_DIR: "size=64k,mode=1777"},
        labels={
            f"{LABEL}.role": "harbor-judge-relay",
            f"{LABEL}.run": box.spec.run_id,
            f"{LABEL}.owner": owner_label(),
        },
        user="65534:65534",
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        pids_limit=64,
        mem_limit="256m",
    )
    try:
        yield f"http://127.0.0.1:{_served_port(relay, port_file)}"
    finally:
        with contextlib.suppress(Exception):
            client.api.remove_container(relay.id, force=True)


def _served_port(relay: Any, port_file: str) -> int:
    """The port the relay wrote once it listens (it writes the file after binding)."""
    deadline = time.monotonic() + RELAY_START_S
    while time.monotonic() < deadline:
        relay.reload()
        if not relay.attrs["State"].get("Running"):
            logs = relay.logs()[-2000:].decode(errors="replace")
            raise SandboxError(f"the judge's gateway relay ended: {logs}")
        code, output = relay.exec_run(["cat", port_file])
        text = output.decode(errors="replace").strip() if code == 0 else ""
        if text.isdigit():
            return int(text)
        time.sleep(0.05)
    raise SandboxError(f"the judge's gateway relay did not listen within {RELAY_START_S:g} s")
