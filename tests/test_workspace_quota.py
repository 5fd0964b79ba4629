"""The per-cell workspace quota (:mod:`sandbox.quota`), exercised for real: loop-mounted
ext4 images, agents in both isolating backends filling them, two quotas side by side,
a stale mount left by a harness that died, and the refusals.

Quotas here are small (128 MiB, 20 000 inodes) so the fills take seconds, but each
attempt is the real one: the agent asks for 10 GB and for a million files.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_automedbench.sandbox import BubblewrapSandbox, DockerSandbox, SandboxSpec
from pytest_automedbench.sandbox import quota as quota_module
from pytest_automedbench.sandbox.mounted import MountedFiles
from pytest_automedbench.sandbox.quota import (
    QuotaError,
    QuotaSpec,
    WorkspaceQuota,
    quota_problem,
    sweep_stale_quotas,
)

MiB = 1024**2
SMALL = QuotaSpec(size_mb=128, inodes=20_000)
#: What the host may lose beyond the quota while a fill runs: the image's own metadata
#: and whatever else this host writes meanwhile (other test runs share its disk).
HOST_BYTES_SLACK = 256 * MiB
#: Host inodes a fill may cost: none for the fill itself (everything lands in the image);
#: the margin is for other processes on this host creating files meanwhile.
HOST_INODES_SLACK = 500

MakeQuota = Callable[..., WorkspaceQuota]


def loop_devices(image: Path) -> str:
    return subprocess.run(
        ["losetup", "-j", str(image)], capture_output=True, text=True, check=True
    ).stdout.strip()


def mount_options(point: Path) -> set[str]:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(point):
            return set(fields[5].split(","))
    raise AssertionError(f"{point} is not mounted")


def host_free(folder: Path) -> tuple[int, int]:
    """Free bytes and free inodes of the host file system holding ``folder``, once every
    dirty page (the image's own, written back through the loop device) is on disk."""
    os.sync()
    vfs = os.statvfs(folder)
    return vfs.f_bavail * vfs.f_frsize, vfs.f_favail


@pytest.fixture
def make_quota(tmp_path: Path) -> Iterator[MakeQuota]:
    """Quotas under this test's ``tmp_path``, unmounted at the end whatever happened."""
    quotas: list[WorkspaceQuota] = []

    def make(
        name: str = "ws", spec: QuotaSpec = SMALL, owner_uid: int | None = None, mount: bool = True
    ) -> WorkspaceQuota:
        quota = WorkspaceQuota(tmp_path / name, tmp_path / f"{name}.img", spec, owner_uid)
        quotas.append(quota)
        if mount:
            quota.mount()
        return quota

    yield make
    for quota in quotas:
        quota.unmount()


# --------------------------------------------------------------------------- the basics


def test_this_host_can_make_quotas() -> None:
    assert quota_problem() is None


def test_mounted_workspace_is_capped_owned_and_clean(make_quota: MakeQuota) -> None:
    quota = make_quota(owner_uid=4242)
    point = quota.mount_point
    assert quota.mounted and os.path.ismount(point)
    assert os.listdir(point) == [], "lost+found must be gone"
    assert os.stat(point).st_uid == 4242 and os.stat(point).st_gid == 4242
    options = mount_options(point)
    assert {"nosuid", "nodev"} <= options and "noexec" not in options, options
    vfs = os.statvfs(point)
    assert SMALL.inodes <= vfs.f_files <= SMALL.inodes * 1.1
    assert 0.9 * SMALL.size_mb * MiB <= vfs.f_blocks * vfs.f_frsize <= SMALL.size_mb * MiB
    used_bytes, used_inodes = quota.usage()
    assert used_bytes < 1 * MiB and used_inodes <= 12
    # Sparse: the empty image costs the host a few MiB, not its size.
    image = os.stat(quota.image_path)
    assert image.st_size == SMALL.size_mb * MiB and image.st_blocks * 512 < 8 * MiB
    (point / "hello.txt").write_text("hi")
    assert quota.usage()[1] == used_inodes + 1
    quota.unmount()
    assert not quota.mounted and loop_devices(quota.image_path) == ""
    assert not quota.marker.exists()
    quota.unmount()  # idempotent
    with pytest.raises(QuotaError):
        quota.usage()
    quota.image_path.unlink()


def test_programs_built_in_the_workspace_run(make_quota: MakeQuota) -> None:
    quota = make_quota()
    program = quota.mount_point / "tool.sh"
    program.write_text("#!/bin/sh\necho built-and-ran\n")
    program.chmod(0o755)
    assert subprocess.run([str(program)], capture_output=True, text=True).stdout == (
        "built-and-ran\n"
    )


def test_an_older_mkfs_still_gets_zeroed_inode_tables(
    make_quota: MakeQuota, monkeypatch: pytest.MonkeyPatch
) -> None:
    """e2fsprogs before 1.47 lacks ``assume_storage_prezeroed``: the fallback must still
    leave no inode table for the kernel to zero (every group marked ITABLE_ZEROED)."""
    real_run: Callable[[list[str]], subprocess.CompletedProcess[str]] = quota_module._run
    refused = []

    def old_mkfs(argv: list[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] == "mkfs.ext4" and "assume_storage_prezeroed" in " ".join(argv):
            refused.append(argv)
            return subprocess.CompletedProcess(argv, 1, "", "Bad option(s) specified: "
                                               "assume_storage_prezeroed=1")  # fmt: skip
        return real_run(argv)

    monkeypatch.setattr(quota_module, "_run", old_mkfs)
    quota = make_quota(owner_uid=4242)
    assert refused and quota.mounted and os.stat(quota.mount_point).st_uid == 4242
    quota.unmount()
    dump = subprocess.run(
        ["dumpe2fs", str(quota.image_path)], capture_output=True, text=True, check=True
    ).stdout
    groups = len(re.findall(r"^Group \d+:", dump, re.M))
    assert groups > 0 and dump.count("ITABLE_ZEROED") >= groups - 1, dump[:2000]
    assert os.stat(quota.image_path).st_blocks * 512 < 8 * MiB


def test_non_empty_folder_is_refused_and_left_as_it_was(make_quota: MakeQuota) -> None:
    quota = make_quota(mount=False)
    quota.mount_point.mkdir()
    (quota.mount_point / "keep.txt").write_text("the agent's earlier work")
    with pytest.raises(QuotaError, match="not empty"):
        quota.mount()
    assert (quota.mount_point / "keep.txt").read_text() == "the agent's earlier work"
    assert not quota.mounted and not os.path.ismount(quota.mount_point)
    assert not quota.image_path.exists() and not quota.marker.exists()


def test_existing_image_and_mounted_folder_are_refused(make_quota: MakeQuota) -> None:
    first = make_quota("a")
    again = WorkspaceQuota(first.mount_point, first.mount_point.parent / "b.img", SMALL)
    with pytest.raises(QuotaError):  # a mount point already: empty, but a mount
        again.mount()
    assert first.mounted and not again.image_path.exists()
    reused = make_quota("c", mount=False)
    reused.image_path.write_bytes(b"a previous cell's image")
    with pytest.raises(QuotaError, match="already exists"):
        reused.mount()
    assert reused.image_path.read_bytes() == b"a previous cell's image"


def test_unmount_of_a_busy_workspace_is_lazy_and_releases_the_loop(
    make_quota: MakeQuota,
) -> None:
    quota = make_quota()
    holder = subprocess.Popen(["sleep", "60"], cwd=quota.mount_point)
    try:
        quota.unmount()  # EBUSY: retried, then detached lazily; never raises
        assert not quota.mounted and not os.path.ismount(quota.mount_point)
    finally:
        holder.kill()
        holder.wait()
    quota.unmount()
    for _ in range(100):
        if loop_devices(quota.image_path) == "":
            break
        subprocess.run(["sleep", "0.05"])
    assert loop_devices(quota.image_path) == "", "autoclear frees the loop with its last user"


def test_a_copy_in_another_cells_namespace_does_not_keep_the_loop(
    make_quota: MakeQuota,
) -> None:
    """Another cell's bubblewrap call started while this workspace was mounted holds a
    private copy of the mount: unmount takes that copy down too, and the loop goes."""
    quota = make_quota()
    neighbour = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "--", "sleep", "60"]
    )
    try:
        for _ in range(100):  # until the neighbour's namespace exists (it execs sleep)
            mountinfo = Path(f"/proc/{neighbour.pid}/mountinfo")
            if (
                str(quota.mount_point) in mountinfo.read_text()
                and os.stat(f"/proc/{neighbour.pid}/ns/mnt").st_ino
                != os.stat("/proc/self/ns/mnt").st_ino
            ):
                break
            subprocess.run(["sleep", "0.02"])
        else:
            raise AssertionError("the neighbour never got its copy of the mount")
        quota.unmount()
        assert loop_devices(quota.image_path) == "", "the copy kept the loop device"
        assert str(quota.mount_point) not in mountinfo.read_text()
        assert neighbour.poll() is None, "the neighbour itself goes on"
    finally:
        neighbour.kill()
        neighbour.wait()


# --------------------------------------------------------------------------- two at once


def fill(folder: Path) -> int:
    """Write zeros into ``folder/big`` until the disk is full; the bytes written."""
    written = 0
    chunk = b"\0" * MiB
    with (folder / "big").open("wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            written += fh.write(chunk)
    return written


def test_two_quotas_are_independent(make_quota: MakeQuota) -> None:
    a, b = make_quota("a"), make_quota("b", spec=QuotaSpec(size_mb=64, inodes=2_000))
    assert loop_devices(a.image_path) != loop_devices(b.image_path)
    free_b = os.statvfs(b.mount_point).f_bavail
    written = fill(a.mount_point)
    assert 0.9 * SMALL.size_mb * MiB <= written <= SMALL.size_mb * MiB
    assert shutil.disk_usage(a.mount_point).free < 2 * MiB
    assert os.statvfs(b.mount_point).f_bavail == free_b
    # And the other way round: b fills to its own cap while a stays full.
    assert 0.9 * 64 * MiB <= fill(b.mount_point) <= 64 * MiB
    assert a.usage()[0] >= written


# --------------------------------------------------------------------------- stale mounts

_DYING_HARNESS = """
import sys
from pathlib import Path
from pytest_automedbench.sandbox.quota import QuotaSpec, WorkspaceQuota
WorkspaceQuota(Path(sys.argv[1]), Path(sys.argv[2]), QuotaSpec(64, 2000)).mount()
Path(sys.argv[1], "work.txt").write_text("left behind")
"""


def test_a_stale_mount_from_a_dead_owner_is_swept(tmp_path: Path, make_quota: MakeQuota) -> None:
    stale_point, stale_image = tmp_path / "stale", tmp_path / "stale.img"
    # A harness that mounts a workspace and dies without unmounting it.
    subprocess.run(
        [sys.executable, "-c", _DYING_HARNESS, str(stale_point), str(stale_image)], check=True
    )
    assert os.path.ismount(stale_point) and loop_devices(stale_image) != ""
    marker = Path(f"{stale_image}.owner")
    assert json.loads(marker.read_text())["mount_point"] == str(stale_point)
    alive = make_quota("alive")  # this process owns it: never swept
    assert sweep_stale_quotas(tmp_path) == [stale_point]
    assert not os.path.ismount(stale_point) and loop_devices(stale_image) == ""
    assert not marker.exists() and stale_image.exists(), "the image (the cell's work) stays"
    assert alive.mounted and alive.marker.exists()
    assert sweep_stale_quotas(tmp_path) == []
    # The kept image still holds the dead cell's workspace.
    reread = WorkspaceQuota(tmp_path / "reread", stale_image, SMALL)
    reread.mount_point.mkdir()
    subprocess.run(
        ["mount", "-o", "loop,ro", str(stale_image), str(reread.mount_point)], check=True
    )
    try:
        assert (reread.mount_point / "work.txt").read_text() == "left behind"
    finally:
        reread.unmount()
    assert loop_devices(stale_image) == ""


# --------------------------------------------------------------------------- real agents

_MANY_FILES = """
import errno, os
os.remove("/workspace/big")  # the agent frees the space first: only the inodes can run out
os.makedirs("/workspace/f", exist_ok=True)
count, err = 0, None
try:
    for i in range(1_000_000):
        open(f"/workspace/f/{i}", "w").close()
        count += 1
except OSError as exc:
    err = exc.errno
print(count, err, errno.errorcode.get(err, "-"))
"""


def public_dir(tmp_path: Path) -> Path:
    public = tmp_path / "public"
    public.mkdir()
    (public / "input.txt").write_text("hello")
    return public


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["docker", "bubblewrap"])
def test_agent_cannot_fill_the_host(backend: str, tmp_path: Path) -> None:
    workspace, image = tmp_path / "cell" / "workspace", tmp_path / "cell" / "workspace.img"
    spec = SandboxSpec(
        public_dir=public_dir(tmp_path),
        workspace_dir=workspace,
        memory_mb=1024,
        max_processes=128,
        tmp_mb=32,
        run_id=f"test-quota-{os.getpid()}",
    )
    box: MountedFiles = DockerSandbox(spec) if backend == "docker" else BubblewrapSandbox(spec)
    quota = WorkspaceQuota(workspace, image, SMALL, owner_uid=box.uid)
    quota.mount()
    try:
        box.start()
        try:
            run_agent_fills(box, quota, image.parent)
        finally:
            box.stop()
    finally:
        quota.unmount()
    assert not os.path.ismount(workspace) and loop_devices(image) == ""
    image.unlink()
    assert not image.exists()


def run_agent_fills(box: MountedFiles, quota: WorkspaceQuota, host_folder: Path) -> None:
    entries = sorted(os.listdir(host_folder))
    # 10 GB asked for: dd stops at the quota with ENOSPC.
    bytes_before, inodes_before = host_free(host_folder)
    dd = box.exec("bash", "dd if=/dev/zero of=/workspace/big bs=1M count=10240", timeout_s=120)
    bytes_after, inodes_after = host_free(host_folder)
    assert dd.exit_code != 0 and "No space left on device" in dd.stderr, dd
    big = os.stat(quota.mount_point / "big").st_size
    assert 0.9 * SMALL.size_mb * MiB <= big <= SMALL.size_mb * MiB, big
    assert bytes_before - bytes_after <= SMALL.size_mb * MiB + HOST_BYTES_SLACK
    assert inodes_before - inodes_after <= HOST_INODES_SLACK
    assert os.stat(quota.image_path).st_blocks * 512 <= SMALL.size_mb * MiB
    # The agent frees the space and asks for a million files: ENOSPC at the inode cap.
    free_inodes = os.statvfs(quota.mount_point).f_favail
    inodes_before = host_free(host_folder)[1]
    made = box.exec("python", textwrap.dedent(_MANY_FILES), 120)
    assert made.exit_code == 0, made
    count, err, name = made.stdout.split()
    assert (int(err), name) == (28, "ENOSPC"), made.stdout
    # "big" freed one inode and /workspace/f took one: every other free inode is a file.
    assert free_inodes - 5 <= int(count) <= free_inodes, (count, free_inodes)
    assert int(count) >= 0.9 * SMALL.inodes
    assert inodes_before - host_free(host_folder)[1] <= HOST_INODES_SLACK
    assert sorted(os.listdir(host_folder)) == entries, "nothing new on the host"
    assert quota.usage()[1] >= SMALL.inodes
    # The cell goes on: commands run, and once the agent cleans up it can write again.
    alive = box.exec("bash", "echo alive; rm -rf /workspace/f /workspace/big; echo ok > x", 120)
    assert alive.exit_code == 0 and alive.stdout.split() == ["alive"], alive
    assert (quota.mount_point / "x").read_text() == "ok\n"
    assert re.fullmatch(r"\d+", box.exec("bash", "id -u", 30).stdout.strip())
    assert shutil.disk_usage(quota.mount_point).free > 0.9 * SMALL.size_mb * MiB
