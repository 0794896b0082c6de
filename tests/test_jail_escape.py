"""The runner never acts on a path a prompt controls. Each way a prompt got out of the local jail
through what the runner did on the host (binding a link it planted at a jail's restart, writing a
file or a scratch script through a directory it swapped for a link, a shell it stopped, a disk it
filled), as root and as a normal user, then a property test that races all of them at once.

The `as_user` runs start the runner (or the backend) under `setpriv` as an unprivileged uid, in a
directory of that uid's: the jail is then a user namespace of the runner's own uid."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hermes_batch.backends import SandboxSpec, load_backend
from hermes_batch.tools import TOOLS, ToolContext, call_tool
from tests.backend_harness import make_backend_under_test, make_settings
from tests.conftest import CLI, ROOT, read_jsonl, write_jsonl
from tests.scripted_model import ScriptedModel, script

USER = 4242  # an unprivileged uid with no account: the runner as a normal user
SECRET = "sk-or-v1-HBESCAPE0123456789abcdef"
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the runner is started as root and as a user")
pytestmark = [ROOT_ONLY, pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")]


@pytest.fixture(params=["root", "user"])
def who(request):
    return request.param


@pytest.fixture
def home(who, tmp_path):
    """A directory the runner may write: pytest's own (root only) for root, a fresh one for the user."""
    if who == "root":
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="hb-user-", dir="/tmp"))
    os.chown(path, USER, USER)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _python_for_anyone() -> tuple[str, str] | None:
    """An interpreter of this Python version that any user may run, and the path to this
    environment's packages: the test's own may live under root's home (pyenv), closed to others."""
    site = next(p for p in sys.path if p.endswith("site-packages"))
    for exe in (os.path.realpath(sys.executable), f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"):
        path = Path(exe)
        if path.exists() and all(os.stat(d).st_mode & 0o001 for d in path.parents) and os.stat(exe).st_mode & 0o001:
            return exe, site
    return None


def as_runner(who: str, argv: list[str], home: Path, **kwargs) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(ROOT), "LANG": "C.UTF-8"}
    if who == "user":
        found = _python_for_anyone()
        if found is None:
            pytest.skip(f"no Python {sys.version_info.major}.{sys.version_info.minor} here that uid {USER} may run")
        argv = ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups", found[0], *argv[1:]]
        env["PYTHONPATH"] = f"{ROOT}:{found[1]}"
    return subprocess.run(argv, cwd=home, env={**env, **kwargs.pop("env", {})}, capture_output=True, text=True,
                          timeout=kwargs.pop("timeout", 300), **kwargs)


def run_scenario(who: str, home: Path, name: str, **args) -> dict:
    """Run `SCENARIOS[name](home, **args)` in a process of the runner's uid; return what it saw."""
    code = ("import asyncio, json, sys; from pathlib import Path; from tests.test_jail_escape import SCENARIOS; "
            "print('RESULT ' + json.dumps(asyncio.run(SCENARIOS[sys.argv[1]](Path(sys.argv[2]), **json.loads(sys.argv[3])))))")
    res = as_runner(who, [sys.executable, "-c", code, name, str(home), json.dumps(args)], home)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.rsplit("RESULT ", 1)[1])


async def _with_sandbox(home: Path, body, backend_name: str = "local", **settings):
    image = None
    if backend_name == "local":
        backend = load_backend("local", make_settings(home, **settings))
    else:  # an engine under test, from the conformance suite's harness (it skips where none is here)
        under_test = make_backend_under_test(backend_name, home, settings)
        backend, image = under_test.make(), under_test.image
    await backend.setup()
    sandbox = await backend.start(SandboxSpec(prompt_id=f"p-{time.monotonic_ns()}", image=image))

    async def get():
        return sandbox

    ctx = ToolContext(get_sandbox=get, command_timeout=30)

    async def call(name: str, **args) -> dict:
        res = await call_tool(TOOLS[name], json.dumps(args), ctx)
        return {"ok": res.ok, "content": res.content}

    try:
        return await body(sandbox, call)
    finally:
        await sandbox.close()
        await backend.shutdown()


def _sentinels(home: Path) -> Path:
    """A directory beside the sandboxes that a jail must never change or read: a private file in it."""
    outside = home / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    os.chmod(outside / "secret.txt", 0o600)  # the runner's alone
    return outside


def _snapshot(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): (p.read_text() if p.is_file() else "dir") for p in sorted(path.rglob("*"))}


# --- scenarios (run in the runner's own process, as root or as the user) -------------------------

async def write_race(home: Path, rounds: int = 150) -> dict:
    """A background job swaps `d` for a link to a directory outside, and back, as fast as it can,
    while the runner writes `d/f` and patches `d/g` (the runner once resolved, then opened)."""
    outside = _sentinels(home)
    before = _snapshot(outside)

    async def body(sb, call):
        await call("terminal", command=f"mkdir d && echo 'x = 1' > d/g && (while :; do mv d d.real; "
                                       f"ln -s {outside} d; rm d; mv d.real d; done) >/dev/null 2>&1 & echo started")
        seen = []
        for i in range(rounds):
            seen.append(await call("write_file", path="d/f", content=f"written {i}"))
            seen.append(await call("patch", path="d/g", old_string="x", new_string="x"))
            seen.append(await call("read_file", path="d/secret.txt"))
        return seen

    seen = await _with_sandbox(home, body)
    return {"changed": _snapshot(outside) != before, "leaked": any(SECRET in r["content"] for r in seen),
            "wrote": sum(r["ok"] for r in seen[0::3])}


async def scratch_link(home: Path) -> dict:
    """Code too long for one argv string is written to a scratch file: the prompt first swaps every
    directory it can name for a link to a directory outside."""
    outside = _sentinels(home)
    before = _snapshot(outside)

    async def body(sb, call):
        swap = (f'R=$(dirname "$PWD"); for d in "$R/tmp" /tmp "$TMPDIR"; do mv "$d" "$d.old" 2>/dev/null; '
                f'ln -s {outside} "$d" 2>/dev/null; done; echo swapped')
        first = await call("terminal", command=swap)
        code = "x = 1\n" * 20_000 + "print('long code ran')"
        ran = await call("sandbox", code=code)
        return first, ran

    first, ran = await _with_sandbox(home, body)
    return {"changed": _snapshot(outside) != before, "ran": "long code ran" in ran["content"],
            "swapped": "swapped" in first["content"]}


async def stopped_shell(home: Path) -> dict:
    """`kill -STOP $$` stopped the jail's shell; every later command then waited out its timeout."""

    async def body(sb, call):
        await call("terminal", command="echo kept > f.txt; (sleep 0.3; kill -STOP $$) >/dev/null 2>&1 & echo ok")
        for _ in range(600):  # until the background job has sent its stop (a second idle; longer when busy)
            if sb._shell.stopped():
                break
            await asyncio.sleep(0.05)
        started = time.monotonic()
        after = await call("terminal", command="cat f.txt")
        took = time.monotonic() - started
        direct = await call("terminal", command="kill -STOP $$; echo stopped-myself")
        started2 = time.monotonic()
        again = await call("terminal", command="echo answered")
        return after, took, direct, again, time.monotonic() - started2

    after, took, direct, again, took2 = await _with_sandbox(home, body)
    return {"after": after["content"], "took": took, "direct": direct["content"], "again": again["content"],
            "took2": took2}


KEYCTL = ("import ctypes, errno, sys; libc = ctypes.CDLL(None, use_errno=True); "
          "nr = {'x86_64': (250, 248, 101, 438), 'aarch64': (219, 217, 117, 438)}[__import__('os').uname().machine]; "
          "buf = ctypes.create_string_buffer(256); "
          "key = libc.syscall(nr[0], 10, ctypes.c_long(-3), b'user', b'runner-token', 0); "  # KEYCTL_SEARCH
          "n = libc.syscall(nr[0], 11, ctypes.c_long(key if key > 0 else -3), buf, 256); "  # KEYCTL_READ
          "print('read', n, errno.errorcode.get(ctypes.get_errno()), buf.raw[:max(n, 0)]); "
          "print('add_key', libc.syscall(nr[1], b'user', b'planted', b'x', 1, ctypes.c_long(-4)), "
          "errno.errorcode.get(ctypes.get_errno())); "
          "print('ptrace', libc.syscall(nr[2], 16, 1, 0, 0), errno.errorcode.get(ctypes.get_errno())); "
          "print('pidfd_getfd', libc.syscall(nr[3], 0, 1, 0), errno.errorcode.get(ctypes.get_errno()))")


async def keyring(home: Path) -> dict:
    """The kernel's keyrings are not namespaced: a jail inherited the runner's session keyring (and,
    as nobody, shared one user keyring with every other prompt)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    nr = {"x86_64": (250, 248), "aarch64": (219, 217)}[os.uname().machine]
    assert libc.syscall(nr[0], 1, b"hb-runner") >= 0  # KEYCTL_JOIN_SESSION_KEYRING: a fresh one of ours
    assert libc.syscall(nr[1], b"user", b"runner-token", SECRET.encode(), len(SECRET), ctypes.c_long(-3)) > 0

    async def body(sb, call):
        return await call("terminal", command=f"python3 -c {json.dumps(KEYCTL)}")

    seen = await _with_sandbox(home, body)
    return {"out": json.loads(seen["content"])["output"]}


async def reply_junk(home: Path) -> dict:
    """The jail's shell answers on a pipe to the runner; a command that could write junk there kept
    the worker's event loop busy for as long as the prompt lived (slowing every other prompt)."""

    async def body(sb, call):
        junk = await call("terminal", command="printf 'junk\\n%.0s' $(seq 1000) > /proc/$$/fd/1 && echo wrote; "
                                              "sleep 2; echo still-here")
        after = await call("terminal", command="echo next")
        return junk, after

    junk, after = await _with_sandbox(home, body)
    return {"junk": junk["content"], "after": after["content"]}


async def unremovable(home: Path) -> dict:
    """A prompt that takes away its own rights over a directory: its files outlived it when the
    runner was not root (the removal failed and said nothing)."""

    async def body(sb, call):
        return await call("terminal", command="mkdir -p keep/inner && echo x > keep/inner/f && chmod 0 keep && echo ok")

    made = await _with_sandbox(home, body)
    left = [str(p) for run in (home / "sandboxes").iterdir() for p in run.rglob("*")]  # the run's directory stays
    return {"made": made["content"], "left": left}


async def way_out(home: Path) -> dict:
    """--network: two jails, each a network of its own; the second's one way out is the guard on its
    own loopback (placed there from the host: as a user, through the user namespace that owns it)."""
    from hermes_batch.tools.guard_proxy import GuardProxy

    guard = GuardProxy()
    backend = load_backend("local", make_settings(home, network=True))
    backend.egress = guard
    await backend.setup()
    first, second = [await backend.start(SandboxSpec(prompt_id=f"p{i}")) for i in range(2)]
    try:
        served = await first.exec("nohup python3 -m http.server 8123 --bind 127.0.0.1 >/dev/null 2>&1 & sleep 1; "
                                  "grep -c ' 0A ' /proc/net/tcp", timeout=30)
        looked = await second.exec(
            "python3 -c \"import socket, urllib.request as u\ntry:\n    socket.create_connection(('127.0.0.1', 8123), 3)"
            "\n    print('reached')\nexcept OSError as e:\n    print('refused', e)\ntry:\n    u.urlopen('http://10.1.2.3/')"
            "\nexcept Exception as e:\n    print('guard', e)\n\"; grep ' 0A ' /proc/net/tcp", timeout=30)
        return {"served": served.stdout, "looked": looked.stdout + looked.stderr, "refused": guard.refused}
    finally:
        await first.close()
        await second.close()
        await backend.shutdown()
        await guard.close()


SCENARIOS = {"write_race": write_race, "scratch_link": scratch_link, "stopped_shell": stopped_shell,
             "keyring": keyring, "reply_junk": reply_junk, "unremovable": unremovable, "way_out": way_out}


# --- the reproductions ----------------------------------------------------------------------

def test_a_jail_restart_does_not_bind_a_link_the_prompt_planted(who, home):
    """Command 1 swapped the prompt's tmp for a link to the host's root and killed its jail;
    command 2's new jail had the host's / at /tmp, read-write: a private file beside the dataset,
    the key on the runner's command line, every other run's sandboxes, a file made in the host's /tmp."""
    private = home / "private-notes.txt"
    private.write_text("PRIVATE-HBESCAPE")
    os.chmod(private, 0o600)
    if who == "user":
        os.chown(private, USER, USER)
    decoy = home / "sandboxes" / "someone-elses-run" / "abc"
    decoy.mkdir(parents=True)
    if who == "user":
        for p in (home / "sandboxes", decoy.parent, decoy):
            os.chown(p, USER, USER)
    tag = f"hb-escaped-{time.monotonic_ns()}"
    plant = ('R=$(dirname "$PWD"); U=$(echo "$R" | sed -e "s|/[^/]*|../|g"); mv "$R/tmp" "$R/tmp.old"; '
             'ln -s "$U" "$R/tmp"; ls -la "$R" 2>&1 | head -5; kill -9 -1')
    look = (f"cat {private} /tmp{private} 2>&1; for f in /proc/[0-9]*/cmdline /tmp/proc/[0-9]*/cmdline; do "
            f"tr '\\0' ' ' < $f 2>/dev/null; echo; done; ls /tmp{home}/sandboxes {home}/sandboxes 2>&1; "
            f"touch /tmp/tmp/{tag} /tmp/{tag}; mkdir -p /tmp/{tag}-dir; echo LOOKED")
    prompt = script({"calls": [["terminal", {"command": plant}]]}, {"calls": [["terminal", {"command": look}]]},
                    {"answer": "done"})
    data = write_jsonl(home / "d.jsonl", [{"prompt": prompt}])
    if who == "user":
        os.chown(data, USER, USER)
    with ScriptedModel(reasoning="field") as model:
        cli = CLI(home, model)
        res = as_runner(who, cli.args("escape", data, api_key=SECRET, toolsets="terminal", num_workers=1), home)
        assert res.returncode == 0, res.stderr[-3000:]
        assert ("--disk is not enforced here" in res.stderr) == (who == "user")  # said at start where it is not
        outputs = [m["content"] for req in model.requests for m in req["messages"] if m.get("role") == "tool"]
    records = read_jsonl(cli.run_dir("escape") / "trajectories.jsonl")
    assert len(records) == 1
    seen = "\n".join(outputs)
    assert "LOOKED" in seen  # the second command ran
    assert "PRIVATE-HBESCAPE" not in seen and SECRET not in seen and "someone-elses-run" not in seen
    assert not os.path.exists(f"/tmp/{tag}") and not os.path.exists(f"/tmp/{tag}-dir")
    assert not any(p.name.startswith(tag) for p in Path("/").iterdir())


def test_file_tools_do_not_follow_a_directory_swapped_for_a_link_mid_call(who, home):
    seen = run_scenario(who, home, "write_race")
    assert not seen["changed"], "a write went through the prompt's link, outside its directory"
    assert not seen["leaked"], "a file only the runner may read came back to the model"
    assert seen["wrote"] > 0  # the writes went somewhere: the prompt's own directory


def test_long_code_is_not_written_through_a_link_the_prompt_planted(who, home):
    seen = run_scenario(who, home, "scratch_link")
    assert not seen["changed"], "the runner wrote the code file through the prompt's link"
    assert seen["swapped"] and seen["ran"]


def test_a_stopped_shell_is_replaced_and_the_next_command_answered_at_once(who, home):
    seen = run_scenario(who, home, "stopped_shell")
    assert "kept" in seen["after"] and seen["took"] < 10, seen  # answered, in a new jail, with the files
    assert "new jail" in seen["after"]  # and told that its background jobs are gone
    assert "stopped-myself" in seen["direct"]  # a command that stops its own shell is still answered
    assert "answered" in seen["again"] and seen["took2"] < 10, seen


def test_a_shell_stopped_while_a_command_waits_is_ended_not_waited_on(tmp_path):
    """The look before each command cannot see a stop that lands after it: the wait looks again."""

    async def body(sb, call):
        await call("terminal", command="echo warm")
        shell = sb._shell
        os.kill(shell._find_shell(), signal.SIGSTOP)
        started = time.monotonic()
        res = await shell.run(["bash", "-c", "echo never"], cwd=sb.workdir, env={}, timeout=60, limit=4096,
                              drain_after_exit=0.5)
        return res, time.monotonic() - started, await call("terminal", command="echo next")

    res, took, nxt = asyncio.run(_with_sandbox(tmp_path, body))
    assert res.exit_code == 137 and "jail was killed" in res.stderr and took < 10
    assert "next" in nxt["content"]


FREEZER = Path("/sys/fs/cgroup/freezer")


def test_a_stop_the_shell_has_not_taken_yet_still_gives_the_next_command_a_new_jail(tmp_path):
    """`kill -STOP $$` is answered before the shell has taken the stop (it sleeps in a read and must
    be scheduled to act on it): on a busy machine the next command went to that shell, which then
    stopped, and the command was killed with the jail (CI failed so). The shell is frozen here to
    hold the stop pending, as a busy machine did; it is thawed while the next command waits."""
    if not (FREEZER / "tasks").exists():
        pytest.skip("no cgroup v1 freezer here to hold a stop pending")
    group = FREEZER / f"hb-test-{os.getpid()}-{time.monotonic_ns()}"

    async def body(sb, call):
        await call("terminal", command="echo warm")
        shell = sb._shell
        group.mkdir()
        (group / "tasks").write_text(str(shell._find_shell()))
        (group / "freezer.state").write_text("FROZEN")
        while (group / "freezer.state").read_text().strip() != "FROZEN":
            await asyncio.sleep(0.05)
        os.kill(shell._find_shell(), signal.SIGSTOP)
        asyncio.get_running_loop().call_later(0.5, (group / "freezer.state").write_text, "THAWED")
        started = time.monotonic()
        return await call("terminal", command="echo answered"), time.monotonic() - started

    try:
        res, took = asyncio.run(_with_sandbox(tmp_path, body))
    finally:
        (group / "freezer.state").write_text("THAWED")
        for _ in range(100):  # the killed shell leaves the group once thawed
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.05)
    assert "answered" in res["content"] and "new jail" in res["content"] and took < 10, res


def test_the_runner_s_keyring_is_out_of_reach_and_the_jail_cannot_trace_its_shell(who, home):
    out = run_scenario(who, home, "keyring")["out"]
    assert SECRET not in out
    for call in ("read", "add_key", "ptrace", "pidfd_getfd"):
        assert f"{call} -1 EPERM" in out, out  # denied by the jail's seccomp filter, on every ABI


def test_junk_on_the_shell_s_answer_pipe_ends_the_jail(who, home):
    seen = run_scenario(who, home, "reply_junk")
    junk = json.loads(seen["junk"])
    if "Permission denied" in junk["output"]:  # as root the pipe is root's: the jail cannot even open it
        assert who == "root", junk
    else:  # the pipe is the runner's uid's: the junk ends the jail (its "wrote" may go down with it)
        assert junk["exit_code"] == 137 and "jail was killed" in junk["output"] and "still-here" not in junk["output"], junk
    assert "next" in seen["after"]


def test_with_network_a_jail_s_one_way_out_is_the_guard_on_its_own_loopback(who, home):
    seen = run_scenario(who, home, "way_out")
    assert seen["served"].split() == ["2"], seen  # its own server and its own way out: nothing else listens there
    assert "refused" in seen["looked"] and "reached" not in seen["looked"], seen  # the other jail's server
    assert "guard HTTP Error 403" in seen["looked"] and seen["refused"] == 1, seen  # the way out: the guard, refusing
    assert seen["looked"].count(" 0A ") == 1 and ":0C38 " in seen["looked"], seen  # 127.0.0.1:3128, alone


def test_a_prompt_s_files_go_with_it_whatever_it_did_to_their_rights(who, home):
    seen = run_scenario(who, home, "unremovable")
    assert "ok" in seen["made"]
    assert seen["left"] == []


def test_each_prompt_has_its_own_process_limit_and_cannot_starve_another(tmp_path):
    """As root, every jail ran as `nobody`: one prompt's processes counted against every other's."""

    async def main():
        backend = load_backend("local", make_settings(tmp_path, pids_limit=64))
        await backend.setup()
        a = await backend.start(SandboxSpec(prompt_id="a"))
        b = await backend.start(SandboxSpec(prompt_id="b"))
        try:
            forks = ("import os, sys, time\nn = 0\nfor _ in range(int(sys.argv[1])):\n    try:\n"
                     "        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n        n += 1\n"
                     "    except OSError:\n        pass\nprint(n, os.getuid())\n")
            await a.write_file("/tmp/forks.py", forks.encode())
            await b.write_file("/tmp/forks.py", forks.encode())
            bomb = await a.exec("python3 /tmp/forks.py 200", timeout=60)
            other = await b.exec("python3 /tmp/forks.py 40", timeout=60)
            return bomb, other
        finally:
            await a.close()
            await b.close()
            await backend.shutdown()

    bomb, other = asyncio.run(main())
    made_a, uid_a = map(int, bomb.stdout.split())
    made_b, uid_b = map(int, other.stdout.split())
    assert 40 <= made_a < 64, bomb  # past --pids_limit, its forks fail
    assert made_b == 40, other  # while the other prompt's forks all succeed
    assert uid_a != uid_b and uid_a in range(0x6000_0000, 0x7000_0000)  # a uid of each prompt's own


def test_a_sandbox_root_that_another_user_made_is_refused(tmp_path):
    """The default sandbox root is in /tmp: a local user could make it first, with a link where a
    run's directory goes, and a root runner would make, mount and remove things where it points."""
    victim = tmp_path / "victim"
    (victim / "precious").mkdir(parents=True)
    base = tmp_path / "shared" / "hermes-batch"
    base.mkdir(parents=True)
    os.chown(base, USER, USER)
    settings = make_settings(tmp_path)
    settings.sandbox_root = str(base)
    (base / settings.run_label).symlink_to(victim)

    async def main():
        backend = load_backend("local", settings)
        try:
            await backend.setup()
            await backend.sweep_orphans()
        finally:
            await backend.shutdown()

    with pytest.raises(Exception, match="not a directory of this user's.*--sandbox_root"):
        asyncio.run(main())
    assert (victim / "precious").is_dir()


@pytest.mark.skipif(not Path("/dev/loop-control").exists(), reason="no loop devices: --disk cannot be enforced here")
def test_a_prompt_cannot_write_more_than_its_disk(tmp_path):
    """Each jail's /var/tmp was a tmpfs of half the host's memory and the work directory had no
    bound: now all of the prompt's files share --disk, and going over is that prompt's error."""
    async def body(sb, call):
        full = "2>&1 | grep -m1 -o 'No space left on device'"
        fill = await call("terminal", command=f"dd if=/dev/zero of=big bs=1M count=100 {full}; "
                                              f"dd if=/dev/zero of=/var/tmp/big bs=1M count=10 {full}; "
                                              f"dd if=/dev/zero of=/dev/shm/big bs=1M count=100 {full}; "
                                              "df -k /workspace | tail -1")
        after = await call("terminal", command="rm -f big /var/tmp/big /dev/shm/big && echo freed && echo ok > f && cat f")
        return fill, after

    fill, after = asyncio.run(_with_sandbox(tmp_path, body, disk="48m"))
    assert fill["content"].count("No space left on device") == 3, fill["content"]
    assert "ok" in after["content"] and "freed" in after["content"]  # the prompt goes on
    size_kib = int(json.loads(fill["content"])["output"].splitlines()[-1].split()[1])
    assert size_kib <= 48 * 1024  # the work directory is a filesystem of --disk bytes


def test_the_disk_flag_is_read_and_a_bad_value_named(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    res = cli.run("baddisk", data, disk="lots")
    assert res.returncode == 1 and "--disk" in res.stderr and "lots" in res.stderr, res.stderr[-2000:]


# --- the property test ----------------------------------------------------------------------

async def _race_everything(home: Path, seconds: float, seed: int, backend: str = "local", calls: int = 0) -> dict:
    """Races for `seconds`, and on past them until `calls` tool calls were made (a busy machine
    makes fewer in the time), up to five times as long."""
    outside = _sentinels(home)
    before = _snapshot(outside)
    rng = random.Random(seed)
    relink = (  # every directory the prompt can name, renamed and relinked to outside, over and over
        f'(while :; do for d in /workspace/a /workspace/a/b /tmp/s "$(dirname "$PWD")/tmp" "$(dirname "$PWD")/work" '
        f'/workspace /tmp "$(dirname "$PWD")"; do mv "$d" "$d.x"; ln -sfn {outside} "$d"; rm -f "$d"; '
        f'mv "$d.x" "$d"; done; done) >/dev/null 2>&1 &')

    async def body(sb, call):
        seen = [await call("terminal", command=f"mkdir -p a/b /tmp/s && echo 'v = 0' > a/b/f.py && {relink} echo go")]
        started = time.monotonic()
        while ((now := time.monotonic()) < started + seconds or len(seen) <= calls) and now < started + 5 * seconds:
            target = rng.choice(["a/b/f.py", "a/f.py", "a/b/secret.txt", "/tmp/s/f.py"])
            pick = rng.randrange(6)
            if pick == 0:
                seen.append(await call("write_file", path=target, content="v = 0\n"))
            elif pick == 1:
                seen.append(await call("patch", path=target, old_string="v = 0", new_string="v = 0"))
            elif pick == 2:
                seen.append(await call("read_file", path=target))
            elif pick == 3:
                seen.append(await call("sandbox", code="v = 0\n" * 20_000 + "print('long')"))
            elif pick == 4:  # the jail dies and comes back, and the loop goes on in the new one
                seen.append(await call("terminal", command="kill -9 -1"))
                seen.append(await call("terminal", command=f"{relink} echo again"))
            else:
                seen.append(await call("terminal", command=f"cat {outside}/secret.txt a/b/secret.txt 2>&1 | head -2"))
        return seen

    seen = await _with_sandbox(home, body, backend)
    return {"calls": len(seen), "changed": _snapshot(outside) != before,
            "leaked": [r["content"][:200] for r in seen if SECRET in r["content"]]}


SCENARIOS["race_everything"] = _race_everything


def test_no_race_between_the_prompt_and_the_runner_reaches_outside_its_directory(who, home):
    seen = run_scenario(who, home, "race_everything", seconds=12.0, seed=20, calls=40)
    assert not seen["changed"], "something outside the prompt's directory changed"
    assert not seen["leaked"], seen["leaked"]
    assert seen["calls"] > 40, seen


def test_no_race_reaches_outside_an_apptainer_instance_s_directories(tmp_path):
    """Apptainer binds two host directories into each instance: the same race, against it."""
    seen = asyncio.run(_race_everything(tmp_path, seconds=12.0, seed=21, backend="singularity", calls=10))
    assert not seen["changed"], "something outside the prompt's directory changed"
    assert not seen["leaked"], seen["leaked"]
    assert seen["calls"] > 10, seen
