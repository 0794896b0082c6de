"""File tools: read, write, patch and search files inside the sandbox's work directory only.

Each answers JSON in the Hermes Agent's shapes (its keys, in its order, meaning what they mean
there), with paths as the sandbox sees them: `read_file` gives `N|line` numbered lines with
`total_lines`, `file_size`, `truncated` (and an `unchanged` stub when the same region of an
unchanged file is read again); `write_file` and `patch` give `resolved_path`, `files_modified` and a
syntax check of what they wrote (`lint`); `search_files` gives `total_count` and `matches` (or
`files`, or `counts`). Not modelled (docs/output.md says why): fuzzy and V4A patches, linters that
need a toolchain in the sandbox, the loop guards that block a repeated search.
"""

from __future__ import annotations

import ast
import difflib
import json
import posixpath
import re
import shlex
import tomllib
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..util import clip
from .base import TOOL_OUTPUT_CHARS, ToolContext, ToolError, ToolResult, confine, json_result, tool_error
from .toolset import Toolset

PATCH_MAX_BYTES = 8 * 1024 * 1024
MAX_LINE_CHARS = 2000  # of one line in a read, past which it is cut
MAX_READ_LINES = 2000
MATCH_CHARS = 500  # of one matched line in a search
DENSE_MATCHES = 5  # from this many matches on, a search lists them grouped by file, as text
LARGE_FILE_BYTES = 512_000
SEARCH_FETCH_EXTRA = 200  # lines fetched past a page when context lines are asked for
READ_REPEATS_BLOCKED = 3  # the read of an unchanged region that is refused, not answered with the stub

BINARY_EXTENSIONS = frozenset(
    ".png .jpg .jpeg .gif .bmp .ico .webp .tif .tiff .psd .ai .eps .sketch .fig .xd .blend .3ds .max "
    ".mp4 .mov .avi .mkv .webm .wmv .flv .m4v .mpeg .mpg .mp3 .wav .ogg .flac .aac .m4a .wma .aiff .opus "
    ".zip .tar .gz .tgz .bz2 .xz .z .7z .rar .iso .exe .dll .so .dylib .bin .o .a .obj .lib .app .msi .deb .rpm "
    ".doc .docx .xls .xlsx .ppt .pptx .odt .ods .odp .ttf .otf .woff .woff2 .eot .pyc .pyo .class .jar .war "
    ".ear .node .wasm .rlib .sqlite .sqlite3 .db .mdb .idx .swf .fla .lockb .dat .data".split())
STRICT_FORMATS = frozenset({".json", ".yaml", ".yml", ".toml"})  # content that does not parse is not written


# --- what a write leaves: a syntax check ----------------------------------------------------------
def _parse_error(ext: str, content: str) -> str | None:
    """Why `content` is not valid for its extension (None: it is); KeyError: no check for it here."""
    try:
        if ext == ".py":
            ast.parse(content)
        elif ext == ".json":
            json.loads(content)
        elif ext == ".toml":
            tomllib.loads(content)
        elif ext in (".yaml", ".yml"):
            import yaml  # noqa: PLC0415 (optional: without PyYAML, YAML goes unchecked)

            for _ in yaml.parse(content):
                pass
        else:
            raise KeyError(ext)
    except SyntaxError as exc:
        where = f" (line {exc.lineno}, column {exc.offset})" if exc.lineno else ""
        return f"{type(exc).__name__}: {exc.msg}{where}"
    except json.JSONDecodeError as exc:
        return f"JSONDecodeError: {exc.msg} (line {exc.lineno}, column {exc.colno})"
    except (KeyError, ImportError):
        raise
    except Exception as exc:  # a parser's own error class: tomllib's, yaml's, a recursion limit
        return f"{type(exc).__name__}: {exc}"
    return None


def lint(path: str, content: str) -> dict[str, Any]:
    """`{"status": "ok" | "error", "output"}`, or `{"status": "skipped", "message"}` for a file
    this runner has no check for."""
    ext = posixpath.splitext(path)[1].lower()
    try:
        problem = _parse_error(ext, content)
    except KeyError:
        return {"status": "skipped", "message": f"no syntax check for {ext or 'extensionless'} files"}
    except ImportError:
        return {"status": "skipped", "message": f"no syntax check for {ext} files here (PyYAML is not installed)"}
    return {"status": "error", "output": problem} if problem else {"status": "ok", "output": ""}


# --- read_file ------------------------------------------------------------------------------------
class ReadFileArgs(BaseModel):
    path: str = Field(description="The file, relative to the work directory (or absolute inside it).")
    offset: int = Field(1, description="The first line to read, counted from 1.", json_schema_extra={"minimum": 1})
    limit: int = Field(500, description=f"How many lines at most (default 500, at most {MAX_READ_LINES}).",
                       json_schema_extra={"maximum": MAX_READ_LINES})


def numbered(text: str, first: int) -> str:
    """`N|line` for each line of `text` (split at every newline, as the Hermes Agent splits it)."""
    out = []
    for n, line in enumerate(text.split("\n"), start=first):
        out.append(f"{n}|{line[:MAX_LINE_CHARS]}... [line cut]" if len(line) > MAX_LINE_CHARS else f"{n}|{line}")
    return "\n".join(out)


def _within_budget(content: str, budget: int) -> tuple[str, int]:
    """The whole lines of numbered `content` that fit `budget` characters (at least part of the first)."""
    kept: list[str] = []
    size = 0
    for line in content.split("\n"):
        size += len(line) + (1 if kept else 0)
        if size > budget:
            break
        kept.append(line)
    return ("\n".join(kept), len(kept)) if kept else (content.split("\n", 1)[0][:budget], 1)


def _similar(wanted: str, listing: str, directory: str) -> list[str]:
    """Up to five names of `listing` that look like the file that was not found."""
    name = posixpath.basename(wanted).lower()
    stem, ext = posixpath.splitext(name)
    ranked = []
    for entry in filter(None, listing.split("\n")):
        low = entry.lower()
        if low == name:
            rank = 5
        elif posixpath.splitext(low)[0] == stem:
            rank = 4
        elif low.startswith(name) or name.startswith(low):
            rank = 3
        elif name in low or (low in name and len(low) > 2):
            rank = 2
        elif ext and posixpath.splitext(low)[1] == ext:
            rank = 1
        else:
            continue
        ranked.append((-rank, posixpath.join(directory, entry)))
    return [path for _, path in sorted(ranked, key=lambda r: r[0])[:5]]


class ReadFileTool:
    name = "read_file"
    toolset = "file"
    description = (
        "Read a text file, its lines numbered as `N|line`; use offset and limit to page through a long one "
        "(a read past about 100,000 characters stops at a whole line and gives next_offset). Prefer it to "
        "cat, head or tail in the terminal. It does not read images or other binary files."
    )
    Args = ReadFileArgs

    async def run(self, args: ReadFileArgs, ctx: ToolContext) -> ToolResult:
        offset, limit = max(1, args.offset), max(1, min(args.limit, MAX_READ_LINES))
        ext = posixpath.splitext(args.path)[1].lower()
        if ext in BINARY_EXTENSIONS:
            return tool_error(f"{args.path!r} is a binary file ({ext}): read images with vision_analyze, "
                              "other binary files with the terminal")
        sandbox, path = await confine(ctx, args.path)
        q, last = shlex.quote(path), offset + limit - 1
        parent = shlex.quote(posixpath.dirname(path))
        # one round trip: what it is, its size, its checksum (an unchanged read), its newline count, the slice
        script = (
            f"if [ ! -e {q} ]; then ls -1 {parent} 2>/dev/null | head -n 50; exit 2; fi; "
            f"[ -d {q} ] && exit 4; [ -f {q} ] || exit 5; "  # reading a FIFO would block
            f"wc -c < {q}; "
            f"if [ -s {q} ] && ! grep -qI . {q}; then exit 3; fi; "
            # BusyBox images may lack cksum: md5sum then; neither, `?` (never taken as unchanged)
            f"c=$({{ cksum || md5sum; }} < {q} 2>/dev/null | head -n 1); echo \"${{c:-?}}\"; "
            f"wc -l < {q}; sed -n '{offset},{last}p' {q}"
        )
        res = await sandbox.exec(script, language="shell", timeout=60, output_limit=TOOL_OUTPUT_CHARS * 4)
        if res.exit_code in (2, 4, 5):
            why = {2: f"file not found: {args.path}", 4: f"{args.path} is a directory, not a file",
                   5: f"{args.path} is not a regular file"}[res.exit_code]
            missing: dict[str, Any] = {"content": "", "total_lines": 0, "file_size": 0, "truncated": False,
                                       "is_binary": False, "is_image": False, "error": why}
            if res.exit_code == 2 and (similar := _similar(args.path, res.stdout, posixpath.dirname(args.path) or ".")):
                missing["similar_files"] = similar
            return json_result(False, missing)
        size_line, _, rest = res.stdout.partition("\n")
        size = int(size_line.strip() or 0)
        if res.exit_code == 3:
            return json_result(False, {"content": "", "total_lines": 0, "file_size": size, "truncated": False,
                                       "is_binary": True, "is_image": False,
                                       "error": "a binary file: it cannot be shown as text (use the terminal)"})
        if res.exit_code != 0:
            raise ToolError(f"cannot read {args.path}: {res.stderr.strip() or f'exit code {res.exit_code}'}")
        checksum, _, rest = rest.partition("\n")
        lines_line, _, text = rest.partition("\n")
        if (repeat := _repeated_read(ctx, (path, offset, limit), checksum, args.path)) is not None:
            return repeat
        total = int(lines_line.strip() or 0)
        content = numbered(text, offset)
        result: dict[str, Any] = {"content": content, "total_lines": total, "file_size": size,
                  "truncated": total > last}
        if total > last:
            result["hint"] = f"more follows: read on with offset={last + 1} (this was lines {offset}-{last} of {total})"
        result.update(is_binary=False, is_image=False)
        if len(content) > TOOL_OUTPUT_CHARS:
            kept, count = _within_budget(content, TOOL_OUTPUT_CHARS)
            result.update(content=kept, truncated=True, truncated_by="bytes", next_offset=offset + count)
            result["hint"] = (f"cut at {TOOL_OUTPUT_CHARS:,} characters after {count} line(s) (lines {offset}-"
                              f"{offset + count - 1} of {total}): read on with offset={offset + count}")
        if size > LARGE_FILE_BYTES and limit > 200 and result["truncated"]:
            result["_hint"] = (f"a large file ({size:,} bytes): read just the part you need, with offset and limit, "
                               "to keep the conversation short")
        return json_result(True, result)


def _repeated_read(ctx: ToolContext, key: tuple[str, int, int], checksum: str, path: str) -> ToolResult | None:
    """The answer to a read of the same region of a file unchanged since the prompt last read it (None:
    read it): a stub the first time, then a refusal, so the conversation does not carry it twice."""
    reads: dict[tuple[str, int, int], list[Any]] = ctx.state.setdefault("reads", {})
    seen = reads.get(key)
    if seen is None or seen[0] != checksum or checksum == "?":
        reads[key] = [checksum, 0]
        return None
    seen[1] += 1
    if seen[1] + 1 >= READ_REPEATS_BLOCKED:
        return tool_error(f"this region of the file has been read {seen[1] + 1} times and has not changed: use the "
                          "earlier read_file result in this conversation and go on with the task",
                          path=path, already_read=seen[1] + 1)
    return json_result(True, {"status": "unchanged", "message": "the file has not changed since it was last read: "
                                                                "the earlier read_file result still holds",
                              "path": path, "dedup": True, "content_returned": False})


# --- write_file, patch ----------------------------------------------------------------------------
class WriteFileArgs(BaseModel):
    path: str = Field(description="The file to write, relative to the work directory (created, or overwritten).")
    content: str = Field(description="The whole new content of the file.")


class WriteFileTool:
    name = "write_file"
    toolset = "file"
    description = (
        "Write a file with the given content, replacing all it held; parent directories are created. Use "
        "patch for a targeted edit. Python, JSON, YAML and TOML are syntax-checked after the write (JSON, "
        "YAML and TOML that do not parse are not written)."
    )
    Args = WriteFileArgs

    async def run(self, args: WriteFileArgs, ctx: ToolContext) -> ToolResult:
        sandbox, path = await confine(ctx, args.path)
        ext = posixpath.splitext(path)[1].lower()
        if ext in STRICT_FORMATS and (problem := lint(path, args.content)).get("status") == "error":
            return json_result(False, {"bytes_written": 0, "dirs_created": False,
                                       "error": f"not written: the content is not valid {ext} ({problem['output']}); "
                                                f"{args.path} is as it was", "resolved_path": path})
        data = args.content.encode()
        await sandbox.write_file(path, data)
        return json_result(True, {"bytes_written": len(data), "dirs_created": True, "lint": lint(path, args.content),
                                  "resolved_path": path, "files_modified": [path]})


class PatchArgs(BaseModel):
    mode: Literal["replace"] = Field("replace", description="replace: find old_string and put new_string in its place.")
    path: str = Field(description="The file to edit, relative to the work directory.")
    old_string: str = Field(description="The exact text to replace; it must occur once, unless replace_all.")
    new_string: str = Field(description="What replaces it ('' deletes it).")
    replace_all: bool = Field(False, description="Replace every occurrence, not just a unique one.")


class PatchTool:
    name = "patch"
    toolset = "file"
    description = (
        "Edit a file by replacing an exact, unique occurrence of old_string with new_string (or every one, "
        "with replace_all). Answers a unified diff; the result is syntax-checked as write_file's is. Prefer it "
        "to sed or awk in the terminal."
    )
    Args = PatchArgs

    async def run(self, args: PatchArgs, ctx: ToolContext) -> ToolResult:
        if not args.old_string:
            raise ToolError("old_string is empty; use write_file to create a file")
        sandbox, path = await confine(ctx, args.path)
        try:
            data = await sandbox.read_file(path, PATCH_MAX_BYTES + 1)
        except FileNotFoundError as exc:  # a shell sandbox says a FIFO or directory is none too: say which
            why = str(exc) if str(exc) in ("is a directory", "not a regular file") else "no such file"
            return json_result(False, {"success": False, "error": f"cannot read {path}: {why}"})
        if len(data) > PATCH_MAX_BYTES:
            return json_result(False, {"success": False, "error": f"{path} is larger than {PATCH_MAX_BYTES} bytes; "
                                                                  "edit it with the terminal"})
        text = data.decode("utf-8", errors="surrogateescape")
        count = text.count(args.old_string)
        if count == 0:
            return json_result(False, {"success": False, "error": f"old_string was not found in {args.path}",
                                       "_hint": "read the file again to see what it holds now, or find the text "
                                                "with search_files"})
        if count > 1 and not args.replace_all:
            return json_result(False, {"success": False, "error": f"old_string occurs {count} times in {args.path}: "
                                                                  "include more of the text around it to make it "
                                                                  "unique, or set replace_all"})
        patched = text.replace(args.old_string, args.new_string, -1 if args.replace_all else 1)
        await sandbox.write_file(path, patched.encode("utf-8", errors="surrogateescape"))
        diff = "".join(difflib.unified_diff(text.splitlines(keepends=True), patched.splitlines(keepends=True),
                                            fromfile=f"a/{path}", tofile=f"b/{path}"))
        result: dict[str, Any] = {"success": True}
        if diff:
            result["diff"] = diff
        result.update(files_modified=[path], lint=lint(path, patched), resolved_path=path)
        return json_result(True, result)


# --- search_files ---------------------------------------------------------------------------------
class SearchFilesArgs(BaseModel):
    pattern: str = Field(description="A regular expression (extended) to find in file contents; with target=files, "
                                     "a file name pattern such as '*.py'.")
    target: Literal["content", "files"] = Field("content", description="content: search inside files; files: "
                                                                       "find files by name (newest first).")
    path: str = Field(".", description="The directory or file to search, relative to the work directory.")
    file_glob: str | None = Field(None, description="Search only files whose names match this (e.g. '*.py').")
    limit: int = Field(50, description="At most this many results (default 50).")
    offset: int = Field(0, description="Skip this many results first (to page).")
    output_mode: Literal["content", "files_only", "count"] = Field(
        "content", description="content: the matching lines with their numbers; files_only: the files that "
                               "match; count: how many matches each file holds.")
    context: int = Field(0, description="Lines of context around each match (content only).")


_MATCH = re.compile(r"^(.*?):(\d+):(.*)$", re.S)
_CONTEXT = re.compile(r"^(.*?)-(\d+)-(.*)$", re.S)


class SearchFilesTool:
    name = "search_files"
    toolset = "file"
    description = (
        "Search file contents with a regular expression (output_mode: content, files_only or count), or find "
        "files by name with target=files. Prefer it to grep, find or ls in the terminal. Hidden directories "
        "(.git) are skipped."
    )
    Args = SearchFilesArgs

    async def run(self, args: SearchFilesArgs, ctx: ToolContext) -> ToolResult:
        if not args.pattern:
            raise ToolError("pattern is empty")
        offset, limit = max(0, args.offset), max(1, args.limit)
        sandbox, _ = await confine(ctx, args.path)
        where = shlex.quote(args.path)  # as given, from the work directory: its matches are named so
        exists = await sandbox.exec(f"cd -- {shlex.quote(sandbox.workdir)} && [ -e {where} ]", language="shell",
                                    timeout=30)
        if exists.exit_code != 0:
            return json_result(False, {"total_count": 0, "error": f"no such path: {args.path}"})
        if args.target == "files":
            return await self._files(args, where, offset, limit, sandbox)
        return await self._content(args, where, offset, limit, sandbox)

    @staticmethod
    async def _files(args: SearchFilesArgs, where: str, offset: int, limit: int, sandbox: Any) -> ToolResult:
        name = args.pattern.rsplit("/", 1)[-1]
        # newest first; a `stat` that cannot say when (BusyBox has it) leaves them as found
        script = (f"cd -- {shlex.quote(sandbox.workdir)} && find {where} -type f -name {shlex.quote(name)} "
                  "-not -path '*/.*' 2>/dev/null | { while IFS= read -r f; do "
                  "printf '%s %s\\n' \"$(stat -c %Y \"$f\" 2>/dev/null || echo 0)\" \"$f\"; done; } | sort -rn")
        res = await sandbox.exec(script, language="shell", timeout=60)
        found = [line.split(" ", 1)[1] for line in res.stdout.split("\n") if " " in line]
        return json_result(True, {"total_count": len(found), "files": found[offset:offset + limit]}
                           if found else {"total_count": 0})

    @staticmethod
    async def _content(args: SearchFilesArgs, where: str, offset: int, limit: int, sandbox: Any) -> ToolResult:
        flags = []
        if args.context > 0 and args.output_mode == "content":
            flags += ["-C", str(args.context)]
        flags += {"files_only": ["-l"], "count": ["-c"]}.get(args.output_mode, [])
        # GNU grep skips binary files and hidden directories (.git; never the root, `.`, itself) and
        # filters by file name; BusyBox's (Alpine) knows none of these options
        gnu = ["-rnHIE", "--exclude-dir=.[!.]*", *(["--include", args.file_glob] if args.file_glob else [])]
        if args.file_glob:
            plain = "echo 'grep: file_glob needs GNU grep, which this sandbox lacks'; exit 2"
        else:
            plain = "set -- -rnHE"
        fetch = offset + limit + (SEARCH_FETCH_EXTRA if args.context > 0 else 0)
        script = (f"cd -- {shlex.quote(sandbox.workdir)} && "
                  "if grep -rnHIE --exclude-dir=.git -e . /dev/null >/dev/null 2>&1 || [ $? -eq 1 ]; "
                  f"then set -- {' '.join(map(shlex.quote, gnu))}; else {plain}; fi; "
                  f"grep \"$@\" {' '.join(map(shlex.quote, flags))} -e {shlex.quote(args.pattern)} -- {where} 2>&1 "
                  f"| head -n {fetch}")
        res = await sandbox.exec(script, language="shell", timeout=60, output_limit=TOOL_OUTPUT_CHARS * 4)
        lines = res.stdout.rstrip("\n").split("\n")  # not splitlines(): a matched line may hold U+2028
        problems = [ln for ln in lines if ln.startswith("grep: ")]
        lines = [ln for ln in lines if ln and not ln.startswith("grep: ")]
        if problems and not lines:
            return json_result(False, {"total_count": 0, "error": f"the search failed: {problems[0][6:]}"})
        if args.output_mode == "files_only":
            result: dict[str, Any] = {"total_count": len(lines)}
            if lines:
                result["files"] = lines[offset:offset + limit]
            return json_result(True, result)
        if args.output_mode == "count":
            counts = {p: int(n) for p, _, n in (ln.rpartition(":") for ln in lines) if n.isdigit() and int(n) > 0}
            result = {"total_count": sum(counts.values())}
            if counts:
                result["counts"] = counts
            return json_result(True, result)
        matches = []
        for ln in lines:
            m = _MATCH.match(ln) or (_CONTEXT.match(ln) if args.context > 0 and ln != "--" else None)
            if m:
                matches.append({"path": m.group(1), "line": int(m.group(2)), "content": m.group(3)[:MATCH_CHARS]})
        page = matches[offset:offset + limit]
        result = {"total_count": len(matches)}
        if len(page) >= DENSE_MATCHES:
            result["matches_format"] = "grouped by file: a file's path on a line, then '  <line>: <content>' for each match in it"
            result["matches_text"] = _grouped(page)
        elif page:
            result["matches"] = page
        truncated = len(matches) > offset + limit
        if truncated:
            result["truncated"] = True
        text = json.dumps(result, ensure_ascii=False)
        if truncated:  # as the Hermes Agent adds it: after the JSON, so the record keeps the result as text
            text += (f"\n\n[more matches: read on with offset={offset + limit}, or narrow the pattern or file_glob]")
        return ToolResult(True, clip(text, TOOL_OUTPUT_CHARS), structured=not truncated)


def _grouped(matches: list[dict[str, Any]]) -> str:
    lines, current = [], None
    for m in matches:
        if m["path"] != current:
            lines.append(m["path"])
            current = m["path"]
        lines.append(f"  {m['line']}: {m['content'].rstrip()}")
    return "\n".join(lines)


class Files(Toolset):
    name = "file"
    tools = (ReadFileTool(), WriteFileTool(), PatchTool(), SearchFilesTool())
