"""File tools: read, write, patch and search files inside the sandbox's work directory only."""

from __future__ import annotations

import shlex

from pydantic import BaseModel, Field

from ..util import clip
from .base import TOOL_OUTPUT_CHARS, ToolContext, ToolError, ToolResult, confine
from .toolset import Toolset

PATCH_MAX_BYTES = 8 * 1024 * 1024
MAX_LINE_CHARS = 2000
SEARCH_MAX_MATCHES = 200


class ReadFileArgs(BaseModel):
    path: str = Field(description="File path, relative to the work directory (or absolute inside it).")
    offset: int = Field(1, ge=1, description="First line to return (1-based).")
    limit: int = Field(500, ge=1, le=5000, description="Maximum number of lines to return.")


class ReadFileTool:
    name = "read_file"
    toolset = "file"
    description = "Read a text file from the work directory. Lines come numbered; use offset/limit for long files."
    Args = ReadFileArgs

    async def run(self, args: ReadFileArgs, ctx: ToolContext) -> ToolResult:
        sandbox, path = await confine(ctx, args.path)
        q = shlex.quote(path)
        last = args.offset + args.limit - 1
        # one round trip: existence and type checks, the line count (a last line without its newline
        # counts, unlike in `wc -l`), then the numbered slice
        script = (
            f"[ -e {q} ] || {{ echo 'no such file' >&2; exit 2; }}; "
            f"[ -d {q} ] && {{ echo 'is a directory' >&2; exit 2; }}; "
            f"[ -f {q} ] || {{ echo 'not a regular file' >&2; exit 2; }}; "  # reading a FIFO would block
            f"if [ -s {q} ] && ! grep -qI . {q}; then echo 'binary file' >&2; exit 3; fi; "
            f"awk 'END {{ print NR }}' {q}; sed -n '{args.offset},{last}p' {q} | cut -c1-{MAX_LINE_CHARS}"
        )
        res = await sandbox.exec(script, language="shell", timeout=60, output_limit=TOOL_OUTPUT_CHARS * 2)
        if res.exit_code != 0:
            raise ToolError(f"cannot read {args.path}: {res.stderr.strip() or f'exit code {res.exit_code}'}")
        count_line, _, body = res.stdout.partition("\n")
        total = int(count_line.strip() or 0)
        lines = body.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        numbered = "\n".join(f"{args.offset + i:6d}\t{line}" for i, line in enumerate(lines))
        shown_to = args.offset + len(lines) - 1
        header = f"{args.path}: lines {args.offset}-{shown_to} of {total}" if lines else f"{args.path}: no lines at offset {args.offset} (file has {total})"
        return ToolResult(True, clip(f"{header}\n{numbered}", TOOL_OUTPUT_CHARS))


class WriteFileArgs(BaseModel):
    path: str = Field(description="File path, relative to the work directory. Parent directories are created.")
    content: str = Field(description="The complete new content of the file.")


class WriteFileTool:
    name = "write_file"
    toolset = "file"
    description = "Create or overwrite a file in the work directory with the given content."
    Args = WriteFileArgs

    async def run(self, args: WriteFileArgs, ctx: ToolContext) -> ToolResult:
        sandbox, path = await confine(ctx, args.path)
        data = args.content.encode()
        await sandbox.write_file(path, data)
        return ToolResult(True, f"wrote {len(data)} bytes to {args.path}")


class PatchArgs(BaseModel):
    path: str = Field(description="File to edit, relative to the work directory.")
    old_string: str = Field(description="Exact text to replace; it must occur exactly once in the file.")
    new_string: str = Field(description="Replacement text.")


class PatchTool:
    name = "patch"
    toolset = "file"
    description = "Edit a file by replacing one exact, unique occurrence of old_string with new_string."
    Args = PatchArgs

    async def run(self, args: PatchArgs, ctx: ToolContext) -> ToolResult:
        if not args.old_string:
            raise ToolError("old_string is empty; use write_file to create a file")
        sandbox, path = await confine(ctx, args.path)
        data = await sandbox.read_file(path, PATCH_MAX_BYTES + 1)
        if len(data) > PATCH_MAX_BYTES:
            raise ToolError(f"{args.path} is larger than {PATCH_MAX_BYTES} bytes; edit it with the terminal")
        text = data.decode("utf-8", errors="surrogateescape")
        count = text.count(args.old_string)
        if count == 0:
            raise ToolError(f"old_string was not found in {args.path}")
        if count > 1:
            raise ToolError(f"old_string occurs {count} times in {args.path}; include more surrounding text to make it unique")
        start_line = text[: text.index(args.old_string)].count("\n") + 1
        patched = text.replace(args.old_string, args.new_string, 1)
        await sandbox.write_file(path, patched.encode("utf-8", errors="surrogateescape"))
        end_line = start_line + args.new_string.count("\n")
        return ToolResult(True, f"patched {args.path}: replaced 1 occurrence, now lines {start_line}-{end_line}")


class SearchFilesArgs(BaseModel):
    pattern: str = Field(description="Extended regular expression (grep -E) to look for in file contents.")
    path: str = Field(".", description="Directory or file to search, relative to the work directory.")


class SearchFilesTool:
    name = "search_files"
    toolset = "file"
    description = "Search file contents under a directory of the work directory; returns path:line: text for each match."
    Args = SearchFilesArgs

    async def run(self, args: SearchFilesArgs, ctx: ToolContext) -> ToolResult:
        if not args.pattern:
            raise ToolError("pattern is empty")
        sandbox, path = await confine(ctx, args.path)
        # POSIX sh only; grep's status rides on a last line, which `head` drops only when matches abound
        # GNU grep skips binaries and .git; BusyBox's (Alpine) knows neither option
        script = (
            f"cd -- {shlex.quote(sandbox.workdir)} && "
            "if grep -rnIE --exclude-dir=.git -e . /dev/null >/dev/null 2>&1 || [ $? -eq 1 ]; "
            "then set -- -rnIE --exclude-dir=.git; else set -- -rnE; fi; "
            f"{{ grep \"$@\" -e {shlex.quote(args.pattern)} -- {shlex.quote(path)} 2>&1; echo \"__rc=$?\"; }} "
            f"| head -n {SEARCH_MAX_MATCHES + 2} | cut -c1-{MAX_LINE_CHARS}"
        )
        res = await sandbox.exec(script, language="shell", timeout=60)
        lines = res.stdout.rstrip("\n").split("\n")  # not splitlines(): a matched line may hold U+2028
        exit_code = 0
        if lines and lines[-1].startswith("__rc="):
            exit_code = int(lines.pop()[5:] or 0)
        return _search_result(lines, exit_code, args, sandbox.workdir)


def _search_result(lines: list[str], exit_code: int, args: SearchFilesArgs, workdir: str) -> ToolResult:
    lines = [ln for ln in lines if ln]
    if exit_code >= 2 and all(ln.startswith("grep:") for ln in lines):
        raise ToolError(f"search failed: {lines[0] if lines else f'exit code {exit_code}'}")
    if not lines:
        return ToolResult(True, f"no matches for {args.pattern!r} in {args.path}")
    prefix = workdir.rstrip("/") + "/"
    lines = [ln[len(prefix):] if ln.startswith(prefix) else ln for ln in lines]
    more = len(lines) > SEARCH_MAX_MATCHES
    body = "\n".join(lines[:SEARCH_MAX_MATCHES])
    if more:
        body += f"\n[more than {SEARCH_MAX_MATCHES} matches; narrow the pattern or path]"
    return ToolResult(True, clip(body, TOOL_OUTPUT_CHARS))


class Files(Toolset):
    name = "file"
    tools = (ReadFileTool(), WriteFileTool(), PatchTool(), SearchFilesTool())
