"""A disk and inode quota per cell workspace: a sparse ext4 image, loop-mounted.

Both isolating backends bind-mount the host folder ``<cell>/workspace`` at
``/workspace``, so whatever file system sits on that folder when the sandbox starts is
what the agent writes to. :class:`WorkspaceQuota` puts a small file system of its own
there: a sparse image file formatted as ext4 with a fixed size and a fixed inode count,
loop-mounted on the folder for the cell's life. An agent that writes until the disk is
full, or creates files until none are left, gets ``ENOSPC`` from its own file system and
the host loses at most the image's size and one inode. Neither backend changes.

Why this and not the alternatives:

* **XFS/ext4 project quotas** would cap a plain host folder without a loop device, but
  need the host file system mounted with ``prjquota`` (here: ext4 on ``/`` without it), and
  a harness cannot remount the host's root to get it.
* **tmpfs** (``size=``, ``nr_inodes=``) caps both, but holds the agent's files in RAM
  (and swap): a 20 GiB workspace would be 20 GiB of memory per cell.
* **An ext4 image** needs only root, a loop device and ``mkfs.ext4``, costs host disk
  only for what the agent really writes (the image is sparse), and keeps the workspace
  on disk after the cell, so it can be read back or kept.

How the image is made (:meth:`WorkspaceQuota.mount`):

* ``truncate`` a new file (``O_EXCL``: an existing image is never overwritten), so every
  block reads as zero and none is allocated on the host.
* ``mkfs.ext4 -b 4096 -I 256 -N <inodes> -m 0 -O ^has_journal -E nodiscard,
  assume_storage_prezeroed=1,root_owner=<uid>:<uid>``. ``-m 0``: no blocks reserved for
  root (the agent never is root, and the cap is the whole image). No journal: the file
  system is a scratch space whose life is one cell (a host crash loses the cell anyway), so
  the crash consistency a journal buys is not needed; it would take 128 MiB of a 20 GiB
  cap and write every metadata change twice (a million small files: twice the writes).
  ``assume_storage_prezeroed`` (e2fsprogs 1.47): the fresh sparse file reads as zeros, so
  mkfs writes no inode tables and marks them zeroed; neither mkfs nor the kernel's
  lazy-init thread ever touches them (a million inodes are 244 MiB of tables). ``nodiscard``:
  nothing to discard in a new sparse file. An older mkfs gets ``lazy_itable_init=1,
  lazy_journal_init=1`` with discard left on instead: discarding a regular file punches
  holes, which lets mkfs mark the tables zeroed too (measured: with ``nodiscard`` and lazy
  init, no group is marked, and the kernel zeroes them after the mount; through the loop
  device's write-zeroes that cost no host disk on kernel 6.18, but may on another kernel).
* ``mount -o loop,nosuid,nodev,noatime``. **Not** ``noexec``: the agent builds and runs
  programs in its workspace. ``nosuid``/``nodev`` stop a setuid binary or a device node
  planted in the image (by anyone who could write the image file) from meaning anything.
  ``mount -o loop`` sets the loop device's autoclear flag, so the device goes with the
  last reference to the file system.
* ``lost+found`` is removed after the mount: the agent would see a root-owned 0700
  folder it cannot enter, and every workspace walk (``chown_tree``, the output scan, a
  report) would meet it. ``e2fsck`` recreates it if it ever needs one.
* The root of the file system belongs to ``owner_uid`` (the sandbox uid), set by mkfs;
  the backends' ``chown_tree`` at start works on it as on any folder.

A mount point that is not empty is refused (:class:`QuotaError`) rather than moved in:
moving means copying across file systems (slow, maybe larger than the quota, and a
half-done move on failure), and a cell's workspace is made fresh, so content there is a
leftover the caller must decide about. ``size_mb`` is the image's size, so it bounds what
the host can lose; the agent gets slightly less (the inode tables: 256 bytes an inode).

Every bubblewrap call, of any cell, starts in a private copy of the host's mount table
(``unshare --mount --propagation private``), so a workspace mount lives on in the calls
of *other* cells that started while it was mounted, and the host's ``umount`` never
reaches those copies (seen in testing: a neighbour's stopped sandbox kept a loop device
attached after its cell was done). :meth:`WorkspaceQuota.unmount` therefore lazily
unmounts the same loop device in any other namespace still holding it (``nsenter``; only
mounts of that very device are touched) before it detaches the device. Propagation
cannot do this for us: the copies are made private on purpose.

A harness that dies leaves its loop mounts behind. Next to each image a marker
(``<image>.owner``) names the owning process (:mod:`owner`), and
:func:`sweep_stale_quotas` unmounts and detaches the images of owners certainly gone,
keeping the images themselves (they hold a cell's workspace).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from pytest_automedbench.sandbox.owner import is_gone, process_identity

#: The marker next to an image: ``<image>`` + this suffix, JSON with owner and mount point.
OWNER_SUFFIX = ".owner"
REQUIRED_TOOLS = ("mkfs.ext4", "mount", "umount", "losetup")
#: Polite unmount attempts (a process still in the folder: EBUSY) before a lazy one.
UMOUNT_TRIES = 5
UMOUNT_PAUSE_S = 0.1
#: How long unmount waits for the loop device to go (a namespace holding the file system
#: ends a moment after its sandbox: a container removed, a bubblewrap call ending).
RELEASE_WAIT_S = 2.0
CAP_SYS_ADMIN = 21
_MOUNTINFO = Path("/proc/self/mountinfo")
_SYS_BLOCK = Path("/sys/block")


class QuotaError(RuntimeError):
    """The workspace quota could not be set up or taken down (an infrastructure fault)."""


@dataclass(frozen=True)
class QuotaSpec:
    """A workspace's caps: ``size_mb`` MiB of image (host disk it may cost at most) and
    ``inodes`` files and folders (mkfs rounds up to a whole number of block groups)."""

    size_mb: int
    inodes: int

    def __post_init__(self) -> None:
        if self.size_mb < 8:
            raise ValueError(f"a workspace quota needs at least 8 MiB, not {self.size_mb}")
        if self.inodes < 64:
            raise ValueError(f"a workspace quota needs at least 64 inodes, not {self.inodes}")


def quota_problem() -> str | None:
    """Why this host cannot make workspace quotas, or None."""
    if sys.platform != "linux":
        return "workspace quotas need Linux (loop devices and ext4)"
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (Debian: apt-get install e2fsprogs mount)"
    if os.geteuid() != 0:
        return "the harness must run as root to loop-mount a workspace image"
    if not _has_cap_sys_admin():
        return "the harness lacks CAP_SYS_ADMIN (mounting is refused in this container)"
    if not Path("/dev/loop-control").exists() and not any(Path("/dev").glob("loop[0-9]*")):
        return "no loop devices (/dev/loop-control is missing: modprobe loop)"
    return None


def _has_cap_sys_admin() -> bool:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return True  # cannot tell: let mount itself answer
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    return True


# --------------------------------------------------------------------------- mounts


def _unescape(field: str) -> str:
    """A mountinfo path field (spaces, tabs, newlines and backslashes octal-escaped)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _loop_mounts() -> list[tuple[Path, Path]]:
    """``(mount point, backing file)`` of every loop-device mount in this namespace."""
    mounts = []
    with contextlib.suppress(OSError):
        for line in _MOUNTINFO.read_text().splitlines():
            fields = line.split()
            if len(fields) < 5:
                continue
            backing = _backing_file_of(fields[2])
            if backing is not None:
                mounts.append((Path(_unescape(fields[4])), backing))
    return mounts


def _backing_file_of(major_minor: str) -> Path | None:
    try:
        text = Path(f"/sys/dev/block/{major_minor}/loop/backing_file").read_text()
    except OSError:
        return None
    return Path(text.rstrip("\n"))


def _loop_devices(image: Path) -> list[str]:
    """The loop devices backed by ``image`` (``losetup -j``, read from sysfs)."""
    devices = []
    for loop in sorted(_SYS_BLOCK.glob("loop*")):
        with contextlib.suppress(OSError):
            backing = (loop / "loop" / "backing_file").read_text().rstrip("\n")
            if _same_file(Path(backing), image):
                devices.append(f"/dev/{loop.name}")
    return devices


def _device_numbers(device: str) -> str | None:
    """``major:minor`` of a ``/dev/loopN`` (as mountinfo writes it), None when gone."""
    try:
        return (_SYS_BLOCK / Path(device).name / "dev").read_text().strip()
    except OSError:
        return None


def _foreign_holders(numbers: set[str]) -> dict[int, list[str]]:
    """Mount namespaces other than ours that still hold a mount of one of these devices:
    one pid in each, with the mount points there (deepest first). A bubblewrap call of
    any cell copies the host's whole mount table into a private namespace when it
    starts (``unshare --mount --propagation private``), so a cell's loop mount lives on in
    the calls that started while it was mounted, and the host's umount never reaches them."""
    own = os.stat("/proc/self/ns/mnt").st_ino
    seen: set[int] = {own}
    holders: dict[int, list[str]] = {}
    for mountinfo in Path("/proc").glob("[0-9]*/mountinfo"):
        try:
            namespace = os.stat(mountinfo.parent / "ns" / "mnt").st_ino
            if namespace in seen:
                continue
            text = mountinfo.read_text()
        except OSError:
            continue  # the process went, or is not ours to read
        seen.add(namespace)
        points = [
            _unescape(fields[4])
            for fields in (line.split() for line in text.splitlines())
            if len(fields) > 4 and fields[2] in numbers
        ]
        if points:
            holders[int(mountinfo.parent.name)] = sorted(points, key=len, reverse=True)
    return holders


def _detach_elsewhere(devices: list[str]) -> None:
    """Lazily unmount these loop devices in every other mount namespace that still holds
    them (only mounts of these very devices: nothing else there is touched)."""
    numbers = {n for n in map(_device_numbers, devices) if n is not None}
    if not numbers or shutil.which("nsenter") is None:
        return
    for pid, points in _foreign_holders(numbers).items():
        for point in points:
            _run(["nsenter", f"--mount=/proc/{pid}/ns/mnt", "--", "umount", "-l", point])


def _same_file(a: Path, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _mounted_at(mount_point: Path, image: Path) -> bool:
    return any(
        _same_file(point, mount_point) and _same_file(backing, image)
        for point, backing in _loop_mounts()
    )


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def _take_down(mount_point: Path, image: Path) -> None:
    """Unmount ``image`` from ``mount_point`` (politely, then lazily) and detach its loop
    devices; a file system that is not mounted is fine. Raises only when it stays mounted."""
    for attempt in range(UMOUNT_TRIES):
        if not _mounted_at(mount_point, image):
            break
        _run(["umount", str(mount_point)])
        if attempt and _mounted_at(mount_point, image):
            time.sleep(UMOUNT_PAUSE_S)
    if _mounted_at(mount_point, image):
        _run(["umount", "-l", str(mount_point)])
    if _mounted_at(mount_point, image):
        raise QuotaError(f"cannot unmount the workspace image from {mount_point}")
    deadline = time.monotonic() + RELEASE_WAIT_S
    elsewhere_done = False
    while devices := _loop_devices(image):
        if not elsewhere_done and time.monotonic() > deadline - RELEASE_WAIT_S / 2:
            _detach_elsewhere(devices)
            elsewhere_done = True
        for device in devices:
            # On a device still in use (a namespace that holds the file system) this only
            # sets autoclear: the kernel frees it with the last reference.
            _run(["losetup", "-d", device])
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)


# --------------------------------------------------------------------------- the quota


class WorkspaceQuota:
    """A sparse ext4 image at ``image_path``, loop-mounted on ``mount_point`` for a
    cell's life (see the module's docstring for the choices)."""

    def __init__(
        self, mount_point: Path, image_path: Path, spec: QuotaSpec, owner_uid: int | None = None
    ) -> None:
        self.mount_point = Path(os.path.realpath(mount_point))
        self.image_path = Path(os.path.realpath(image_path))
        self.spec = spec
        self.owner_uid = owner_uid

    @property
    def marker(self) -> Path:
        """The owner marker next to the image (what :func:`sweep_stale_quotas` reads)."""
        return self.image_path.with_name(self.image_path.name + OWNER_SUFFIX)

    @property
    def mounted(self) -> bool:
        return _mounted_at(self.mount_point, self.image_path)

    def mount(self) -> None:
        """Make the image, format it and mount it on ``mount_point`` (created if missing).
        Refuses a non-empty mount point, a mount point that is already one, and an image
        that already exists."""
        problem = quota_problem()
        if problem is not None:
            raise QuotaError(f"workspace quotas unavailable: {problem}")
        point = self.mount_point
        point.mkdir(parents=True, exist_ok=True)
        if not point.is_dir() or point.is_symlink():
            raise QuotaError(f"{point} is not a folder")
        if any(point.iterdir()):
            raise QuotaError(
                f"{point} is not empty: a workspace quota mounts only on an empty folder "
                "(its content would be hidden under the image)"
            )
        if os.path.ismount(point):
            raise QuotaError(f"{point} is already a mount point")
        self.image_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.image_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise QuotaError(
                f"{self.image_path} already exists (remove or keep it first)"
            ) from None
        try:
            os.ftruncate(fd, self.spec.size_mb * 1024**2)
        finally:
            os.close(fd)
        try:
            self.marker.write_text(
                json.dumps({"owner": process_identity(), "mount_point": str(point)})
            )
            self._format()
            mounted = _run(
                ["mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime",
                 str(self.image_path), str(point)]
            )  # fmt: skip
            if mounted.returncode != 0:
                raise QuotaError(f"cannot mount the workspace image: {mounted.stderr.strip()}")
            lost = point / "lost+found"
            with contextlib.suppress(FileNotFoundError):
                lost.rmdir()
            uid = 0 if self.owner_uid is None else self.owner_uid
            os.chown(point, uid, uid)
        except BaseException:
            with contextlib.suppress(Exception):
                _take_down(point, self.image_path)
            self.image_path.unlink(missing_ok=True)
            self.marker.unlink(missing_ok=True)
            raise

    def _format(self) -> None:
        uid = 0 if self.owner_uid is None else self.owner_uid
        base = ["mkfs.ext4", "-F", "-q", "-b", "4096", "-I", "256", "-m", "0"]
        base += ["-N", str(self.spec.inodes), "-O", "^has_journal", "-L", "amb-workspace"]
        owner = f"root_owner={uid}:{uid}"
        fresh = f"{owner},nodiscard,assume_storage_prezeroed=1"
        made = _run([*base, "-E", fresh, str(self.image_path)])
        if made.returncode != 0 and "assume_storage_prezeroed" in made.stderr:
            lazy = f"{owner},lazy_itable_init=1,lazy_journal_init=1"  # e2fsprogs < 1.47
            made = _run([*base, "-E", lazy, str(self.image_path)])
        if made.returncode != 0:
            raise QuotaError(f"mkfs.ext4 failed: {made.stderr.strip()[:2000]}")

    def unmount(self) -> None:
        """Unmount (retried, then lazily), unmount the copies other mount namespaces hold,
        release the loop device and drop the marker; the image stays. Idempotent: an
        image that is not mounted is fine."""
        _take_down(self.mount_point, self.image_path)
        self.marker.unlink(missing_ok=True)

    def usage(self) -> tuple[int, int]:
        """``(bytes used, inodes used)`` of the mounted file system (``os.statvfs``; the
        inodes include ext4's ten reserved ones and the root)."""
        if not self.mounted:
            raise QuotaError(f"the workspace image is not mounted on {self.mount_point}")
        vfs = os.statvfs(self.mount_point)
        return (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize, vfs.f_files - vfs.f_ffree

    def __enter__(self) -> WorkspaceQuota:
        self.mount()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.unmount()


def sweep_stale_quotas(root: Path | None = None) -> list[Path]:
    """Unmount and detach the workspace images whose owning harness certainly died (see
    :mod:`owner`); ``root``: only images under that folder. Returns the mount points that
    were taken down. Images are kept (they hold a cell's workspace); their markers go."""
    swept = []
    images: dict[Path, Path | None] = {}
    for point, backing in _loop_mounts():
        images.setdefault(backing, point)
    for loop in _SYS_BLOCK.glob("loop*"):  # attached but no longer mounted here
        with contextlib.suppress(OSError):
            images.setdefault(Path((loop / "loop" / "backing_file").read_text().rstrip("\n")), None)
    base = Path(os.path.realpath(root)) if root is not None else None
    for image, mounted_at in images.items():
        if base is not None and not image.is_relative_to(base):
            continue
        marker = image.with_name(image.name + OWNER_SUFFIX)
        try:
            owner = json.loads(marker.read_text())
            identity, recorded = str(owner["owner"]), Path(owner["mount_point"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours, or unreadable: left alone
        if not is_gone(identity):
            continue
        point = mounted_at or recorded
        try:
            _take_down(point, image)
        except QuotaError:
            continue
        marker.unlink(missing_ok=True)
        swept.append(point)
    return swept
