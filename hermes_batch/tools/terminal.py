"""`terminal`: run a shell command in the prompt's sandbox; the working directory carries over.

It answers as the Hermes Agent's terminal does: `{"output", "exit_code", "error"}`, stdout and
stderr merged in the order they were written, escape sequences and surrounding whitespace taken
off, a long output cut in its middle; a command that exceeds its time is killed and answers exit
code 124 with a note at the end of its output; `exit_code_meaning` says when a non-zero code is no
error (grep finding nothing, diff finding differences).
"""

from __future__ import annotations

import re
import secrets
import shlex

from pydantic import BaseModel, Field

from ..util import clip
from .base import TERMINAL_OUTPUT_CHARS, ToolContext, ToolError, ToolResult, json_result
from .process import ProcessTool, start_background
from .toolset import Toolset

# Runs the command with `eval` (so its syntax cannot break the wrapper), its stderr into its stdout
# (one stream, in the order written), then reports the final directory after a marker line that is
# stripped from the output.
_WRAPPER = ('cd -- {cwd} 2>/dev/null || cd -- {workdir}\nexec 2>&1\neval "$HB_COMMAND"\n__hb_rc=$?\n'
            'printf "\\n{marker}%s\\n" "$PWD"\nexit $__hb_rc\n')
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
TIMED_OUT = 124  # the exit code of a command killed at its timeout, as `timeout(1)` reports one

# Exit codes that are an answer, not a failure, of the command a pipeline or list ends with.
_NOT_ERRORS: dict[str, dict[int, str]] = {
    **dict.fromkeys(("grep", "egrep", "fgrep", "rg", "ag", "ack"), {1: "nothing matched (no error)"}),
    **dict.fromkeys(("diff", "colordiff"), {1: "the inputs differ (no error)"}),
    "find": {1: "some directories could not be read (what was found may still be right)"},
    **dict.fromkeys(("test", "["), {1: "the condition is false (no error)"}),
    "curl": {6: "the host name did not resolve", 7: "could not connect to the host",
             22: "the server answered an HTTP error (4xx or 5xx)", 28: "the transfer timed out"},
    "git": {1: "non-zero, which is often normal for git (git diff with changes answers 1)"},
}


class TerminalArgs(BaseModel):
    command: str = Field(description="The shell command (bash) to run in your sandbox.")
    background: bool = Field(False, description="Start it in the background and answer at once with a session_id "
                                                "for the process tool (servers, watchers, long jobs).")
    timeout: int | None = Field(None, description="Seconds before the command is killed (default 180; at most 600 "
                                                  "unless the run allows more).", json_schema_extra={"minimum": 1})
    workdir: str | None = Field(None, description="Directory to run this command in (absolute). Defaults to the "
                                                  "current working directory, which persists between calls.")


class TerminalTool:
    name = "terminal"
    toolset = "terminal"
    description = (
        "Run a shell command in your sandbox and get its output (stdout and stderr together) and exit code. "
        "A `cd` carries over to later calls; environment variables do not. Commands get no stdin: do not "
        "start interactive programs. Use background=true for servers and other long-lived processes."
    )
    Args = TerminalArgs

    async def run(self, args: TerminalArgs, ctx: ToolContext) -> ToolResult:
        if args.background:
            return await start_background(args.command, ctx, args.workdir)
        sandbox = await ctx.get_sandbox()
        marker = ctx.state.setdefault("cwd_marker", f"__HB_CWD_{secrets.token_hex(6)}__")
        cwd = args.workdir or ctx.state.get("cwd", sandbox.workdir)
        if args.workdir and not args.workdir.startswith("/"):
            raise ToolError(f"workdir must be an absolute path, not {args.workdir!r}")
        script = _WRAPPER.format(cwd=shlex.quote(cwd), workdir=shlex.quote(sandbox.workdir), marker=marker)
        timeout = ctx.timeout_for(float(args.timeout) if args.timeout and args.timeout > 0 else None)
        res = await sandbox.exec(script, language="shell", timeout=timeout, env={"HB_COMMAND": args.command})
        output = res.stdout + res.stderr  # the wrapper's own stderr (a failed cd) is all that is left there
        cut = output.rfind(f"\n{marker}")
        if cut >= 0:
            new_cwd = output[cut + len(marker) + 1 :].split("\n", 1)[0].strip()
            if new_cwd:
                ctx.state["cwd"] = new_cwd
            output = output[:cut] + output[cut + len(marker) + 1 + len(new_cwd) + 1 :]
        exit_code = TIMED_OUT if res.timed_out else res.exit_code
        output = clip(_ANSI.sub("", output), TERMINAL_OUTPUT_CHARS, " of the output")
        if res.timed_out:
            output += f"\n[killed: the command ran past its timeout of {timeout:g} s]"
        payload: dict[str, object] = {"output": output.strip(), "exit_code": exit_code, "error": None}
        if meaning := exit_code_meaning(args.command, exit_code):
            payload["exit_code_meaning"] = meaning
        return json_result(not res.timed_out, payload)


def exit_code_meaning(command: str, exit_code: int) -> str | None:
    """What a non-zero exit code means when it is no error, judged by the last command of `command`."""
    if exit_code == 0:
        return None
    last = re.split(r"&&|\|\|?|;", command)[-1].split()  # the command after the last ;, |, && or ||
    program = next((w for w in last if "=" not in w or w.startswith("-")), "")
    return _NOT_ERRORS.get(program.rsplit("/", 1)[-1], {}).get(exit_code)


class Terminal(Toolset):
    name = "terminal"
    tools = (TerminalTool(), ProcessTool())
