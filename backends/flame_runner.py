"""The program every Flame task runs: it runs the model's code and reports exit code, stdout and stderr.

flmexec returns only the stdout of what it runs (no exit code, no stderr, no timeout). So the
backend never sends the model's code to flmexec directly: it sends this runner (as Python), with
the code and its settings embedded, and reads back one marked JSON line. The runner is also the
place that enforces the per-snippet timeout (killing the whole process group) and caps output
well below gRPC's 4 MiB message limit (flmexec's byte-array encoding inflates output ~4x).
"""

from __future__ import annotations

import base64
import json

MARKER = "__HERMES_BATCH_RESULT__"
OUTPUT_CAP = 200_000  # bytes per stream

# Stays standard-library only and Python 3.8-compatible: it runs on whatever Python the executor has.
_SOURCE = r'''
import base64, json, os, shutil, signal, subprocess, sys, tempfile, threading, time
P = json.loads(base64.b64decode("{payload}").decode("utf-8"))
MARK = "{marker}"

def keep(buf, total, limit):
    data = bytes(buf["head"] + buf["tail"])
    if total <= limit:
        return data.decode("utf-8", "replace")
    return (bytes(buf["head"]).decode("utf-8", "replace") + "\n[... %d bytes omitted ...]\n" % (total - limit)
            + bytes(buf["tail"]).decode("utf-8", "replace"))

def pump(stream, buf, limit):
    head_max = limit * 2 // 5
    while True:
        chunk = os.read(stream.fileno(), 65536)  # what is there now: a background job may hold the pipe open
        if not chunk:
            return
        buf["total"] += len(chunk)
        room = head_max - len(buf["head"])
        if room > 0:
            buf["head"] += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            buf["tail"] += chunk
            extra = len(buf["tail"]) - (limit - head_max)
            if extra > 0:
                del buf["tail"][:extra]

for d in P["mkdirs"]:
    os.makedirs(d, exist_ok=True)
env = dict(os.environ)
if not P["runner"]:  # the agent's pip installs; the runner's own commands go without them
    site = "/tmp/site-packages"
    os.makedirs(site, exist_ok=True)
    env["PYTHONPATH"] = site + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PIP_TARGET"] = site
env["PYTHONUNBUFFERED"] = "1"
fresh = P["cwd"] is None
cwd = tempfile.mkdtemp(prefix="hermes-snippet-") if fresh else P["cwd"]
if fresh:
    env["HOME"] = env["TMPDIR"] = cwd
env.update(P["env"])
tag = "HERMES_BATCH_TASK=" + os.urandom(8).hex()  # finds what the code started, wherever it went
env["HERMES_BATCH_TASK"] = tag.split("=", 1)[1]
os.makedirs(cwd, exist_ok=True)
fd, path = tempfile.mkstemp(prefix="hermes-code-", suffix=".py" if P["language"] == "python" else ".sh",
                            dir=P["scratch"] or None)
with os.fdopen(fd, "w", encoding="utf-8") as f:
    f.write(P["code"])
if P["language"] == "python":
    argv = [sys.executable, path]
else:
    argv = [shutil.which("bash") or "/bin/sh", path]
limit = P["limit"]
out = {{"head": bytearray(), "tail": bytearray(), "total": 0}}
err = {{"head": bytearray(), "tail": bytearray(), "total": 0}}
started = time.time()
timed_out = False
try:
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    readers = [threading.Thread(target=pump, args=(proc.stdout, out, limit)),
               threading.Thread(target=pump, args=(proc.stderr, err, limit))]
    for t in readers:
        t.daemon = True
        t.start()
    try:
        code = proc.wait(timeout=P["timeout"])
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        code = 124
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # background jobs end with the command and free the pipes
    except OSError:
        pass
    for t in readers:
        t.join(1.0)
finally:
    # nothing the code started outlives the task: its group, then anything that left it (setsid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (OSError, NameError):
        pass
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open("/proc/%s/environ" % pid, "rb") as f:
                    if tag.encode() in f.read().split(b"\0"):
                        os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
    os.unlink(path)
    if fresh:
        shutil.rmtree(cwd, ignore_errors=True)
result = {{"exit_code": code, "stdout": keep(out, out["total"], limit), "stderr": keep(err, err["total"], limit),
          "timed_out": timed_out, "duration": time.time() - started}}
sys.stdout.write("\n" + MARK + json.dumps(result) + "\n")
sys.stdout.flush()
'''


def runner_source(
    code: str,
    *,
    language: str,
    timeout: float,
    cwd: str | None,
    scratch: str | None,
    env: dict[str, str] | None = None,
    mkdirs: list[str] | None = None,
    limit: int = OUTPUT_CAP,
    runner: bool = False,
) -> str:
    """Python source that runs `code` and prints its result as one marked JSON line.

    `cwd=None` runs the code in a fresh temporary directory (the `session` tool's independence).
    """
    payload = {
        "code": code, "language": language, "timeout": timeout, "cwd": cwd, "scratch": scratch,
        "env": env or {}, "mkdirs": mkdirs or [], "limit": min(limit, OUTPUT_CAP), "runner": runner,
    }
    encoded = base64.b64encode(json.dumps(payload).encode()).decode()
    return _SOURCE.format(payload=encoded, marker=MARKER)


def flmexec_request(source: str) -> bytes:
    """flmexec's task input: the runner, as Python, with no stdin."""
    return json.dumps({"language": "python", "code": source, "input": None}).encode()


def parse_result(task_output: bytes | None) -> dict:
    """Task output (flmexec's `{"data": [bytes]}`) → the runner's result, or an infrastructure error."""
    if not task_output:
        return {"exit_code": -1, "stdout": "", "stderr": "the task returned no output", "timed_out": False}
    try:
        stdout = bytes(json.loads(task_output)["data"]).decode("utf-8", "replace")
    except (ValueError, KeyError, TypeError) as exc:
        return {"exit_code": -1, "stdout": "", "stderr": f"unreadable flmexec output: {exc}", "timed_out": False}
    at = stdout.rfind(MARKER)
    if at < 0:
        return {"exit_code": -1, "stdout": stdout[-2000:], "timed_out": False,
                "stderr": "the runner did not report a result (the executor may lack python3, or it was killed)"}
    try:
        return json.loads(stdout[at + len(MARKER):].strip().splitlines()[0])
    except (ValueError, IndexError) as exc:
        return {"exit_code": -1, "stdout": "", "stderr": f"garbled runner result: {exc}", "timed_out": False}
