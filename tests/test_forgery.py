"""Verdicts an agent cannot forge or dodge: every move a review made as an attacker, replayed on
every backend that runs here, must leave a wrong trajectory `fail` (never `pass`, never `error`),
and a right one whose agent blocked the check's places `pass`.

Each move is the agent's turn (a scripted model's terminal command) and a row's check. Moves that
need the system part of the sandbox to be out of the agent's reach run only where it is (the table
in docs/verification.md): Modal's root and the unisolated local mode are writable to the agent."""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.backend_harness import TEST_IMAGE, docker_status, each_backend, run_episodes, unavailable
from tests.conftest import read_jsonl, tool_results_in, write_jsonl
from tests.scripted_model import script

RIGHT, WRONG = "echo 42 > out.txt", "echo 41 > out.txt"
CHECK = 'test "$(cat out.txt)" = 42'
PY_CHECK = "python3 -c 'import sys; sys.exit(open(\"out.txt\").read().strip() != \"42\")'"
# a program that exits 0 whatever it is asked, planted where the runner might look for its own
FAKE = "printf '#!/bin/sh\\nexit 0\\n'"
# a `timeout` that runs what it is given, but for the runner's ending of the agent's processes
SPARING_TIMEOUT = ("printf '#!/bin/sh\\nshift 3\\ncase \"$*\" in *\"kill -STOP\"*) exit 0;; esac\\nexec \"$@\"\\n'")
# a job that would write a passing reward into any result directory it finds, for ever
FORGER_LOOP = ('while :; do for d in /logs/verifier /tmp/hermes-check-*/result; do '
               '[ -d "$d" ] && echo 1 > "$d/reward.txt"; done; sleep 0.02; done')
FORGER = f"nohup sh -c {shlex.quote(FORGER_LOOP)} >/dev/null 2>&1 &"
# a job that names itself so that /proc/PID/status seems to say another user's (gVisor does not
# escape the name's newline), and forges the reward
NAMED_FORGER = ("import ctypes, glob, time\nctypes.CDLL(None).prctl(15, b'x\\nUid:\\t1\\n', 0, 0, 0)\nwhile 1:\n"
                "    for d in ['/logs/verifier'] + glob.glob('/tmp/hermes-check-*/result'):\n"
                "        try: open(d + '/reward.txt', 'w').write('1')\n        except OSError: pass\n    time.sleep(0.02)\n")
# the agent's program, which the check runs as its root: it leaves a job of another user that
# rewrites the reward when the runner's ending of processes thaws it
REWRITE = "rm -f /logs/verifier/reward.txt; echo 1 > /logs/verifier/reward.txt"
OTHER_USER_JOB = ("setpriv --reuid=1234 --regid=1234 --clear-groups nohup bash -c "
                  + shlex.quote(f"trap {shlex.quote(REWRITE)} CONT; while :; do sleep 0.05; done")
                  + " >/dev/null 2>&1 & chmod 777 /logs/verifier; sleep 0.1")


@dataclass
class Move:
    name: str
    agent: str  # the agent's command
    check: str = CHECK
    expect: str = "fail"
    row: dict[str, Any] = field(default_factory=dict)  # more of the row (check_files, check_timeout)
    system: bool = False  # needs the sandbox's system part out of the agent's reach
    own_root: bool = False  # needs a root of the sandbox's own (fixed paths such as /tests)
    touches_host_tmp: bool = False  # would change /tmp of a backend that shares the host's (Flame's double, unisolated)
    touches_host_dev: bool = False  # would change device nodes Apptainer binds from the host (test_singularity_backend)
    only: tuple[str, ...] | None = None  # the backends it is meant for
    # gVisor's host threads share the container's process limit: a fork bomb ends it (an error, a
    # known limit in docs/backends.md)
    gvisor: bool = True


MOVES = [
    Move("replaced python", f"{WRONG}; cp /bin/true /usr/bin/python3.11 2>/dev/null; true",
         check="/usr/bin/python3 -I -c 'import sys; sys.exit(open(\"out.txt\").read().strip() != \"42\")'", system=True),
    Move("a timeout that spares the agent's jobs, and a job forging the reward",
         f"{WRONG}; {SPARING_TIMEOUT} > /usr/bin/timeout 2>/dev/null; {FORGER} sleep 0.2; true",
         check="sleep 1; exit 1", system=True),
    Move("sitecustomize on PYTHONPATH, usercustomize in HOME",
         f"{WRONG}; for d in ${{PYTHONPATH:-/tmp/site-packages}} $HOME/.local/lib/python3.11/site-packages; do "
         "mkdir -p $d && echo 'import os; os._exit(0)' > $d/sitecustomize.py && cp $d/sitecustomize.py $d/usercustomize.py; "
         "done; true", check=PY_CHECK, touches_host_tmp=True),  # Flame's PYTHONPATH is the executor's /tmp
    Move("a directory where a check file goes, right work", f"{RIGHT}; mkdir -p t/check.sh/x; chmod 0 t/check.sh t",
         check="sh t/check.sh", expect="pass", row={"check_files": {"t/check.sh": CHECK + "\n"}}),
    Move("a link where a check file's directory goes, wrong work", f"{WRONG}; ln -s /nowhere t",
         check="sh t/check.sh", row={"check_files": {"t/check.sh": CHECK + "\n"}}),
    Move("/tmp and /logs made unusable", f"{WRONG}; chmod 0 /tmp /logs 2>/dev/null; true", touches_host_tmp=True),
    Move("/tmp filled", f"{WRONG}; head -c 100000000 /dev/zero > /tmp/fill 2>/dev/null; true", touches_host_tmp=True),
    Move("the program the check runs never written (exit 127)", WRONG, check="./solve.sh"),
    Move("the program the check runs never ends", f"{WRONG}; echo 'sleep 100' > prog.sh", check="sh prog.sh",
         row={"check_timeout": 2}),
    # found by a review of the first version of this suite
    Move("/dev/null made unusable, and a job forging the reward", f"{WRONG}; {FORGER} sleep 0.3; chmod 0 /dev/null",
         check="sleep 1; exit 1", touches_host_dev=True, touches_host_tmp=True),
    Move("/dev/null replaced by a directory", f"{WRONG}; {FORGER} sleep 0.3; rm -f /dev/null && mkdir /dev/null",
         check="sleep 1; exit 1", touches_host_dev=True, touches_host_tmp=True),
    Move("bytecode planted for a hidden test", f"{WRONG}; mkdir -p tests && printf 'import os\\nos._exit(0)\\n' > "
         "tests/test_hidden.py && python3 -c \"import py_compile as c, importlib.util as u; "
         "c.compile('tests/test_hidden.py', cfile=u.cache_from_source('tests/test_hidden.py'), "
         "invalidation_mode=c.PycInvalidationMode.UNCHECKED_HASH)\" && rm tests/test_hidden.py",
         check="/usr/bin/python3 -I -m unittest discover -s tests -p test_hidden.py",
         row={"check_files": {"tests/test_hidden.py": "import unittest\n\nclass T(unittest.TestCase):\n"
                                                      "    def test_it(self):\n"
                                                      "        self.assertEqual(open('out.txt').read().strip(), '42')\n"}}),
    Move("the work directory made unenterable", f"{WRONG}; chmod 0 ."),
    Move("a long check, the runner's scratch place taken", f"{WRONG}; rm -rf /tmp/.hermes-batch; touch /tmp/.hermes-batch",
         check=CHECK + "\n#" + "x" * 110_000, touches_host_tmp=True),
    Move("/tmp made unusable before a preparation too long for one command", f"{WRONG}; chmod 0 /tmp",
         check=f"sh c/0.sh && {CHECK}", only=("local",),
         row={"check_files": {f"c/{i}.sh": "true\n" for i in range(700)}}),
    # where the image's root keeps its capabilities (Harbor tasks on docker): the agent's root holds none
    Move("the agent's root becomes the keeper's user and nobody, each leaving a job forging the reward",
         f"{WRONG}; printf %s {shlex.quote(FORGER_LOOP)} > /tmp/forge.sh; "
         "setpriv --reuid=2000000000 --regid=2000000000 --clear-groups nohup sh /tmp/forge.sh >/dev/null 2>&1 & "
         "su -s /bin/sh nobody -c 'nohup sh /tmp/forge.sh >/dev/null 2>&1 &'; sleep 0.2; true",
         check="sleep 1; exit 1", touches_host_tmp=True),
    Move("a fork bomb, past the process limit", f"{WRONG}; for i in $(seq 1500); do sleep 60 & done 2>/dev/null; true",
         only=("docker",), gvisor=False),
    Move("the keeper signalled, every process killed", f"{WRONG}; kill -TERM 1; kill -HUP 1; kill -9 -1; true",
         only=("docker",)),  # (a sandbox without a PID namespace of its own would share the host's)
    # found by a review of the image's own root (Harbor tasks on docker)
    Move("a job in a user namespace of its own forging the reward",
         f"{WRONG}; unshare -U -r nohup sh -c {shlex.quote(FORGER_LOOP)} >/dev/null 2>&1 & sleep 0.3; true",
         check="sleep 1; exit 1", touches_host_tmp=True),
    Move("a job whose name fakes its Uid line forging the reward",
         f"{WRONG}; printf %s {shlex.quote(NAMED_FORGER)} > /tmp/forge.py; nohup python3 /tmp/forge.py >/dev/null 2>&1 & "
         "sleep 0.3; true", check="sleep 1; exit 1", touches_host_tmp=True),
    Move("the agent's program, run by the check, leaves a job of another user rewriting the reward",
         f"{WRONG}; printf %s {shlex.quote(OTHER_USER_JOB)} > prog.sh", only=("docker",),
         check=f"mkdir -p /logs/verifier; sh prog.sh; {CHECK} && echo 1 > /logs/verifier/reward.txt || "
               "{ echo 0 > /logs/verifier/reward.txt; exit 1; }"),
    Move("a job that kills every process it may, for ever",
         f"{WRONG}; nohup setsid sh -c 'while :; do kill -9 -1; done' >/dev/null 2>&1 & sleep 0.3; true",
         only=("docker",)),
    Move("a file planted in the check's own directory", f"{WRONG}; mkdir -p /tests && echo 'exit 0' > /tests/extra.sh",
         check="sh /tests/test.sh", own_root=True,
         row={"check_files": {"/tests/test.sh": "[ -f /tests/extra.sh ] && . /tests/extra.sh\n" + CHECK + "\n"}}),
]


def applies(move: Move, but) -> bool:
    """As docs/verification.md's table of what each backend guarantees says."""
    unisolated = getattr(but.settings, "local_isolation", "bwrap") == "none"
    if move.system and not (but.name in ("docker", "singularity") or (but.name == "local" and not unisolated)):
        return False  # Modal's root, Flame's executor and the host itself are writable to the agent
    if move.own_root and but.name not in ("docker", "singularity", "modal"):
        return False
    if move.only is not None and but.name not in move.only:
        return False
    if not move.gvisor and getattr(but.settings, "runtime", None):
        return False
    if move.touches_host_dev and but.name == "singularity":
        return False  # its /dev/null is the host's (test_singularity_backend.py holds that case)
    return not (move.touches_host_tmp and (but.name == "flame" or unisolated))


def run_moves(but, model, tmp_path, moves: list[Move], image: str | None = None) -> list[dict]:
    """Each move as one prompt, all at once, through the real episode; their verdicts."""
    rows = [{"prompt": script({"calls": [["terminal", {"command": m.agent}]]}, {"answer": "done"}, text=m.name),
             "check": m.check, **m.row} for m in moves]
    settled = run_episodes(but, model.base_url, write_jsonl(tmp_path / "moves.jsonl", rows), image, check_retries=0)
    assert [s.outcome.kind for s in settled] == ["done"] * len(moves), \
        [(m.name, s.outcome.error) for m, s in zip(moves, settled, strict=True) if s.outcome.kind != "done"]
    return [json.loads(s.outcome.line)["verification"] for s in settled]


backend_under_test = each_backend(["local", "docker", "docker-image-root", "docker-gvisor", "docker-gvisor-image-root",
                                   "singularity", "modal", "flame"])


def test_no_move_of_the_agent_forges_a_pass_or_dodges_a_fail(backend_under_test, model, tmp_path):
    but = backend_under_test
    but.settings.disk = "64m"  # so that filling it takes a moment
    moves = [m for m in MOVES if applies(m, but)]
    verdicts = run_moves(but, model, tmp_path, moves)
    got = {m.name: (v["status"], v["checks"][0]["error"]) for m, v in zip(moves, verdicts, strict=True)}
    assert {name: status for name, (status, _) in got.items()} == {m.name: m.expect for m in moves}, \
        json.dumps(got, indent=1)
    reasons = dict(got)
    assert "did not finish within 2 s" in reasons["the program the check runs never ends"][1]
    assert "command not found" in reasons["the program the check runs never written (exit 127)"][1]


def test_a_directory_of_the_image_s_path_the_agent_can_write_is_said_and_the_check_goes_without_it(cli, tmp_path):
    """uv's pattern: a venv under the work directory first on the image's PATH. Planted programs there
    would run the check and the ending of the agent's processes (a review forged a pass so)."""
    why = docker_status()
    if why:
        unavailable("docker", why)
    import docker

    client = docker.from_env()
    context = tmp_path / "venv-image"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {TEST_IMAGE}\nWORKDIR /app\n"
                                        "ENV PATH=/app/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n")
    tag = f"hermes-batch-test:venv-on-path-{os.getpid()}"
    client.images.build(path=str(context), tag=tag, pull=False, rm=True)
    try:
        plant = (f"{WRONG}; mkdir -p .venv/bin; for c in timeout bash sh cat test python3 kill sleep; do "
                 f"{FAKE} > .venv/bin/$c; chmod +x .venv/bin/$c; done; {FORGER} true")
        rows = [{"prompt": script({"calls": [["terminal", {"command": plant}]]}, {"answer": "done"}),
                 "check": f"sleep 1; {CHECK} && {PY_CHECK}", "image": tag, "cwd": "/app"},
                {"prompt": script({"calls": [["terminal", {"command": RIGHT}]]}, {"answer": "done"}),
                 "check": f"{CHECK} && {PY_CHECK}", "image": tag, "cwd": "/app"}]
        res = cli.run("venv", write_jsonl(tmp_path / "d.jsonl", rows), backend="docker", require_reasoning=False)
        assert res.returncode == 0, res.stderr[-3000:]
        verdicts = {r["prompt_index"]: r["verification"]["status"]
                    for r in read_jsonl(cli.run_dir("venv") / "trajectories.jsonl")}
        assert verdicts == {0: "fail", 1: "pass"}
        assert res.stderr.count("its PATH holds /app/.venv/bin, which the agent's commands can write") == 1
    finally:
        client.images.remove(tag, force=True)
        client.close()


@pytest.mark.parametrize("lines, writable, shell, timer, trusted, untrusted", [
    (["P/app/.venv/bin:/usr/bin:/bin", "D/app/.venv/bin\t/app/.venv/bin", "D/usr/bin\t/usr/bin", "D/bin\t/usr/bin",
      "X/app/.venv/bin/bash\t/app/.venv/bin/bash", "X/usr/bin/bash\t/usr/bin/bash", "X/usr/bin/timeout\t/usr/bin/timeout",
      "W/app"], ("/tmp",), "/usr/bin/bash", "/usr/bin/timeout", "/usr/bin:/bin", ("/app/.venv/bin",)),
    (["P/tmp/x:/opt/go/bin:/usr/bin", "D/tmp/x\t/tmp/x", "D/opt/go/bin\t/opt/go/bin", "D/usr/bin\t/usr/bin",
      "D/bin\t/usr/bin", "X/tmp/x/sh\t/tmp/x/sh", "X/bin/sh\t/usr/bin/dash", "W/workspace"],  # no bash, no timeout
     ("/tmp",), "/bin/sh", None, "/opt/go/bin:/usr/bin", ("/tmp/x",)),
    # a review: a directory that is a link into /tmp, and a timeout that is one
    (["P/opt/bin:/usr/bin", "D/opt/bin\t/tmp/toolbin", "D/usr/bin\t/usr/bin", "X/usr/bin/bash\t/usr/bin/bash",
      "X/usr/bin/timeout\t/tmp/t", "W/workspace"], ("/tmp",), "/usr/bin/bash", None, "/usr/bin", ("/opt/bin",)),
    (["P/root/bin:/usr/bin", "D/root/bin\t/root/bin", "D/usr/bin\t/usr/bin", "X/root/bin/bash\t/root/bin/bash",
      "X/usr/bin/bash\t/usr/bin/bash", "W/root"],  # a writable root: nothing left out
     None, "/root/bin/bash", None, "/root/bin:/usr/bin", ()),
])
def test_the_runner_s_shell_timer_and_path_come_from_directories_the_agent_cannot_write(
        lines, writable, shell, timer, trusted, untrusted):
    from hermes_batch.backends.base import SandboxEnvironment

    found = SandboxEnvironment.read(lines, writable)
    assert (found.shell, found.timer, found.untrusted_path) == (shell, timer, untrusted)
    assert found.trusted_path.startswith(trusted)


def test_an_agent_that_uses_up_its_container_s_memory_fails_and_is_no_error(model, tmp_path):
    """A review filled /tmp (a tmpfs, counted against --memory) until the engine ended the container:
    the verdict was an error, left out of the pass rate."""
    from tests.backend_harness import make_backend_under_test

    but = make_backend_under_test("docker", tmp_path)
    but.settings.memory, but.settings.disk = "96m", "512m"
    fill = Move("memory used up through /tmp", f"{WRONG}; head -c 400000000 /dev/zero > /tmp/fill; true")
    [verdict] = run_moves(but, model, tmp_path, [fill])
    assert verdict["status"] == "fail", [c["error"] for c in verdict["checks"]]
    # its reason: the memory, or (on a busy machine, where the engine's exec failed first) the spoilt sandbox
    reason = verdict["checks"][0]["error"] or ""
    assert "memory" in reason or "spoilt the sandbox" in reason or verdict["checks"][0]["exit_code"] == 1, verdict


def test_apptainer_as_root_gives_back_the_host_s_device_nodes_the_agent_changed(model, tmp_path):
    """As root, Apptainer runs the commands as uid 0 without capabilities, and --containall binds the
    host's own device nodes: a review changed the host's /dev/tty from inside. The runner sets
    their modes back before the check and at the prompt's end (/dev/random here: hardly anything opens it)."""
    import os

    from tests.backend_harness import make_backend_under_test

    if os.geteuid() != 0:
        pytest.skip("only a root runner's commands run as uid 0 in the instance")
    but = make_backend_under_test("singularity", tmp_path)
    before = os.stat("/dev/random").st_mode & 0o7777
    try:
        move = Move("/dev/random made unusable", f"{RIGHT}; chmod 0 /dev/random; true",
                    check=f"head -c 1 /dev/random > /dev/null && {CHECK}")
        [verdict] = run_moves(but, model, tmp_path, [move])
        assert os.stat("/dev/random").st_mode & 0o7777 == before
        assert verdict["status"] == "pass", [(c["error"], c["stderr"], c["stdout"], c["exit_code"]) for c in verdict["checks"]]
    finally:
        os.chmod("/dev/random", before)


def test_check_files_at_absolute_paths_are_refused_where_the_root_is_the_host_s(model, tmp_path):
    """A review: on the unisolated local backend the preparation would have emptied the host's own
    /tmp for a row with check_files at /tmp/..."""
    from tests.backend_harness import make_backend_under_test

    but = make_backend_under_test("local-unisolated", tmp_path)
    keep = tmp_path / "keep.txt"
    keep.write_text("still here")
    move = Move("absolute check files", WRONG, check="true", row={"check_files": {f"{tmp_path}/x.sh": "true\n"}})
    [verdict] = run_moves(but, model, tmp_path, [move])
    assert verdict["status"] == "error" and "a root of its own" in verdict["checks"][0]["error"]
    assert keep.read_text() == "still here"


# --- prompts that collude: in RL every prompt is the same policy, so one helping another is a strategy
HIDDEN_TEST = {"tests/test_hidden.py": "import unittest\n\nclass T(unittest.TestCase):\n    def test_it(self):\n"
                                       "        self.assertEqual(open('out.txt').read().strip(), '42')\n"}
HIDDEN_CHECK = "sleep 2; /usr/bin/python3 -I -m unittest discover -s tests -p test_hidden.py"
PASSING = "import unittest\\n\\nclass T(unittest.TestCase):\\n    def test_it(self):\\n        pass\\n"
# a directory's descriptor offered on an abstract unix socket to whoever asks, for a while
HAND_OVER = """import array, os, socket, sys, time
d = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
s = socket.socket(socket.AF_UNIX); s.bind("\\0hb-colluding"); s.listen(); s.settimeout(20)
while True:
    c, _ = s.accept(); socket.send_fds(c, [b"d"], [d]); c.close()
"""
# the accomplice: takes the descriptor, then keeps putting a passing test where the hidden one goes
SWAP = f"""import os, socket, sys, time
fd, ends = None, time.time() + float(sys.argv[1])
while fd is None and time.time() < ends - 10:
    try:
        s = socket.socket(socket.AF_UNIX); s.connect("\\0hb-colluding"); fd = socket.recv_fds(s, 10, 1)[1][0]
    except (OSError, IndexError):
        time.sleep(0.1)
print("got a descriptor" if fd is not None else "no descriptor", flush=True)
swapped = 0
while fd is not None and time.time() < ends:
    try:
        if b"pass" not in open("test_hidden.py", "rb", opener=lambda p, f: os.open(p, f, dir_fd=fd)).read():
            os.unlink("test_hidden.py", dir_fd=fd)
            w = os.open("test_hidden.py", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=fd)
            os.write(w, b"{PASSING}"); os.close(w); swapped += 1
    except OSError:
        pass
    time.sleep(0.01)
print("swapped", swapped)
"""

colluding_backend = each_backend(["local", "docker", "docker-gvisor", "singularity"])


@pytest.mark.parametrize("network", [False, True], ids=["no-network", "network"])
def test_no_prompt_hands_another_a_way_into_its_check(colluding_backend, network, model, tmp_path):
    """A review, with --network on the local backend: prompt B made its tests/ 0777 and handed a
    descriptor of it to prompt A over an abstract unix socket; once B's processes were ended, A put a
    passing test where the runner had written the hidden one. B's wrong answer passed. No socket of
    one prompt's reaches another's now, and the hidden test goes into a directory made afresh."""
    if network and colluding_backend.settings.runtime:
        pytest.skip("gVisor refuses --network here (tests/test_network_isolation.py)")
    b = script({"calls": [["terminal", {"command": f"{WRONG}; mkdir -p tests; chmod 777 tests; "
                                                   "nohup python3 hand_over.py tests >/dev/null 2>&1 & sleep 3"}]]},
               {"answer": "done"}, text="B")
    a = script({"calls": [["terminal", {"command": "python3 swap.py 25", "timeout": 60}]]}, {"answer": "done"}, text="A")
    rows = [{"prompt": b, "files": {"hand_over.py": HAND_OVER}, "check": HIDDEN_CHECK, "check_files": HIDDEN_TEST},
            {"prompt": a, "files": {"swap.py": SWAP}}]
    settled = run_episodes(colluding_backend, model.base_url, write_jsonl(tmp_path / "d.jsonl", rows), network=network,
                           check_retries=0)
    assert [s.outcome.kind for s in settled] == ["done", "done"], [s.outcome.error for s in settled]
    b_record, a_record = (json.loads(s.outcome.line) for s in settled)
    said = tool_results_in(a_record)[0]["content"]
    assert "no descriptor" in said, said
    assert b_record["verification"]["status"] == "fail", b_record["verification"]


def test_a_descriptor_of_the_agent_s_directory_kept_by_another_user_reaches_no_check_file(model, tmp_path):
    """Item 2 of the same review, on its own: even a descriptor of B's 0777 tests/ that another
    prompt's user holds (handed over as above, where a channel existed) reaches nothing the check
    reads, for the directory a check file goes to is a new one, writable by its owner alone."""
    import glob
    import subprocess
    import threading
    import time

    from tests.backend_harness import make_backend_under_test

    if os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"):
        pytest.skip("the accomplice is a user of its own (which needs root to be) running the system's python3")
    but = make_backend_under_test("local", tmp_path)
    b = script({"calls": [["terminal", {"command": f"{WRONG}; mkdir -p tests; chmod 777 tests; sleep 2"}]]},
               {"answer": "done"}, text="B")
    rows = [{"prompt": b, "check": HIDDEN_CHECK, "check_files": HIDDEN_TEST}]
    out: dict[str, str] = {}

    def accomplice() -> None:  # another prompt's user (a uid of its own), holding a descriptor of B's tests/
        ends = time.monotonic() + 60
        while not (found := glob.glob(str(tmp_path / "sandboxes" / "**" / "work" / "tests"), recursive=True)):
            if time.monotonic() > ends:
                return
            time.sleep(0.05)
        fd = os.open(found[0], os.O_RDONLY | os.O_DIRECTORY)
        try:
            res = subprocess.run(["/usr/bin/python3", "-c", SWAP.replace('fd, ends = None', f'fd, ends = {fd}'), "12"],
                                 pass_fds=(fd,), user=54321, group=54321, capture_output=True, text=True, timeout=60)
            out["said"] = res.stdout + res.stderr
        finally:
            os.close(fd)

    helper = threading.Thread(target=accomplice)
    helper.start()
    [settled] = run_episodes(but, model.base_url, write_jsonl(tmp_path / "d.jsonl", rows), check_retries=0)
    helper.join()
    assert "got a descriptor" in out.get("said", ""), out
    assert json.loads(settled.outcome.line)["verification"]["status"] == "fail", (out, settled.outcome.line[-2000:])
