"""The Docker backend's images: a base, the agent image and the evaluator image.

* **base**: by default made here with ``debootstrap`` from a Debian mirror and imported
  (air-gapped sites: no registry needed, only the mirror); or any registry image that
  provides ``python3`` (``--docker-base python:3.11-slim-bookworm``).
* **agent** (``images/agent.Dockerfile``): the base plus compilers and the scientific
  Python stack in ``/venv``, the same packages at the same versions as the harness's own
  environment, installed from a wheelhouse that the host's pip downloads (so the host's
  index, mirror and proxy settings apply and the build itself needs no network).
* **evaluator** (``images/evaluator.Dockerfile``): the agent image plus the report
  metrics and this package's evaluators.

Every tag is a content hash of what went into the image, so an image is built once and
reused until its recipe changes; concurrent processes (xdist workers, parallel CI jobs)
serialise on a file lock and the first one builds.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from filelock import FileLock

from pytest_automedbench.atomic import write_cache
from pytest_automedbench.sandbox.base import SandboxError

DEBOOTSTRAP = "debootstrap"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
#: What the agent finds besides Python: compilers for pip builds and for agents that write
#: C, the usual command-line tools, other languages (the host offers them to the local
#: backend too), and Java (METEOR in the evaluator).
PACKAGES = (
    "python3",
    "python3-venv",
    "python3-pip",
    "python3-dev",
    "ca-certificates",
    "curl",
    "git",
    "gcc",
    "g++",
    "libc6-dev",
    "make",
    "perl",
    "procps",
    "default-jre-headless",
    "nodejs",
    "tcl",
    "sqlite3",
    "strace",
)
#: Besides the core dependencies: what honest research work expects (torch, MONAI) and
#: what the evaluator computes with (HD95/NSD, the report metrics), at the host's versions.
EXTRA_REQUIREMENTS = ("torch", "monai", "pycocotools", "pycocoevalcap")
#: The package's extras whose libraries the agent's environment carries beside the core
#: (HealthAgentBench's tasks hand the agent parquet tables and slides).
AGENT_EXTRAS = ("healthagentbench",)
#: Bump to rebuild every image (a change in how they are made that the hashes miss).
RECIPE_VERSION = "1"
LABEL = "org.automedbench"
REPOSITORY = "automedbench"
IMAGES_DIR = Path(__file__).with_name("images")
LOCK_FILE = Path(tempfile.gettempdir()) / "automedbench-docker-images.lock"
BUILD_TIMEOUT_S = 1800


@dataclass(frozen=True)
class ImageSet:
    base: str
    agent: str
    evaluator: str


#: (engine, base) -> the images found or built there, once per process.
_ENSURED: dict[tuple[str, str], ImageSet] = {}


def digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def ensure_images(
    client: Any,
    base: str = DEBOOTSTRAP,
    log: Callable[[str], None] | None = None,
    *,
    engine: str = "docker",
) -> ImageSet:
    """The image tags for ``base`` in ``client``'s image store (``engine`` names that
    store: each has its own), building whatever is missing (once per process)."""
    if (engine, base) in _ENSURED:
        return _ENSURED[engine, base]
    say = log or (lambda message: print(f"automedbench: {message}", file=sys.stderr))
    with FileLock(str(LOCK_FILE), timeout=BUILD_TIMEOUT_S):
        base_tag = ensure_base(client, base, say)
        py_tag, machine = python_of(client, base_tag)
        agent_reqs = agent_requirements(py_tag)
        agent_tag = _ensure_built(
            client,
            "agent",
            from_arg=("BASE", base_tag),
            recipe=[(IMAGES_DIR / "agent.Dockerfile").read_text(), " ".join(PACKAGES)],
            requirements=agent_reqs,
            wheel_target=(py_tag, machine),
            extra_context={},
            build_args={"PACKAGES": " ".join(PACKAGES)},
            say=say,
        )
        sources = evaluator_sources()
        evaluator_tag = _ensure_built(
            client,
            "evaluator",
            from_arg=("AGENT", agent_tag),
            recipe=[
                (IMAGES_DIR / "evaluator.Dockerfile").read_text(),
                *(f"{rel}\n{text}" for rel, text in sorted(sources.items())),
            ],
            requirements=[],
            wheel_target=(py_tag, machine),
            extra_context={f"automedbench/{rel}": text for rel, text in sources.items()},
            build_args={},
            say=say,
        )
    images = ImageSet(base=base_tag, agent=agent_tag, evaluator=evaluator_tag)
    _ENSURED[engine, base] = images
    return images


# ------------------------------------------------------------------------------ base


def base_tag_for(mirror: str = DEBIAN_MIRROR) -> str:
    return f"{REPOSITORY}/base:{DEBIAN_SUITE}-" + digest(
        RECIPE_VERSION, DEBIAN_SUITE, mirror, *PACKAGES
    )


def debootstrap_problem() -> str | None:
    if shutil.which("debootstrap") is None:
        return "debootstrap is not installed (Debian: apt-get install debootstrap)"
    if os.geteuid() != 0:
        return "debootstrap must run as root"
    return None


def _image_exists(client: Any, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def ensure_base(client: Any, base: str, say: Callable[[str], None]) -> str:
    if base != DEBOOTSTRAP:
        if not _image_exists(client, base):
            say(f"pulling the base image {base}")
            try:
                client.images.pull(base)
            except Exception as exc:
                raise SandboxError(
                    f"cannot pull the Docker base image {base!r}: {exc}; on a site without "
                    f"a registry use --docker-base {DEBOOTSTRAP}"
                ) from exc
        return base
    tag = base_tag_for()
    if _image_exists(client, tag):
        return tag
    if (problem := debootstrap_problem()) is not None:
        raise SandboxError(f"cannot build the Docker base image {tag}: {problem}")
    say(f"building the base image {tag} with debootstrap from {DEBIAN_MIRROR} (about a minute)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="amb-debootstrap-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        command = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            DEBIAN_SUITE,
            str(rootfs),
            DEBIAN_MIRROR,
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr)[-3000:]
            raise SandboxError(f"debootstrap failed (exit {done.returncode}):\n{tail}")
        # No package caches or logs in the image; apt lists stay (a later apt install works).
        shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        archive = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(archive), "."], check=True)
        repository, _, version = tag.partition(":")
        client.api.import_image_from_file(
            str(archive),
            repository=repository,
            tag=version,
            changes=[
                f"LABEL {LABEL}.role=base",
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "ENV LANG=C.UTF-8",
                'CMD ["/bin/bash"]',
            ],
        )
    say(f"built {tag} in {time.monotonic() - started:.0f} s")
    return tag


def python_of(client: Any, image: str, cache: Path | None = None) -> tuple[str, str]:
    """The image's CPython version tag (``311``) and machine (``x86_64``): asked of a
    container once per image, then read from ``cache`` (:func:`python_facts_cache` by
    default), keyed by the image's content id, so a rebuilt or re-pulled image under the
    same tag is asked again. A cache that cannot be read or written is ignored."""
    folder = python_facts_cache() if cache is None else cache
    try:
        image_id = str(client.images.get(image).id)
    except Exception as exc:
        raise SandboxError(f"the base image {image} cannot be inspected: {exc}") from exc
    entry = folder / f"{image_id.replace(':', '-')}.json"
    facts = _read_python_facts(entry)
    if facts is None:
        facts = _probe_python(client, image)
        _write_python_facts(entry, facts)
    return facts


def python_facts_cache() -> Path:
    """Where the images' Python facts are kept: ``$XDG_CACHE_HOME/automedbench/image-python``
    (``~/.cache/...`` by default)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "automedbench" / "image-python"


def _probe_python(client: Any, image: str) -> tuple[str, str]:
    probe = "import platform, sys; print('%d%d' % sys.version_info[:2], platform.machine())"
    try:
        out = client.containers.run(
            image, ["python3", "-c", probe], remove=True, network_mode="none"
        )
    except Exception as exc:
        raise SandboxError(f"the base image {image} has no working python3: {exc}") from exc
    version, machine = out.decode().split()
    return version, machine


def _read_python_facts(entry: Path) -> tuple[str, str] | None:
    try:
        stored = json.loads(entry.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict):
        return None
    version, machine = stored.get("py_tag"), stored.get("machine")
    if not (isinstance(version, str) and version.isdigit()):
        return None
    if not (isinstance(machine, str) and machine and machine.isprintable() and " " not in machine):
        return None
    return version, machine


def _write_python_facts(entry: Path, facts: tuple[str, str]) -> None:
    write_cache(entry, json.dumps({"py_tag": facts[0], "machine": facts[1]}))


# -------------------------------------------------------------------- requirements


def _requirement_name(requirement: str) -> str | None:
    """The project name of a requirement line of the core or of :data:`AGENT_EXTRAS`
    (other extras' requirements are skipped)."""
    marker = requirement.partition(";")[2]
    if "extra" in marker and not any(f'"{extra}"' in marker for extra in AGENT_EXTRAS):
        return None
    name = requirement.split(";")[0].strip()
    for stop in "<>=!~[ (":
        name = name.split(stop)[0]
    return name or None


def _pinned(names: Iterable[str], same_python: bool) -> list[str]:
    """``name==version`` as installed here (the harness's tested versions) when the image's
    Python is the harness's own; the bare name otherwise (pip picks what fits)."""
    lines = []
    for name in names:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            lines.append(name)
            continue
        lines.append(f"{name}=={version}" if same_python else name)
    return lines


def _host_py_tag() -> str:
    return f"{sys.version_info[0]}{sys.version_info[1]}"


def agent_requirements(py_tag: str) -> list[str]:
    """The harness's core dependencies and :data:`EXTRA_REQUIREMENTS` (what the bubblewrap
    sandbox offers at /venv)."""
    requires = metadata.requires("pytest-automedbench") or []
    names = [n for n in (_requirement_name(r) for r in requires) if n is not None]
    return _pinned([*names, *EXTRA_REQUIREMENTS], py_tag == _host_py_tag())


def evaluator_sources() -> dict[str, str]:
    """The evaluator package as shipped into its image, relative paths to text."""
    from pytest_automedbench import evaluators

    package = Path(evaluators.__file__).resolve().parent
    top = Path(sys.modules["pytest_automedbench"].__file__ or "").resolve()
    files = {"pytest_automedbench/__init__.py": top.read_text()}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        files[f"pytest_automedbench/evaluators/{rel}"] = path.read_text()
    return files


def download_wheels(requirements: list[str], dest: Path, py_tag: str, machine: str) -> None:
    """Binary wheels for the image's Python and machine, through the host's pip."""
    (dest / "requirements.txt").write_text("\n".join(requirements) + "\n")
    platforms = [f"manylinux_2_{minor}_{machine}" for minor in (36, 34, 31, 28, 27, 24, 17, 12)]
    platforms += [f"manylinux2014_{machine}", f"manylinux2010_{machine}", f"linux_{machine}"]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
    command += ["--only-binary=:all:", "--python-version", py_tag, "--implementation", "cp"]
    command += ["--abi", f"cp{py_tag}", "--dest", str(dest)]
    for tag in platforms:
        command += ["--platform", tag]
    command += ["-r", str(dest / "requirements.txt")]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SandboxError(
            "pip could not download the wheels for the Docker images "
            f"({', '.join(requirements)}):\n{done.stderr[-3000:]}"
        )


# ------------------------------------------------------------------------- builds


def _ensure_built(
    client: Any,
    role: str,
    *,
    from_arg: tuple[str, str],
    recipe: list[str],
    requirements: list[str],
    wheel_target: tuple[str, str],
    extra_context: dict[str, str],
    build_args: dict[str, str],
    say: Callable[[str], None],
) -> str:
    parent_id = client.images.get(from_arg[1]).id
    tag = f"{REPOSITORY}/{role}:" + digest(
        RECIPE_VERSION, parent_id, *recipe, *requirements, json.dumps(build_args, sort_keys=True)
    )
    if _image_exists(client, tag):
        return tag
    say(f"building the {role} image {tag}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"amb-build-{role}-", dir="/var/tmp") as tmp:
        context = Path(tmp)
        shutil.copyfile(IMAGES_DIR / f"{role}.Dockerfile", context / "Dockerfile")
        if requirements:
            wheels = context / "wheels"
            wheels.mkdir()
            download_wheels(requirements, wheels, *wheel_target)
        for rel, text in extra_context.items():
            (context / rel).parent.mkdir(parents=True, exist_ok=True)
            (context / rel).write_text(text)
        import docker.errors

        try:
            client.images.build(
                path=str(context),
                tag=tag,
                buildargs={from_arg[0]: from_arg[1], **build_args},
                labels={f"{LABEL}.role": role},
                rm=True,
                forcerm=True,
                timeout=BUILD_TIMEOUT_S,
            )
        except docker.errors.BuildError as exc:
            lines = [str(item.get("stream") or item.get("error") or "") for item in exc.build_log]
            tail = "".join(lines)[-3000:]
            raise SandboxError(f"building the {role} image failed: {exc}\n{tail}") from exc
    say(f"built {tag} in {time.monotonic() - started:.0f} s ({platform.node()})")
    return tag
