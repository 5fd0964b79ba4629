"""The harness's own programs inside a Harbor task container, out of the agent's reach.

A Harbor agent is root in the task image and may replace any program in it: a
``/usr/local/bin/bash`` that writes ``1`` to ``/logs/verifier/reward.txt`` forged a pass
when the verifier was started as ``bash -c "bash /tests/test.sh"``. So whatever the
harness itself runs in the container once the agent has had it (emptying
``/logs/verifier``, making ``/tests``, the leftover sweep, the verifier's own shell) is a
static program of the host's, bound read-only at :data:`HARNESS_DIR`:

* static, so the container's dynamic loader, its libraries, ``/etc/ld.so.preload`` and
  ``LD_PRELOAD`` play no part in it (a dynamic ``busybox`` would load the container's
  libc: it is refused);
* bound at a folder directly under ``/``, so the mount point itself cannot be renamed or
  removed (``EBUSY``) and, without ``CAP_SYS_ADMIN``, not unmounted or covered: a bind
  one level deeper would let the agent rename its parent and put its own folder there.

The host's copies come from Debian's ``bash-static`` and ``busybox-static`` packages
(``scripts/system-setup`` installs them wherever Docker runs Harbor tasks), copied once
per content into a folder of this user's.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Final

from pytest_automedbench.sandbox.base import SandboxError

#: Where the harness's programs are bound in a Harbor task container.
HARNESS_DIR: Final = "/.amb-harness"
HARNESS_BASH: Final = f"{HARNESS_DIR}/bash"
HARNESS_BUSYBOX: Final = f"{HARNESS_DIR}/busybox"
#: Each program's name in the folder, where it is on the host, and its Debian package.
HARNESS_SOURCES: Final = {
    "bash": (Path("/bin/bash-static"), "bash-static"),
    "busybox": (Path("/bin/busybox"), "busybox-static"),
}
#: An environment for the harness's own commands: nothing of the image's is looked up.
HARNESS_ENV: Final = {"PATH": HARNESS_DIR, "LC_ALL": "C"}
#: ELF program header type of the dynamic loader's path (a dynamically linked program).
_PT_INTERP = 3


def is_static_elf(path: Path) -> bool:
    """Whether ``path`` is a 64-bit little-endian ELF program without a ``PT_INTERP``
    header, i.e. one that no dynamic loader (nor its preloads) ever touches."""
    with path.open("rb") as handle:
        header = handle.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            return False
        (phoff,) = struct.unpack_from("<Q", header, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
        handle.seek(phoff)
        table = handle.read(phentsize * phnum)
    if len(table) < phentsize * phnum:
        return False
    types = (struct.unpack_from("<I", table, i * phentsize)[0] for i in range(phnum))
    return _PT_INTERP not in types


def harness_programs_dir() -> Path:
    """The host folder bound at :data:`HARNESS_DIR`: copies of the static programs, made
    once per content (a fresh folder is renamed into place, so concurrent workers never
    see a half-written one). Raises :class:`SandboxError` naming the missing package."""
    digest = hashlib.sha256()
    for name, (source, package) in HARNESS_SOURCES.items():
        if not source.is_file() or not is_static_elf(source):
            raise SandboxError(
                f"{source} is missing or not a static program: the Harbor verifier runs "
                f"the harness's own static {name}; install Debian's {package} "
                "(scripts/system-setup does)"
            )
        digest.update(name.encode() + b"\0" + hashlib.sha256(source.read_bytes()).digest())
    root = Path(tempfile.gettempdir()) / f"automedbench-harness-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    folder = root / digest.hexdigest()[:16]
    if folder.is_dir():
        return folder
    fresh = Path(tempfile.mkdtemp(prefix=".new-", dir=root))
    try:
        for name, (source, _) in HARNESS_SOURCES.items():
            shutil.copyfile(source, fresh / name)
            (fresh / name).chmod(0o755)
        fresh.chmod(0o755)
        with contextlib.suppress(FileExistsError, OSError):
            fresh.rename(folder)  # another worker may have won: its copy is the same
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    if not folder.is_dir():
        raise SandboxError(f"cannot make the harness's program folder {folder}")
    return folder


def busybox(*argv: str) -> list[str]:
    """A busybox applet's command line (``busybox("rm", "-rf", "/x")``)."""
    return [HARNESS_BUSYBOX, *argv]


#: Empties a folder for the verifier (``$1``; its parent ``$2``), as root with busybox
#: alone: any link or non-folder at either place is removed first (the folder must be a
#: fresh, real folder where the agent left a link to elsewhere or a file), then the
#: folder is removed whole and made again, mode ``$3``, owner ``$4`` when given.
RESET_DIR_SCRIPT: Final = (
    'B="$0"; for d in "$2" "$1"; do '
    'if [ -L "$d" ] || { [ -e "$d" ] && [ ! -d "$d" ]; }; then "$B" rm -f "$d" || exit 3; fi; '
    'done; "$B" rm -rf "$1" && "$B" mkdir -p "$1" && "$B" chmod "$3" "$1" || exit 4; '
    'if [ -n "$4" ]; then "$B" chown "$4" "$1" || exit 5; fi; exit 0'
)

#: One line per argument: its kind (``d`` folder, ``l`` link, ``f`` anything else that
#: exists, ``-`` nothing), a tab, the path; and for a link, a tab and its target.
CLASSIFY_SCRIPT: Final = (
    'B="$0"; for p in "$@"; do '
    'if [ -L "$p" ]; then printf "l\\t%s\\t%s\\n" "$p" "$("$B" readlink "$p")"; '
    'elif [ -d "$p" ]; then printf "d\\t%s\\n" "$p"; '
    'elif [ -e "$p" ]; then printf "f\\t%s\\n" "$p"; '
    'else printf -- "-\\t%s\\n" "$p"; fi; done'
)


#: Interpreters that the harness's own static bash stands in for (a shebang naming one,
#: directly or through ``env``): the script then runs with no program of the image's.
SHELL_INTERPRETERS: Final = frozenset({"bash", "sh"})


def shebang_words(first_line: str) -> list[str] | None:
    """The words of a script's ``#!`` line (interpreter first), None without one."""
    if not first_line.startswith("#!"):
        return None
    return first_line[2:].strip().split()


def runs_in_harness_shell(first_line: str) -> tuple[bool, list[str]]:
    """Whether a script whose first line is ``first_line`` runs in the harness's bash, and
    the shell options its shebang gives (``#!/bin/bash -e``: ``["-e"]``).

    Harbor runs a script directly (``bash -c "/tests/test.sh > out 2>&1"``): its shebang
    decides the interpreter, and a script with none is run by that bash (its fallback for
    a file the kernel will not execute). Here a script with no shebang, or one naming
    ``bash`` or ``sh`` (directly or through ``env``), runs in the harness's own static
    bash, the same language with nothing the agent could have replaced; any other
    interpreter (``#!/usr/bin/env python3``) is the image's, executed directly."""
    words = shebang_words(first_line)
    if not words:
        return True, []
    program, args = words[0], words[1:]
    if program.rsplit("/", 1)[-1] == "env":
        args = [a for a in args if a != "-S"]
        if not args or args[0].startswith("-"):
            return False, []
        program, args = args[0], args[1:]
    if program.rsplit("/", 1)[-1] not in SHELL_INTERPRETERS:
        return False, []
    return True, [a for a in args if a.startswith("-")]


def script_command(script: str, first_line: str, output: str) -> str:
    """The command line, for the harness's bash (``"$0"``), that runs ``script`` as
    Harbor does (:func:`runs_in_harness_shell`), stdout and stderr to ``output``."""
    shell, options = runs_in_harness_shell(first_line)
    if shell:
        flags = " ".join(options)
        program = f'"$0" --noprofile --norc {flags} {script}'.replace("  ", " ")
    else:
        program = script
    return f"{program} > {output} 2>&1"
