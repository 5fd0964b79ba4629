"""Nothing passes between bubblewrap cells, or from the harness to a cell, through kernel
state that no namespace separates: the keyrings, io_uring, other syscall ABIs.

The threat is real on an ordinary host: a harness started inside a session keyring (PAM,
systemd, container runtimes) hands it to every child, and the child *possesses* its keys
even as another uid. The first live test shows the harness's secret leaking into a
sandbox built without the filter, so the checks after it are known to be able to fail.

The keyring tests run the harness side in a child Python process (:data:`_DRIVER`) that
joins a fresh session keyring of its own: joining one in the pytest process would change
the keyring of every test after it. Keys are made with the raw syscalls through ctypes;
inside the sandbox both ``keyctl`` (Debian: keyutils) and ctypes are tried.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shlex
import shutil
import struct
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from pytest_automedbench.sandbox import BubblewrapSandbox, SandboxSpec
from pytest_automedbench.sandbox import bubblewrap as bw
from pytest_automedbench.sandbox import seccomp as sc

ARCH = sc.running_arch()
NR = sc.SYSCALL_NUMBERS[ARCH]
KEY_NAME = "amb-harness-secret"


class MakeBox(Protocol):
    def __call__(self, name: str = "ws") -> BubblewrapSandbox: ...


@pytest.fixture
def make_box(tmp_path: Path) -> Iterator[MakeBox]:
    public = tmp_path / "public"
    public.mkdir()
    (public / "input.txt").write_text("hello")
    boxes: list[BubblewrapSandbox] = []

    def make(name: str = "ws") -> BubblewrapSandbox:
        box = BubblewrapSandbox(SandboxSpec(public_dir=public, workspace_dir=tmp_path / name))
        box.start()
        boxes.append(box)
        return box

    yield make
    for box in boxes:
        box.stop()


def run_ok(box: BubblewrapSandbox, code: str, language: str = "python") -> str:
    result = box.exec("python" if language == "python" else "bash", code, timeout_s=60)
    assert result.exit_code == 0, result
    out: str = result.stdout
    return out


def run_json(box: BubblewrapSandbox, code: str) -> Any:
    return json.loads(run_ok(box, textwrap.dedent(code)).strip().splitlines()[-1])


# --------------------------------------------------------------------------- the harness side

#: Runs as its own process: joins a fresh session keyring, puts the secret in it, then
#: runs each cell (a list of bash commands) in a new sandbox and prints the results.
_DRIVER = r"""
import ctypes, json, sys
from pathlib import Path
from pytest_automedbench.sandbox import BubblewrapSandbox, SandboxSpec
from pytest_automedbench.sandbox import seccomp

job = json.loads(sys.argv[1])
nr = seccomp.SYSCALL_NUMBERS[seccomp.running_arch()]
libc = ctypes.CDLL(None, use_errno=True)
L = ctypes.c_long
keyring = libc.syscall(L(nr["keyctl"]), L(1), ctypes.c_char_p(job["keyring"].encode()))
if keyring < 0:
    sys.exit(f"the harness cannot join a session keyring: errno {ctypes.get_errno()}")
secret = job["secret"].encode()
key = libc.syscall(L(nr["add_key"]), ctypes.c_char_p(b"user"), ctypes.c_char_p(job["key"].encode()),
                   ctypes.c_char_p(secret), L(len(secret)), L(-3))
if key < 0:
    sys.exit(f"the harness cannot add a key: errno {ctypes.get_errno()}")


class Unfiltered(BubblewrapSandbox):
    def command(self, argv, *rest):
        line = super().command(argv, *rest)
        at = line.index("--seccomp")
        return line[:at] + line[at + 2:]


cells, uid = [], None
for index, commands in enumerate(job["cells"]):
    kind = Unfiltered if job["unfiltered"] else BubblewrapSandbox
    box = kind(SandboxSpec(public_dir=Path(job["public"]),
                           workspace_dir=Path(job["root"]) / f"ws{index}"))
    if uid is not None:
        box.uid = uid  # the same uid again: the user keyring would outlive the first cell
    uid = box.uid
    box.start()
    try:
        runs = []
        for code in commands:
            result = box.exec("bash", code.replace("@KEY@", str(key)), 60)
            runs.append({"rc": result.exit_code, "out": result.stdout, "err": result.stderr})
        cells.append(runs)
    finally:
        box.stop()
print(json.dumps({"key": key, "cells": cells}))
"""


def run_cells(tmp_path: Path, cells: list[list[str]], unfiltered: bool = False) -> dict[str, Any]:
    """Run ``cells`` from a harness inside a fresh session keyring holding a secret key."""
    assert shutil.which("keyctl"), "keyctl is missing: apt-get install keyutils"
    public = tmp_path / "public"
    public.mkdir(exist_ok=True)
    secret = f"amb-secret-{secrets.token_hex(16)}"
    job = {
        "keyring": f"amb-test-{secrets.token_hex(4)}",
        "key": KEY_NAME,
        "secret": secret,
        "cells": cells,
        "unfiltered": unfiltered,
        "public": str(public),
        "root": str(tmp_path),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, json.dumps(job)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    report["secret"] = secret
    return report


#: Python run inside the sandbox: the key calls by number, each result as [ret, errno].
_KEY_CALLS = f"""
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
L, S = ctypes.c_long, ctypes.c_char_p
def call(*args):
    ctypes.set_errno(0)
    return [libc.syscall(*args), ctypes.get_errno()]
buf = ctypes.create_string_buffer(256)
print(json.dumps({{
    "read": call(L({NR["keyctl"]}), L(11), L(@KEY@), buf, L(256)),
    "session_id": call(L({NR["keyctl"]}), L(0), L(-3), L(0)),
    "search": call(L({NR["keyctl"]}), L(10), L(-3), S(b"user"), S(b"{KEY_NAME}"), L(0)),
    "request_key": call(L({NR["request_key"]}), S(b"user"), S(b"{KEY_NAME}"), None, L(0)),
    "payload": buf.raw.rstrip(bytes(1)).decode(errors="replace"),
}}))
"""

#: The reads a cell tries on the harness's keyring: keyutils' tool, /proc, then ctypes.
_KEYCTL_READS = [
    "keyctl show @s; echo rc=$?",
    "keyctl read @KEY@; echo rc=$?",
    "keyctl print @KEY@; echo rc=$?",
    f"keyctl search @s user {KEY_NAME}; echo rc=$?",
    "cat /proc/keys /proc/key-users",
    f"/venv/bin/python -c {shlex.quote(_KEY_CALLS)}",
]


def test_without_the_filter_the_harness_secret_leaks(tmp_path: Path) -> None:
    """The control: the same reads in a sandbox without ``--seccomp`` get the secret."""
    report = run_cells(tmp_path, [_KEYCTL_READS], unfiltered=True)
    outputs = "".join(run["out"] for run in report["cells"][0])
    assert report["secret"] in outputs, report


def test_harness_session_keyring_is_out_of_reach(tmp_path: Path) -> None:
    report = run_cells(tmp_path, [_KEYCTL_READS])
    runs = report["cells"][0]
    for run in runs:
        assert report["secret"] not in run["out"] + run["err"], run
    for run in runs[:4]:  # each keyctl command failed, refused by the kernel
        assert "rc=0" not in run["out"], run
        assert "Operation not permitted" in run["err"], run
    assert KEY_NAME not in runs[4]["out"], runs[4]
    calls = json.loads(runs[5]["out"].strip().splitlines()[-1])
    for name in ("read", "session_id", "search", "request_key"):
        assert calls[name] == [-1, errno.EPERM], (name, calls)
    assert calls["payload"] == ""


_LEAVE_KEYS = [
    "keyctl add user amb-leftover left-by-cell-one @u; echo rc=$?",
    "keyctl add user amb-leftover left-by-cell-one @s; echo rc=$?",
    "echo left | keyctl padd user amb-leftover @us; echo rc=$?",
    "keyctl newring amb-ring @u; echo rc=$?",
    "keyctl new_session amb-cell-session; echo rc=$?",
    "/venv/bin/python -c "
    + shlex.quote(
        "import ctypes; libc = ctypes.CDLL(None, use_errno=True); L = ctypes.c_long; "
        f"key = libc.syscall(L({NR['add_key']}), b'user', b'amb-leftover', b'x', L(1), L(-4)); "
        f"perm = libc.syscall(L({NR['keyctl']}), L(5), L(key), L(0x3F3F3F3F)); "
        "print(key, perm, ctypes.get_errno())"
    ),
]
_FIND_KEYS = [
    "keyctl show @u; echo rc=$?",
    "keyctl search @u user amb-leftover; echo rc=$?",
    "cat /proc/keys",
]


def test_without_the_filter_a_cell_leaves_keys_for_a_later_one(tmp_path: Path) -> None:
    """The control: unfiltered, the second cell (same uid) sees the first one's keys."""
    report = run_cells(tmp_path, [_LEAVE_KEYS, _FIND_KEYS], unfiltered=True)
    assert "amb-leftover" in "".join(run["out"] for run in report["cells"][1]), report


def test_a_cell_cannot_leave_keys_for_a_later_cell(tmp_path: Path) -> None:
    """Two cells in sequence, even with the same uid (whose user keyring outlives the
    first): the first cannot add a key anywhere, the second finds none."""
    report = run_cells(tmp_path, [_LEAVE_KEYS, _FIND_KEYS])
    first, second = report["cells"]
    for run in first[:5]:
        assert "rc=0" not in run["out"], run
        assert "Operation not permitted" in run["err"], run
    assert first[5]["out"].split() == ["-1", "-1", str(errno.EPERM)], first[5]
    for run in second:
        assert "amb-leftover" not in run["out"], run
    assert "rc=0" not in second[0]["out"] + second[1]["out"], second


# --------------------------------------------------------------------------- other calls and ABIs


def test_every_denied_call_answers_eperm_by_its_number(make_box: MakeBox) -> None:
    """The numbers are those of the running kernel: each call, with null arguments (a
    call the filter let through would fail otherwise, EFAULT or EINVAL), gets EPERM."""
    box = make_box()
    numbers = {name: NR[name] for name in sc.DENIED_SYSCALLS}
    found = run_json(
        box,
        f"""
        import ctypes, json
        libc = ctypes.CDLL(None, use_errno=True)
        out = {{}}
        for name, nr in {numbers!r}.items():
            ctypes.set_errno(0)
            ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(0)] * 6)
            out[name] = [ret, ctypes.get_errno()]
        print(json.dumps(out))
        """,
    )
    assert found == {name: [-1, errno.EPERM] for name in sc.DENIED_SYSCALLS}


def test_io_uring_setup_is_denied(make_box: MakeBox) -> None:
    box = make_box()
    params = "ctypes.create_string_buffer(120)"  # struct io_uring_params, zeroed
    found = run_json(
        box,
        f"""
        import ctypes, json
        libc = ctypes.CDLL(None, use_errno=True)
        ret = libc.syscall(ctypes.c_long({NR["io_uring_setup"]}), ctypes.c_long(4), {params})
        print(json.dumps([ret, ctypes.get_errno()]))
        """,
    )
    assert found == [-1, errno.EPERM]


_INT80_GETPID = r"""
#include <stdio.h>
int main(void) {
    long ret;
    /* i386 getpid (20) through the 32-bit entry: seccomp sees AUDIT_ARCH_I386. */
    __asm__ volatile("int $0x80" : "=a"(ret) : "a"(20L) : "r8", "r9", "r10", "r11", "memory");
    printf("%ld\n", ret);
    return 0;
}
"""


def test_other_syscall_abis_are_denied(make_box: MakeBox) -> None:
    """x86_64: an x32 call (bit 30 in the number) and an i386 ``int $0x80`` call, both of
    getpid, which the 64-bit table allows, get EPERM. aarch64 processes cannot switch to
    AArch32 without a 32-bit binary, so there the filter itself is run on the foreign
    architecture (the structural tests below do that for every case)."""
    box = make_box()
    if ARCH != "x86_64":
        program = sc.bubblewrap_filter()
        assert run_filter(program, 20, 0x40000028) == sc.RET_EPERM  # AUDIT_ARCH_ARM
        return
    x32 = run_json(
        box,
        """
        import ctypes, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        ret = libc.syscall(ctypes.c_long(0x40000000 | 39))
        print(json.dumps([ret, ctypes.get_errno(), libc.syscall(ctypes.c_long(39)) == os.getpid()]))
        """,
    )
    assert x32 == [-1, errno.EPERM, True]
    box.write_file("int80.c", _INT80_GETPID.encode())
    out = run_ok(box, "gcc -O0 -o int80 int80.c && ./int80", language="bash")
    assert out.split() == [str(-errno.EPERM)]


# --------------------------------------------------------------------------- honest work


_THREADS_FORK_PTRACE = r"""
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

static void *work(void *arg) {
    long *sum = arg;
    for (long i = 0; i < 1000; i++) *sum += i;
    return NULL;
}

int main(void) {
    pthread_t threads[4];
    long sums[4] = {0};
    for (int i = 0; i < 4; i++) pthread_create(&threads[i], NULL, work, &sums[i]);
    for (int i = 0; i < 4; i++) pthread_join(threads[i], NULL);
    pid_t child = fork();
    if (child == 0) {
        pause();
        _exit(0);
    }
    int status = 0, stopped = 0;
    if (ptrace(PTRACE_ATTACH, child, NULL, NULL) == 0 && waitpid(child, &status, 0) == child)
        stopped = WIFSTOPPED(status);
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    printf("sum=%ld traced=%d\n", sums[0] + sums[1] + sums[2] + sums[3], stopped);
    return 0;
}
"""


def test_honest_work_still_runs(make_box: MakeBox) -> None:
    box = make_box()
    found = run_json(
        box,
        """
        import json, multiprocessing, threading
        import numpy

        def square(x):
            return x * x

        totals = []
        def count():
            totals.append(sum(range(100)))

        threads = [threading.Thread(target=count) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with multiprocessing.get_context("fork").Pool(2) as pool:
            squares = pool.map(square, range(5))
        queue = multiprocessing.get_context("spawn").Queue()
        queue.put("through /dev/shm")
        print(json.dumps({
            "threads": totals,
            "pool": squares,
            "queue": queue.get(timeout=10),
            "numpy": float(numpy.linalg.inv(numpy.eye(3) * 2).sum()),
        }))
        """,
    )
    assert found == {
        "threads": [4950] * 4,
        "pool": [0, 1, 4, 9, 16],
        "queue": "through /dev/shm",
        "numpy": 1.5,
    }
    assert run_ok(box, "/venv/bin/python -m pip --version", language="bash").startswith("pip ")
    box.write_file("work.c", _THREADS_FORK_PTRACE.encode())
    out = run_ok(box, "gcc -O1 -pthread -o work work.c && ./work", language="bash")
    assert out.split() == ["sum=1998000", "traced=1"]  # ptrace of its own child is allowed


def test_filter_covers_bubblewraps_init_and_its_descriptor_does_not_leak(
    make_box: MakeBox,
) -> None:
    """bwrap's pid 1 (which the cell may ptrace: same uid) runs under the filter with no
    capabilities, and the descriptor the program came through is closed before the
    command runs."""
    box = make_box()
    assert (box._stage is not None) and (box._stage / bw.SECCOMP_FILE).read_bytes() == (
        sc.bubblewrap_filter()
    )
    found = run_json(
        box,
        """
        import json, os
        def status(pid):
            lines = open(f"/proc/{pid}/status").read().splitlines()
            return dict(line.split(":\\t", 1) for line in lines if ":\\t" in line)
        init, me = status(1), status("self")
        print(json.dumps({
            "init": [init["Seccomp"], init["CapEff"]],
            "self": [me["Seccomp"], me["CapEff"]],
            "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        }))
        """,
    )
    assert found["init"] == ["2", "0000000000000000"]
    assert found["self"] == ["2", "0000000000000000"]
    assert bw.SECCOMP_FD not in found["fds"]


# --------------------------------------------------------------------------- the program itself


def run_filter(program: bytes, nr: int, arch: int) -> int:
    """Run a classic BPF seccomp program on a ``seccomp_data`` (nr, arch, zeros) and
    return its answer; only the opcodes the builder emits are known."""
    data = struct.pack("=II", nr & 0xFFFFFFFF, arch) + bytes(56)
    insns = [sc.SOCK_FILTER.unpack_from(program, at) for at in range(0, len(program), 8)]
    pc = acc = 0
    for _ in range(len(insns)):  # no backward jumps: at most one pass
        code, jt, jf, k = insns[pc]
        if code == sc.BPF_LD_W_ABS:
            (acc,) = struct.unpack_from("=I", data, k)
            pc += 1
        elif code == sc.BPF_JEQ_K:
            pc += 1 + (jt if acc == k else jf)
        elif code == sc.BPF_JSET_K:
            pc += 1 + (jt if acc & k else jf)
        elif code == sc.BPF_RET_K:
            return int(k)
        else:
            raise AssertionError(f"unexpected opcode {code:#x} at {pc}")
    raise AssertionError("the program ran off its end")


#: Calls honest work makes, by number (read, write, execve, clone, ptrace, mmap).
_ALLOWED = {
    "x86_64": {"read": 0, "write": 1, "mmap": 9, "clone": 56, "execve": 59, "ptrace": 101},
    "aarch64": {"read": 63, "write": 64, "mmap": 222, "clone": 220, "execve": 221, "ptrace": 117},
}
_FOREIGN = (sc.AUDIT_ARCH_I386, 0x40000028, sc.AUDIT_ARCH_X86_64, sc.AUDIT_ARCH_AARCH64, 0)


@pytest.mark.parametrize("arch", sorted(sc.SYSCALL_NUMBERS))
def test_program_structure_and_answers(arch: str) -> None:
    program = sc.build_filter(arch)
    assert len(program) % 8 == 0 and 0 < len(program) // 8 <= sc.BPF_MAXINSNS
    first, second = sc.SOCK_FILTER.unpack_from(program, 0), sc.SOCK_FILTER.unpack_from(program, 8)
    assert first == (sc.BPF_LD_W_ABS, 0, 0, sc.OFFSET_ARCH)  # the architecture comes first
    assert second[0] == sc.BPF_JEQ_K and second[3] == sc.AUDIT_ARCHES[arch]
    native = sc.AUDIT_ARCHES[arch]
    numbers = sc.SYSCALL_NUMBERS[arch]
    assert set(numbers) == set(sc.DENIED_SYSCALLS)
    assert len(set(numbers.values())) == len(numbers)
    for name in sc.DENIED_SYSCALLS:
        assert run_filter(program, numbers[name], native) == sc.RET_EPERM, name
    for name, nr in _ALLOWED[arch].items():
        assert nr not in numbers.values()
        assert run_filter(program, nr, native) == sc.SECCOMP_RET_ALLOW, name
        for other in _FOREIGN:
            if other != native:
                assert run_filter(program, nr, other) == sc.RET_EPERM, (name, hex(other))
    x32 = sc.X32_SYSCALL_BIT | _ALLOWED[arch]["read"]
    expected_x32 = sc.RET_EPERM if arch == "x86_64" else sc.SECCOMP_RET_ALLOW
    assert run_filter(program, x32, native) == expected_x32


def test_running_arch_program_and_unsupported_arches(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sc.bubblewrap_filter() == sc.build_filter(ARCH)
    assert sc.MACHINE_ALIASES[os.uname().machine] == ARCH
    with pytest.raises(sc.UnsupportedArchitecture, match="riscv64"):
        sc.build_filter("riscv64")
    fake = os.uname_result(("Linux", "host", "6.0", "#1", "riscv64"))
    monkeypatch.setattr(sc.os, "uname", lambda: fake)
    with pytest.raises(sc.UnsupportedArchitecture, match="riscv64"):
        sc.bubblewrap_filter()
    assert issubclass(sc.UnsupportedArchitecture, bw.SandboxError)
