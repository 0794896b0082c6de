"""The Flame article's two code tools, on every backend.

`sandbox`: one snippet in the prompt's persistent sandbox (files persist between calls).
`session`: 1-64 independent snippets run in parallel, each in a fresh scratch space, results in
input order. On the Flame backend these map to a Flame sandbox and a Flame session.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, Field

from ..backends.base import SandboxError
from ..util import clip
from .base import TOOL_OUTPUT_CHARS, ToolContext, ToolResult
from .toolset import Toolset

MAX_SNIPPETS = 64


class SandboxArgs(BaseModel):
    code: str = Field(description="Program source to run.")
    language: Literal["python", "shell"] = Field("python", description="python (default) or shell.")
    timeout: float | None = Field(None, gt=0, description="Seconds before the run is killed (default 180).")


class SandboxTool:
    name = "sandbox"
    toolset = "code"
    description = (
        "Run one program in your persistent sandbox. Files (for example under /tmp or the work "
        "directory) remain for later calls; variables do not. Returns stdout on success, or an "
        "error with the exit code, stderr and stdout. pip installs go to /tmp/site-packages, "
        "which is importable in later calls."
    )
    Args = SandboxArgs

    async def run(self, args: SandboxArgs, ctx: ToolContext) -> ToolResult:
        sandbox = await ctx.get_sandbox()
        timeout = ctx.timeout_for(args.timeout)
        res = await sandbox.exec(args.code, language=args.language, timeout=timeout)
        if res.ok:
            return ToolResult(True, clip(res.stdout, TOOL_OUTPUT_CHARS))
        reason = f"timed out after {timeout:g} s" if res.timed_out else f"exit code {res.exit_code}"
        text = f"Error: the program failed ({reason})\nexit_code: {res.exit_code}\nstderr:\n{clip(res.stderr, TOOL_OUTPUT_CHARS // 2)}\nstdout:\n{clip(res.stdout, TOOL_OUTPUT_CHARS // 2)}"
        return ToolResult(False, text)


class SessionArgs(BaseModel):
    codes: list[str] = Field(
        min_length=1, max_length=MAX_SNIPPETS,
        description=f"1-{MAX_SNIPPETS} independent, complete programs. Each runs on its own; none may rely on another's files.",
    )
    language: Literal["python", "shell"] = Field("python", description="python (default) or shell, for every snippet.")
    timeout: float | None = Field(None, gt=0, description="Seconds per snippet before it is killed (default 180).")


class SessionTool:
    name = "session"
    toolset = "code"
    description = (
        "Run several independent programs in parallel, each in a fresh environment. Returns a JSON "
        "array of {exit_code, stdout, stderr}, one per snippet, in input order. A failing snippet "
        "does not affect the others; exit_code -1 means the infrastructure failed to run it."
    )
    Args = SessionArgs

    async def run(self, args: SessionArgs, ctx: ToolContext) -> ToolResult:
        sandbox = await ctx.get_sandbox()
        try:
            results = await sandbox.run_snippets(args.codes, language=args.language, timeout=ctx.timeout_for(args.timeout))
        except SandboxError as exc:  # opening the session or submitting the batch failed: this call fails
            return ToolResult(False, f"Error: the snippets could not be submitted: {exc}")
        per_snippet = max(1000, TOOL_OUTPUT_CHARS // (2 * len(results)))
        payload = [
            {"exit_code": r.exit_code, "stdout": clip(r.stdout, per_snippet), "stderr": clip(r.stderr, per_snippet)}
            for r in results
        ]
        return ToolResult(True, json.dumps(payload, ensure_ascii=False), structured=True)


class Code(Toolset):
    name = "code"
    tools = (SandboxTool(), SessionTool())
