"""`terminal`: run a shell command in the prompt's sandbox; the working directory carries over."""

from __future__ import annotations

import json
import secrets
import shlex

from pydantic import BaseModel, Field

from ..util import clip
from .base import TERMINAL_OUTPUT_CHARS, ToolContext, ToolResult
from .process import ProcessTool, start_background
from .toolset import Toolset

# Runs the command with `eval` (so its syntax cannot break the wrapper), then reports the final
# directory after a marker line that is stripped from the output.
_WRAPPER = 'cd -- {cwd} 2>/dev/null || cd -- {workdir}\neval "$HB_COMMAND"\n__hb_rc=$?\nprintf "\\n{marker}%s\\n" "$PWD"\nexit $__hb_rc\n'


class TerminalArgs(BaseModel):
    command: str = Field(description="Shell command to run (bash). Runs in the current working directory, which persists between calls.")
    timeout: float | None = Field(None, gt=0, description="Seconds before the command is killed (default 180).")
    background: bool = Field(False, description="Start it in the background and answer at once with a session_id "
                                                "for the process tool (for servers and long jobs).")


class TerminalTool:
    name = "terminal"
    toolset = "terminal"
    description = (
        "Run a shell command in your sandbox and get its exit code, stdout and stderr. "
        "A `cd` carries over to later calls; environment variables do not. "
        "Commands get no stdin: do not start interactive programs."
    )
    Args = TerminalArgs

    async def run(self, args: TerminalArgs, ctx: ToolContext) -> ToolResult:
        if args.background:
            return await start_background(args.command, ctx)
        sandbox = await ctx.get_sandbox()
        marker = ctx.state.setdefault("cwd_marker", f"__HB_CWD_{secrets.token_hex(6)}__")
        cwd = ctx.state.get("cwd", sandbox.workdir)
        script = _WRAPPER.format(cwd=shlex.quote(cwd), workdir=shlex.quote(sandbox.workdir), marker=marker)
        timeout = ctx.timeout_for(args.timeout)
        res = await sandbox.exec(script, language="shell", timeout=timeout, env={"HB_COMMAND": args.command})
        stdout = res.stdout
        cut = stdout.rfind(f"\n{marker}")
        if cut >= 0:
            new_cwd = stdout[cut + len(marker) + 1 :].strip()
            if new_cwd:
                ctx.state["cwd"] = new_cwd
            stdout = stdout[:cut]
        budget = TERMINAL_OUTPUT_CHARS
        err = clip(res.stderr, budget // 5)
        out = clip(stdout, budget - len(err))
        payload = {"exit_code": res.exit_code, "stdout": out, "stderr": err}
        if res.timed_out:
            payload["error"] = f"command timed out after {timeout:g} s and was killed"
        return ToolResult(not res.timed_out, json.dumps(payload, ensure_ascii=False), structured=True)


class Terminal(Toolset):
    name = "terminal"
    tools = (TerminalTool(), ProcessTool())
