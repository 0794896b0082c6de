"""Background processes: `terminal` with `background: true` starts one, `process` manages it.

Both answer as the Hermes Agent's do (the same keys, in its order: a poll's `output_preview` and
`uptime_seconds`, a wait's `status` of `exited` or `timeout`, a kill's `completion_reason`...).

Everything happens in the prompt's sandbox, by shell commands: each process gets a directory in
the sandbox's scratch space holding its output (`out`, stdout and stderr together), its exit code
(`exit`, written when it ends) and a FIFO for its input (`in`), held open by a small `sleep` so
the program sees no end of input until `close`. The program runs in a session of its own
(`setsid`, where the sandbox has it), so `kill` ends what it started too. They are the prompt's
processes like any other: ended before a check runs and with the sandbox.
"""

from __future__ import annotations

import secrets
import shlex
import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..util import clip
from .base import TERMINAL_OUTPUT_CHARS, ToolContext, ToolError, ToolResult, json_result

MAX_PROCESSES = 64  # per prompt
TAIL_CHARS = 2_000  # of output, in a start, a wait that ended or a kill
PREVIEW_CHARS = 1_000  # of output, in a poll or a wait that did not end
LISTED_CHARS = 200  # of output and of the command, in a list
WAIT_CAP = 180.0  # seconds one `wait` may take
LOG_LINES = 200  # lines one `log` gives by default

# `$d` is the process's directory; `$HB_COMMAND` the model's command, run with `eval` (as the
# terminal runs it) in the directory the terminal is in.
_START = r'''d={dir}
mkdir -p "$d" && mkfifo "$d/in" || exit 97
cd -- {cwd} 2>/dev/null || cd -- {workdir}
( exec 3>"$d/in"; exec sleep 2147483647 ) </dev/null >/dev/null 2>&1 &
echo $! > "$d/holder"
s=; command -v setsid >/dev/null 2>&1 && s=setsid
$s {shell} -c '( eval "$HB_COMMAND" ) <"$0/in" >"$0/out" 2>&1; echo $? >"$0/e"; mv "$0/e" "$0/exit"' "$d" </dev/null >/dev/null 2>&1 &
echo $! > "$d/pid"; echo "$s" > "$d/group"
i=0; while [ ! -f "$d/exit" ] && [ $i -lt 5 ]; do sleep 0.2 2>/dev/null || sleep 1; i=$((i+1)); done
'''

# `d`, `pid`, `g` (set: it leads a session of its own) and `alive`: a process of its group (or it)
# that is not a zombie (one reaped by no one has ended), read from /proc with no program started.
_PRELUDE = r'''d={dir}; pid=$(cat "$d/pid" 2>/dev/null); g=$(cat "$d/group" 2>/dev/null)
alive() {{ [ -n "$pid" ] || return 1
  for f in /proc/[0-9]*/stat; do read -r l < "$f" 2>/dev/null || continue; set -- ${{l##*) }}
    if [ -n "$g" ]; then [ "$3" = "$pid" ]; else [ "$f" = "/proc/$pid/stat" ]; fi && [ "$1" != Z ] && return 0
  done; return 1; }}
'''
# Prints `<status> <exit code or ->` on a line of its own.
_REPORT = r'''if [ -f "$d/exit" ]; then printf 'exited %s\n' "$(cat "$d/exit")"
elif alive; then printf 'running -\n'
else printf 'exited -\n'; fi
'''


def _status(where: str) -> str:
    return _PRELUDE.format(dir=shlex.quote(where)) + _REPORT


_WAIT = r'''end=$(( $(date +%s) + {seconds} ))
while [ ! -f "$d/exit" ] && alive && [ "$(date +%s)" -lt "$end" ]; do sleep 0.2 2>/dev/null || sleep 1; done
'''

# the whole group where it has one (a `kill -- -pid` is refused by dash: no `--`)
_KILL = r'''t=$pid; [ -n "$g" ] && t=-$pid
if alive; then kill -TERM "$t" 2>/dev/null
  i=0; while alive && [ $i -lt 10 ]; do sleep 0.2 2>/dev/null || sleep 1; i=$((i+1)); done
  alive && kill -KILL "$t" 2>/dev/null; i=0; while alive && [ $i -lt 10 ]; do sleep 0.2 2>/dev/null || sleep 1; i=$((i+1)); done
fi
kill "$(cat "$d/holder" 2>/dev/null)" 2>/dev/null; true
'''


class ProcessArgs(BaseModel):
    action: Literal["list", "poll", "log", "wait", "kill", "write", "submit", "close"] = Field(
        description="list: every background process; poll: its status and latest output; log: its output "
                    "by lines; wait: until it ends or the timeout; kill: end it; write: send data to its "
                    "input; submit: send data and a newline; close: end its input.")
    session_id: str | None = Field(None, description="The process, as `terminal` named it (proc_...). Not for list.")
    data: str | None = Field(None, description="What write or submit sends.")
    timeout: int | None = Field(None, description=f"Seconds wait may take (at most {WAIT_CAP:g}).",
                                json_schema_extra={"minimum": 1})
    offset: int | None = Field(None, ge=0, description="log: the first line to give, counted from 0 (default: the last lines).")
    limit: int | None = Field(None, description=f"log: how many lines (default {LOG_LINES}).",
                              json_schema_extra={"minimum": 1})


def _procs(ctx: ToolContext) -> dict[str, dict[str, Any]]:
    return ctx.state.setdefault("processes", {})


async def start_background(command: str, ctx: ToolContext, workdir: str | None = None) -> ToolResult:
    """`terminal` with `background: true`: start the command, answer with its id at once (or with
    its result, if it ends within a second)."""
    sandbox = await ctx.get_sandbox()
    if not getattr(sandbox, "keeps_processes", True):
        raise ToolError("this sandbox ends every process when its command returns: background processes "
                        "cannot run here; run the command in the foreground")
    procs = _procs(ctx)
    if len(procs) >= MAX_PROCESSES:
        raise ToolError(f"at most {MAX_PROCESSES} background processes may be started in one task")
    sid = f"proc_{secrets.token_hex(6)}"
    where = f"{getattr(sandbox, 'scratch', '/tmp')}/processes/{sid}"
    cwd = workdir or ctx.state.get("cwd", sandbox.workdir)
    script = _START.format(dir=shlex.quote(where), cwd=shlex.quote(cwd),
                           workdir=shlex.quote(sandbox.workdir), shell=shlex.quote(getattr(sandbox, "shell", "sh")))
    script += _status(where) + f'cat "$d/pid"; tail -c {TAIL_CHARS} "$d/out" 2>/dev/null'
    res = await sandbox.exec(script, language="shell", timeout=30, env={"HB_COMMAND": command})
    if res.exit_code != 0:
        raise ToolError(f"could not start the process: {(res.stderr or res.stdout).strip()[-500:]}")
    status, code, pid, output = _parse(res.stdout, with_number=True)
    procs[sid] = {"dir": where, "command": command, "pid": pid, "cwd": cwd, "started": time.time()}
    if status == "exited":  # over already: say how it ended
        return json_result(True, {"output": output, "session_id": sid, "pid": pid, "exit_code": code, "error": None,
                                  "status": "exited"})
    return json_result(True, {"output": "started in the background", "session_id": sid, "pid": pid, "exit_code": 0,
                              "error": None})


def _parse(stdout: str, with_number: bool = False) -> tuple[str, int | None, int | None, str]:
    head, _, rest = stdout.partition("\n")
    status, _, code = head.partition(" ")
    pid = None
    if with_number:
        line, _, rest = rest.partition("\n")
        pid = int(line) if line.strip().isdigit() else None
    return status, int(code) if code.strip().lstrip("-").isdigit() else None, pid, rest


def _ending(status: str, code: int | None) -> dict[str, Any]:
    """How an ended process ended: its code, and why (`lost`: it is gone, its code unknown)."""
    return {"exit_code": code, "completion_reason": "exited" if code is not None else "lost",
            "termination_source": ""}


class ProcessTool:
    name = "process"
    toolset = "terminal"
    description = (
        "Manage the processes you started with terminal(background=true): list them, poll one for its "
        "status and latest output, read its output by lines, wait for it to end, kill it, or send it input. "
        "They end when the task ends."
    )
    Args = ProcessArgs

    async def run(self, args: ProcessArgs, ctx: ToolContext) -> ToolResult:
        procs = _procs(ctx)
        sandbox = await ctx.get_sandbox()
        if args.action == "list":
            return json_result(True, {"processes": [await self._listed(sid, p, sandbox) for sid, p in procs.items()]})
        if not args.session_id:
            raise ToolError(f"{args.action} needs a session_id (see process action=list)")
        p = procs.get(args.session_id)
        if p is None:
            return json_result(False, {"status": "not_found",
                                       "error": f"no background process {args.session_id!r} in this task"})
        prelude = _PRELUDE.format(dir=shlex.quote(p["dir"]))
        if args.action in ("poll", "wait", "kill"):
            return await self._watch(args, p, prelude, sandbox, ctx)
        if args.action == "log":
            return await self._log(args, p, prelude, sandbox)
        # write, submit, close: the process's input
        if args.action == "close":
            script = prelude + _REPORT + '[ -f "$d/exit" ] || alive || exit 3; kill "$(cat "$d/holder" 2>/dev/null)" 2>/dev/null; true'
            res = await sandbox.exec(script, language="shell", timeout=30)
            if res.exit_code == 3:
                return json_result(False, {"status": "already_exited", "error": "the process has ended"})
            return json_result(True, {"status": "ok", "message": "input closed"})
        if args.data is None:
            raise ToolError(f"{args.action} needs data")
        data = args.data + ("\n" if args.action == "submit" else "")
        script = prelude + _REPORT + '{ [ -f "$d/exit" ] || ! alive; } && exit 3; printf %s "$HB_DATA" > "$d/in"'
        res = await sandbox.exec(script, language="shell", timeout=10, env={"HB_DATA": data})
        if res.exit_code == 3:
            return json_result(False, {"status": "already_exited", "error": "the process has ended"})
        if res.timed_out or res.exit_code != 0:
            return json_result(False, {"status": "error", "error": "the process does not read its input"})
        return json_result(True, {"status": "ok", "bytes_written": len(data.encode())})

    @staticmethod
    async def _listed(sid: str, p: dict[str, Any], sandbox: Any) -> dict[str, Any]:
        res = await sandbox.exec(_status(p["dir"]) + f'tail -c {LISTED_CHARS} "$d/out" 2>/dev/null', language="shell",
                                 timeout=30)
        status, code, _, output = _parse(res.stdout)
        entry = {"session_id": sid, "command": p["command"][:LISTED_CHARS], "cwd": p["cwd"], "pid": p["pid"],
                 "started_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(p["started"])),
                 "uptime_seconds": int(time.time() - p["started"]), "status": status or "unknown",
                 "output_preview": output}
        if status == "exited":
            entry["exit_code"] = code
        return entry

    @staticmethod
    async def _watch(args: ProcessArgs, p: dict[str, Any], prelude: str, sandbox: Any, ctx: ToolContext) -> ToolResult:
        script = prelude
        wait = min(float(args.timeout or WAIT_CAP), WAIT_CAP, ctx.command_timeout)
        if args.action == "wait":
            script += _WAIT.format(seconds=int(wait))
        if args.action == "kill":  # was it over before the kill?
            script += _REPORT
            script += _KILL
        script += _REPORT + f'tail -c {TAIL_CHARS} "$d/out" 2>/dev/null'
        res = await sandbox.exec(script, language="shell", timeout=WAIT_CAP + 30)
        if res.timed_out:
            raise ToolError(f"the sandbox did not answer {args.action} in time")
        before = None
        out = res.stdout
        if args.action == "kill":
            before, _, out = out.partition("\n")
        status, code, _, output = _parse(out)
        command = p["command"]
        if args.action == "poll":
            payload: dict[str, Any] = {"session_id": args.session_id, "command": command, "status": status,
                                       "pid": p["pid"], "uptime_seconds": int(time.time() - p["started"]),
                                       "output_preview": output[-PREVIEW_CHARS:]}
            if status == "exited":
                payload.update(_ending(status, code))
            return json_result(True, payload)
        if args.action == "wait":
            if status == "running":
                return json_result(True, {"status": "timeout", "command": command, "output": output[-PREVIEW_CHARS:],
                                          "timeout_note": f"waited {int(wait)} s: the process is still running"})
            return json_result(True, {"status": "exited", "command": command, **_ending(status, code), "output": output})
        if before is not None and not before.startswith("running"):
            was, _, was_code = before.partition(" ")
            code_before = int(was_code) if was_code.strip().lstrip("-").isdigit() else None
            return json_result(True, {"status": "already_exited", "command": command,
                                      **_ending(was, code_before), "output": output})
        if status == "running":
            return json_result(False, {"status": "error", "error": "it did not end when killed"})
        return json_result(True, {"status": "killed", "session_id": args.session_id, "completion_reason": "killed",
                                  "termination_source": "process.kill", "output": output})

    @staticmethod
    async def _log(args: ProcessArgs, p: dict[str, Any], prelude: str, sandbox: Any) -> ToolResult:
        """Lines `offset` on (from 0), `limit` of them; no offset (or 0): the last `limit` lines."""
        limit = args.limit if args.limit and args.limit > 0 else LOG_LINES
        pick = f'tail -n +{args.offset + 1} "$d/out" | head -n {limit}' if args.offset \
            else f'tail -n {limit} "$d/out"'
        # the line count counts a last line without its newline, as Python's splitlines does
        script = prelude + _REPORT + f'awk \'END {{ print NR }}\' "$d/out" 2>/dev/null || echo 0\n{pick} 2>/dev/null'
        res = await sandbox.exec(script, language="shell", timeout=30)
        status, _, total, text = _parse(res.stdout, with_number=True)
        selected = text.splitlines()
        return json_result(True, {"session_id": args.session_id, "command": p["command"], "status": status,
                                  "output": clip("\n".join(selected), TERMINAL_OUTPUT_CHARS), "total_lines": total or 0,
                                  "showing": f"{len(selected)} lines"})
