"""A seccomp filter for bubblewrap cells: the kernel state namespaces do not separate.

The bubblewrap backend gives each command fresh user, pid, ipc, uts, cgroup, mount and
network namespaces, but some kernel objects belong to no namespace at all. The kernel
keyring is the one that matters most: a harness started inside a session keyring (PAM,
systemd units and container runtimes all provide one) hands that keyring to every child,
and a process *possesses* the keys of the session keyring it inherited, so a cell could
``keyctl read`` the harness's keys even as another uid. A cell could also leave a key in
its uid's user keyring, which outlives its processes, for a later cell. Docker's default
seccomp profile denies these calls; bubblewrap applies no filter of its own, so this
module builds one, and ``bwrap --seccomp FD`` loads it into the command and into
bubblewrap's pid-1 reaper just before they run.

The program is classic BPF assembled by hand with :mod:`struct` (no libseccomp binding
is needed): it checks the architecture first (a syscall of another ABI would be looked
up by a different number table), refuses the x32 ABI on x86_64 (same architecture
value, numbers with bit 30 set) and then answers ``EPERM`` for the calls below; every
other call is allowed. ``EPERM`` rather than a kill: programs that probe a feature
(libuv probes io_uring, Kerberos probes the keyring) fall back cleanly, as they do under
Docker's profile.

====================  ======  ===========================================================
call(s)               answer  why
====================  ======  ===========================================================
add_key, keyctl,      EPERM   The keyring is not namespaced: the harness's session keys
request_key                   are possessed by every child, and a uid's user keyring
                              outlives the cell (a channel to a later cell with the same
                              uid). ``request_key`` can also start ``/sbin/request-key``
                              as host root. Agents have no honest use for it.
io_uring_setup,       EPERM   A large kernel surface with a long CVE history (its own
io_uring_enter,               worker threads, async file and socket operations); Docker
io_uring_register             denies it too. Python and glibc do not use it; libuv falls
                              back to its thread pool.
bpf                   EPERM   Verifier and JIT bugs are a recurring host escape; maps and
                              programs are kernel objects outside every namespace.
perf_event_open       EPERM   The PMU and the kernel's tracing are host-wide (a timing
                              side channel between cells and a CVE source). Profilers
                              that agents use (py-spy, cProfile) do not need it.
userfaultfd           EPERM   It lets a process stall the kernel at a page fault of its
                              choice, the classic way to win a race in a kernel exploit;
                              honest users (CRIU, live migration) are not agents.
kexec_load,           EPERM   Replacing the running kernel needs CAP_SYS_BOOT, which the
kexec_file_load               cell lacks; denied anyway so no capability mistake reaches it.
open_by_handle_at     EPERM   The known escape of a sandbox that kept CAP_DAC_READ_SEARCH
                              (it opens any host file by handle); the cell has no
                              capabilities, this is the second wall.
syslog                EPERM   The kernel log ring is host-wide (other cells' OOM kills
                              and segfaults, paths). ``dmesg_restrict`` usually hides it;
                              a host that sets it to 0 must not leak it to cells.
i386 calls (x86_64),  EPERM   Another number table: ``int $0x80`` on x86_64 or a 32-bit
x32 calls, any                binary would reach calls by other numbers than the table
other architecture            below, so everything in another ABI is refused.
ptrace,               allow   It reaches only the cell's own processes: its own pid
process_vm_readv/             namespace, its own uid, no capabilities, and bubblewrap's
writev, pidfd_getfd,          pid 1 runs under this same filter. Debuggers (gdb, py-spy,
kcmp                          strace) are honest tools.
SysV ipc, mq_*        allow   Each command has its own IPC namespace (``--unshare-ipc``).
mount, unshare,       allow   No capabilities and no nested user namespaces
setns, module, time           (``--disable-userns``): the kernel refuses them already.
and reboot calls
====================  ======  ===========================================================

Syscall numbers come from the kernel's syscall tables:
``arch/x86/entry/syscalls/syscall_64.tbl`` for x86_64 and
``include/uapi/asm-generic/unistd.h`` (the generic table arm64 uses) for aarch64.
"""

from __future__ import annotations

import errno
import os
import struct

from pytest_automedbench.sandbox.base import SandboxError

#: ``struct sock_filter``: u16 code, u8 jt, u8 jf, u32 k, in the kernel's byte order.
SOCK_FILTER = struct.Struct("=HBBI")
#: The kernel refuses a classic BPF program longer than this (BPF_MAXINSNS).
BPF_MAXINSNS = 4096

# Classic BPF opcodes (linux/filter.h, linux/bpf_common.h).
BPF_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
BPF_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
BPF_JSET_K = 0x05 | 0x40 | 0x00  # BPF_JMP | BPF_JSET | BPF_K
BPF_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K

#: ``struct seccomp_data``: int nr at offset 0, u32 arch at offset 4.
OFFSET_NR = 0
OFFSET_ARCH = 4

SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
RET_EPERM = SECCOMP_RET_ERRNO | errno.EPERM

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
AUDIT_ARCH_I386 = 0x40000003  # refused by the architecture check, like any other
#: x32 calls arrive with AUDIT_ARCH_X86_64 and this bit set in the number.
X32_SYSCALL_BIT = 0x40000000

#: The denied calls, by name (see the table above).
DENIED_SYSCALLS: tuple[str, ...] = (
    "add_key",
    "request_key",
    "keyctl",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "open_by_handle_at",
    "syslog",
)

#: Their numbers per architecture, from the kernel's syscall tables (see above).
SYSCALL_NUMBERS: dict[str, dict[str, int]] = {
    "x86_64": {
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "bpf": 321,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "open_by_handle_at": 304,
        "syslog": 103,
    },
    "aarch64": {
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "bpf": 280,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "open_by_handle_at": 265,
        "syslog": 116,
    },
}

AUDIT_ARCHES = {"x86_64": AUDIT_ARCH_X86_64, "aarch64": AUDIT_ARCH_AARCH64}
#: Names ``uname -m`` gives for the supported architectures.
MACHINE_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


class UnsupportedArchitecture(SandboxError):
    """The running kernel's architecture has no syscall table here (the bubblewrap
    backend refuses to start rather than run a cell without the filter)."""


def running_arch() -> str:
    """The running kernel's architecture as a key of :data:`SYSCALL_NUMBERS`."""
    machine = os.uname().machine
    arch = MACHINE_ALIASES.get(machine.lower())
    if arch is None:
        supported = ", ".join(sorted(SYSCALL_NUMBERS))
        raise UnsupportedArchitecture(
            f"no seccomp filter for bubblewrap cells on {machine!r} (supported: {supported})"
        )
    return arch


def build_filter(arch: str) -> bytes:
    """The compiled program for ``arch`` ("x86_64" or "aarch64"), as bwrap reads it."""
    if arch not in SYSCALL_NUMBERS:
        raise UnsupportedArchitecture(f"no seccomp filter for architecture {arch!r}")
    numbers = SYSCALL_NUMBERS[arch]
    # (code, jump-if-true target, jump-if-false target, k); targets are "next", "deny"
    # or "allow", resolved to relative offsets once the length is known.
    program: list[tuple[int, str, str, int]] = [
        (BPF_LD_W_ABS, "next", "next", OFFSET_ARCH),
        (BPF_JEQ_K, "next", "deny", AUDIT_ARCHES[arch]),
        (BPF_LD_W_ABS, "next", "next", OFFSET_NR),
    ]
    if arch == "x86_64":
        program.append((BPF_JSET_K, "deny", "next", X32_SYSCALL_BIT))
    for name in DENIED_SYSCALLS:
        program.append((BPF_JEQ_K, "deny", "next", numbers[name]))
    program.append((BPF_RET_K, "next", "next", SECCOMP_RET_ALLOW))
    program.append((BPF_RET_K, "next", "next", RET_EPERM))
    labels = {"allow": len(program) - 2, "deny": len(program) - 1}
    if len(program) > BPF_MAXINSNS:
        raise ValueError(f"seccomp program of {len(program)} instructions is too long")
    out = bytearray()
    for index, (code, if_true, if_false, k) in enumerate(program):

        def offset(target: str, index: int = index) -> int:
            jump = 0 if target == "next" else labels[target] - index - 1
            if not 0 <= jump <= 0xFF:  # jt and jf are one byte each
                raise ValueError(f"seccomp jump of {jump} instructions cannot be encoded")
            return jump

        out += SOCK_FILTER.pack(code, offset(if_true), offset(if_false), k)
    return bytes(out)


def bubblewrap_filter() -> bytes:
    """The compiled program for the running architecture (for ``bwrap --seccomp FD``);
    :class:`UnsupportedArchitecture` on any architecture but x86_64 and aarch64."""
    return build_filter(running_arch())
