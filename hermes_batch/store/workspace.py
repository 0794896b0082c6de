"""A sample's final work tree (`--save_workspace`): taken from its sandbox once the agent has
stopped and its processes are gone, before any check file is written or any check runs; put
back in a fresh sandbox by `recheck`, so a fixed check scores the same work without the agent.

The tree travels as a gzipped tar of the work directory (what the sandbox protocol can move:
`exec`, `read_file`, `write_file`), at most `limit` bytes; the run keeps it in
`workspaces/<id>.tar.gz`. What the agent changed outside the work directory (packages it
installed system-wide) is not in it: `recheck` runs the row's `setup` again first.
"""

from __future__ import annotations

import shlex

from pydantic import BaseModel, field_validator

from ..backends import Sandbox, SandboxError
from ..flags import flag
from ..util import parse_size

DIRECTORY = "workspaces"
TAR_TIMEOUT = 300.0


def is_file_name(sample_id: object) -> bool:
    """Whether an id (as a record says it) can name a file in a directory of the run's or an
    export's: a tampered record's `../x` or `/etc/x` cannot."""
    return (isinstance(sample_id, str) and 0 < len(sample_id) <= 200 and "/" not in sample_id
            and "\\" not in sample_id and "\0" not in sample_id and not sample_id.startswith("."))


def file_name(sample_id: str) -> str:
    if not is_file_name(sample_id):
        raise ValueError(f"the id {sample_id!r} cannot name a file")
    return f"{DIRECTORY}/{sample_id}.tar.gz"


async def take(sandbox: Sandbox, limit: int) -> bytes:
    """The work directory as a .tar.gz; SandboxError saying why not (too big, no tar)."""
    work = shlex.quote(sandbox.workdir)
    made = await sandbox.exec(
        'f=$(mktemp "${TMPDIR:-/tmp}/.hb-workspace.XXXXXX") || exit 3; '
        # sparse files as holes (GNU tar's -S), not gigabytes of zeros read and restored
        'S=; tar --help 2>&1 | grep -q -- --sparse && S=S; '
        f'tar "-cz${{S}}f" "$f" -C {work} . 2>"$f.err"; rc=$?; '
        # GNU tar: 1 is "a file changed as it was read", the archive is whole
        'if [ $rc -gt 1 ]; then cat "$f.err" >&2; rm -f "$f" "$f.err"; exit 4; fi; '
        'rm -f "$f.err"; echo "$f"; wc -c < "$f"',
        language="shell", timeout=TAR_TIMEOUT, runner=True)
    if made.exit_code != 0:
        raise SandboxError(f"could not archive the work directory: {(made.stderr or made.stdout).strip()[-500:]}")
    path, size = made.stdout.split()[:2]
    try:
        if int(size) > limit:
            raise SandboxError(f"the work directory is {int(size):,} bytes compressed, over the limit of {limit:,}")
        return await sandbox.read_file(path, limit)
    finally:
        await sandbox.exec(f"rm -f {shlex.quote(path)}", language="shell", timeout=60, runner=True)


async def put_back(sandbox: Sandbox, archive: bytes) -> None:
    """Make the work directory exactly what `take` archived."""
    work = shlex.quote(sandbox.workdir)
    made = await sandbox.exec('mktemp "${TMPDIR:-/tmp}/.hb-workspace.XXXXXX"', language="shell", timeout=60, runner=True)
    if made.exit_code != 0:
        raise SandboxError(f"no temporary file for the work directory: {made.stderr.strip()[-500:]}")
    path = shlex.quote(made.stdout.strip())
    await sandbox.write_file(made.stdout.strip(), archive)
    # -o: files keep the restoring user as owner; tar could not give them another's without CAP_CHOWN
    res = await sandbox.exec(f"find {work} -mindepth 1 -delete && tar -xzof {path} -C {work}; rc=$?; rm -f {path}; exit $rc",
                             language="shell", timeout=TAR_TIMEOUT, runner=True)
    if res.exit_code != 0:
        raise SandboxError(f"could not restore the work directory: {(res.stderr or res.stdout).strip()[-500:]}")


class WorkspaceSettings(BaseModel):
    save_workspace: bool = flag(False, "keep each trajectory's final work directory (workspaces/<id>.tar.gz), so "
                                       "`recheck` can score it again with fixed checks")
    workspace_limit: str = flag("32m", "the largest work directory --save_workspace keeps, compressed (larger: "
                                       "the record says so)")

    @field_validator("workspace_limit")
    @classmethod
    def _workspace_limit(cls, v: str) -> str:
        parse_size(v, "--workspace_limit")  # a clear error for "lots"
        return v
