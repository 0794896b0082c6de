"""Prompt directories on this host (local, singularity), and a filesystem of its own for each
prompt's files, so that one prompt cannot fill the host's disk.

Where the runner is root and the kernel has loop devices, a prompt's directory (its `work` and
`tmp`) is the mount point of an ext4 filesystem of `--disk` bytes, in a sparse file unlinked as
soon as it is mounted: writing past it fails with "No space left on device" in that prompt alone,
and the host only ever holds what was written. Each filesystem is a copy of a template made once
per process (84 KiB of metadata, where mkfs.ext4 in a process of its own costs ~5 ms), on a loop
device that detaches itself when the filesystem goes. Each worker mounts them in a mount
namespace of its own, so they go with it even after `kill -9`. Elsewhere `Disks.unavailable` says
why, and a prompt's directory is a plain one, bounded only by the host's disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import stat
import struct
import subprocess
import tempfile
from pathlib import Path

from ..util import parse_size
from .base import BackendSettings, BaseBackend, SandboxError, flag

_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_AUTOCLEAR = 4
_LOOP_INFO64_FLAGS = 52  # offset of lo_flags in struct loop_info64 (232 bytes)
_MS_NOSUID, _MS_NODEV = 2, 4
_MS_REC, _MS_SLAVE = 0x4000, 0x80000
_MNT_DETACH = 2
_CLONE_NEWNS = 0x00020000

_libc = ctypes.CDLL(None, use_errno=True)


def _copy_sparse(src: str, dst: str) -> None:
    """Copy only the data of `src` (its holes stay holes): a template of 2 GiB has ~1 MB of data."""
    s = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        d = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            size, offset = os.fstat(s).st_size, 0
            while offset < size:
                try:
                    start = os.lseek(s, offset, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # nothing but a hole from here
                        break
                    raise
                end = os.lseek(s, start, os.SEEK_HOLE)
                at = start
                while at < end:
                    at += os.copy_file_range(s, d, end - at, at, at)
                offset = end
            os.ftruncate(d, size)
        finally:
            os.close(d)
    finally:
        os.close(s)


def _attach_loop(image: str) -> tuple[int, str]:
    """A free loop device backed by `image`, cleared by the kernel when its last user goes."""
    with open(image, "r+b", buffering=0) as backing, open("/dev/loop-control", "rb", buffering=0) as ctl:
        info = bytearray(232)
        struct.pack_into("I", info, _LOOP_INFO64_FLAGS, _LO_FLAGS_AUTOCLEAR)
        config = struct.pack("II", backing.fileno(), 0) + bytes(info) + bytes(64)
        for _ in range(32):  # another process may take the device we were offered: ask again
            number = fcntl.ioctl(ctl.fileno(), _LOOP_CTL_GET_FREE)
            fd = os.open(f"/dev/loop{number}", os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.ioctl(fd, _LOOP_CONFIGURE, config)
                return fd, f"/dev/loop{number}"
            except OSError as exc:
                os.close(fd)
                if exc.errno != errno.EBUSY:
                    raise
        raise OSError(errno.EBUSY, "no free loop device")


def _mount(device: str, target: str) -> None:
    if _libc.mount(device.encode(), target.encode(), b"ext4", ctypes.c_ulong(_MS_NOSUID | _MS_NODEV), None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {device} on {target}: {os.strerror(err)}")


def private_mounts() -> bool:
    """Give this process a mount namespace of its own, receiving the host's mounts but sending it
    none: the prompts' filesystems it mounts then go with it, even after `kill -9` (the kernel
    unmounts them, and their loop devices clear). Call while the process has one thread (a
    thread started before keeps the old namespace). As root only; False where it cannot be done."""
    if os.geteuid() != 0 or _libc.unshare(_CLONE_NEWNS) != 0:
        return False
    return _libc.mount(b"none", b"/", None, ctypes.c_ulong(_MS_REC | _MS_SLAVE), None) == 0


def unmount(target: str | Path) -> None:
    """Detach the filesystem at `target` (it goes once nothing uses it; its loop device with it)."""
    if _libc.umount2(str(target).encode(), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more)
            raise OSError(err, f"unmount {target}: {os.strerror(err)}")


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root` (what a crashed run left mounted), deepest first."""
    prefix = str(root).rstrip("/") + "/"
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            point = line.split(" ")[4].replace("\\040", " ")
            if point.startswith(prefix):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def remove_tree(path: Path) -> None:
    """Remove a directory tree whose code may have taken away its own rights (`chmod 0 d`): where
    the runner is its owner rather than root, it gives them back on the way. Links are removed,
    never followed."""
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path):
        return
    stack = [str(path)]
    while stack:
        d = stack.pop()
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(os.lstat(d).st_mode):
                os.chmod(d, 0o700)
                stack.extend(e.path for e in os.scandir(d) if e.is_dir(follow_symlinks=False))
    shutil.rmtree(path, ignore_errors=True)


def own_directory(path: Path) -> None:
    """Make the run's directory `path` inside its base (a sandbox root, by default in /tmp, where
    any local user could have made it first) and make sure neither can be turned against a root
    runner: each a directory, not a link, and the base not another user's to change."""
    base = path.parent
    base.mkdir(parents=True, exist_ok=True)
    st = os.lstat(base)
    others_may_swap = st.st_uid != os.geteuid() and not (st.st_uid == 0 and (
        not st.st_mode & stat.S_IWOTH or st.st_mode & stat.S_ISVTX))
    if not stat.S_ISDIR(st.st_mode) or others_may_swap:
        raise OSError(errno.EPERM, f"{base} is {'a link' if stat.S_ISLNK(st.st_mode) else f'owned by uid {st.st_uid}'}, "
                                   "not a directory of this user's: pass --sandbox_root=<a directory of your own>")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o755)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(errno.EPERM, f"{path} is not a directory of this user's (owner uid {st.st_uid}): "
                                   "pass --sandbox_root=<a directory of your own>")


class Disks:
    """Makes each prompt's directory: a bounded filesystem of its own where possible. Its `work`
    and `tmp` belong to the uid the prompt's code runs as; the filesystem's root belongs to the
    runner, and the prompt never sees it."""

    def __init__(self, size: int, home: Path):
        self.size, self.home = size, home
        self.template: str | None = None
        self.unavailable: str | None = None  # why prompts get plain directories here, if they do

    def setup(self) -> None:
        """Make the template and try one filesystem; on failure say why, in `unavailable`."""
        if os.geteuid() != 0:
            self.unavailable = "the runner is not root (mounting a filesystem per prompt needs root)"
        elif not os.path.exists("/dev/loop-control"):
            self.unavailable = "this kernel has no loop devices (/dev/loop-control)"
        elif not shutil.which("mkfs.ext4"):
            self.unavailable = "mkfs.ext4 is not installed (apt-get install e2fsprogs)"
        if self.unavailable:
            return
        self.home.mkdir(parents=True, exist_ok=True)
        fd, template = tempfile.mkstemp(prefix=".disk-template-", dir=self.home)
        os.close(fd)
        skeleton = tempfile.mkdtemp(prefix=".disk-skeleton-", dir=self.home)  # 0700: the fs root, the runner's
        try:
            for name in ("work", "tmp"):
                os.mkdir(os.path.join(skeleton, name), 0o755)
            os.truncate(template, self.size)
            subprocess.run(
                ["mkfs.ext4", "-q", "-F", "-O", "^has_journal,^resize_inode", "-m", "0", "-d", skeleton, "-E",
                 f"root_owner={os.geteuid()}:{os.getegid()},lazy_itable_init=1,nodiscard", template],
                check=True, capture_output=True, text=True, timeout=60)
            self.template = template
            probe = self.home / f".disk-probe-{os.getpid()}"
            probe.mkdir()
            try:
                self.make(probe, os.geteuid())
            finally:
                self.release(probe)
        except (OSError, subprocess.SubprocessError) as exc:
            detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) else str(exc)
            self.unavailable = f"a filesystem per prompt could not be made ({detail})"
            self.template = None
            with contextlib.suppress(OSError):
                os.unlink(template)
        finally:
            shutil.rmtree(skeleton, ignore_errors=True)

    def note(self) -> list[str]:
        if not self.unavailable:
            return []
        return [f"note: --disk is not enforced here: {self.unavailable}; a prompt's files are bounded only by "
                "this host's free disk"]

    def image_of(self, top: Path) -> str:
        return f"{top}.disk"  # beside the prompt's directory, in the runner's (while it is being made)

    def make(self, top: Path, owner: int) -> None:
        """`work` and `tmp`, owned by `owner`, in the empty directory `top`: on a fresh bounded
        filesystem mounted there where possible (nothing of the prompt's exists yet)."""
        if self.template is None:
            for name in ("work", "tmp"):
                os.mkdir(top / name)
        else:
            self._mount_fresh(top)
        if owner != os.geteuid():
            for name in ("work", "tmp"):
                os.chown(top / name, owner, owner)

    def _mount_fresh(self, top: Path) -> None:
        assert self.template is not None
        image = self.image_of(top)
        _copy_sparse(self.template, image)
        try:
            fd, device = _attach_loop(image)
            try:
                _mount(device, str(top))
            finally:
                os.close(fd)  # the mount holds the device now; it clears when unmounted
        finally:
            os.unlink(image)  # the device holds the file: its space goes with the device, whatever ends it

    def release(self, top: Path) -> None:
        """Remove the prompt's directory `top`: unmount its filesystem, remove its image, then what
        is left (the jail using it has ended: nothing races this)."""
        if self.template is not None:
            unmount(top)
        remove_tree(top)

    def sweep(self) -> None:
        """What crashed processes left in `home`: filesystems still mounted, their images, templates."""
        if not self.home.is_dir():
            return
        for point in mounts_under(self.home):
            unmount(point)
        for p in self.home.iterdir():
            if str(p) != self.template and (p.name.endswith(".disk") or p.name.startswith(".disk-")):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)

    def close(self) -> None:
        if self.template is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.template)
            self.template = None

    def finish(self) -> None:
        """The run is over (no worker of it is left): its directory goes too, if nothing is in it."""
        self.close()
        with contextlib.suppress(OSError):
            self.home.rmdir()


class SandboxRootSettings(BackendSettings):
    """For a backend whose sandboxes hold directories of this host (local, singularity)."""

    sandbox_root: str | None = flag(None, "where per-prompt directories are made (default $TMPDIR/hermes-batch)")


def sandbox_root(settings: SandboxRootSettings) -> Path:
    base = Path(settings.sandbox_root or os.path.join(tempfile.gettempdir(), "hermes-batch"))
    # one directory per run, so the orphan sweep of one run never touches another's sandboxes
    return base / settings.run_label


class HostDirectories(BaseBackend):
    """What a backend whose prompts get directories of this host shares (local, singularity): the
    run's own directory under the sandbox root, each prompt's filesystem of `--disk` bytes where
    possible, and filesystems that go with their worker."""

    settings: SandboxRootSettings

    def __init__(self, settings: SandboxRootSettings):
        super().__init__(settings)
        self.root = sandbox_root(settings)
        self.disks = Disks(parse_size(settings.disk, "--disk"), self.root)

    async def prepare_directories(self) -> None:
        try:
            own_directory(self.root)
        except OSError as exc:
            raise SandboxError(f"the {self.name} backend cannot use its sandbox root {exc.filename or self.root}: "
                               f"{exc.strerror or exc}") from exc
        await asyncio.to_thread(self.disks.setup)
        self.notes = self.disks.note()

    @staticmethod
    def enter_worker() -> None:
        private_mounts()  # the prompts' filesystems go with the worker, even when it is killed

    async def shutdown(self) -> None:
        self.disks.close()

    async def finish_run(self) -> None:
        self.disks.finish()
