"""Harbor task directories as a dataset, run on Docker: the image built from environment/, tests/
copied to /tests after the agent, and test.sh's reward file as the verdict."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.backend_harness import TEST_IMAGE, docker_status, unavailable
from tests.conftest import read_jsonl
from tests.scripted_model import script

TEST_SH = """#!/bin/bash
# as Harbor's tasks do: the verdict is the reward file, not the exit code
if [ "$(cat /app/answer.txt 2>/dev/null)" = "$(cat /tests/expected.txt)" ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
echo "checked in $(pwd) with MODE=$MODE"
"""


def make_task(root: Path, name: str, command: str) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    # the same for every task of a test (one image), another for every test: an image a killed earlier
    # run left behind (its tag is its content's) would otherwise be found, not built
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {TEST_IMAGE}\nLABEL hermes-batch-test={root}\nWORKDIR /app\nRUN echo seeded > /app/seed.txt\n")
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text(TEST_SH)
    (task / "tests" / "expected.txt").write_text("42\n")
    (task / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60.0\nenv = { MODE = "strict" }\n'
                                    "[agent]\ntimeout_sec = 120.0\n")
    (task / "instruction.md").write_text(script(
        {"calls": [["terminal", {"command": f"pwd; cat seed.txt; ls /tests 2>&1; {command}"}]]},
        {"answer": "{last_tool}"}, text=f"Task {name}: write 42 to answer.txt."))
    return task


@pytest.fixture
def tasks(tmp_path):
    why = docker_status()
    if why:
        unavailable("docker", why)
    root = tmp_path / "tasks"
    make_task(root, "solve-me", "echo 42 > answer.txt")
    make_task(root, "leave-me", "echo 41 > answer.txt")
    (root / "not-a-task").mkdir()  # no instruction.md: not a task
    yield root
    import docker

    client = docker.from_env()
    for image in client.images.list(filters={"label": "hermes-batch.built-from"}):
        if str(root) in image.labels.get("hermes-batch.built-from", ""):
            client.images.remove(image.id, force=True)
    client.close()


def test_a_directory_of_harbor_tasks_runs_on_docker_with_harbors_verdicts(cli, tasks):
    res = cli.run("tb", tasks, backend="docker", require_reasoning=False)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.count("built image hermes-batch-env:") == 1  # one environment, built once
    records = {r["metadata"]["dataset"]["harbor_name"]: r for r in read_jsonl(cli.run_dir("tb") / "trajectories.jsonl")}
    assert sorted(records) == ["leave-me", "solve-me"]
    solved, left = records["solve-me"], records["leave-me"]
    seen = solved["conversations"][-1]["value"]
    assert "/app" in seen and "seeded" in seen  # the image's WORKDIR and its files
    assert "test.sh" not in seen and "expected.txt" not in seen  # /tests was empty while the agent ran
    assert (solved["verification"]["status"], solved["verification"]["score"]) == ("pass", 1.0)
    assert (left["verification"]["status"], left["verification"]["score"]) == ("fail", 0.0)
    check = solved["verification"]["checks"][0]
    assert check["kind"] == "command" and "checked in /app with MODE=strict" in check["stdout"]
    assert solved["metadata"]["image"].startswith("hermes-batch-env:")
    again = cli.run("tb", tasks, resume=True, backend="docker", require_reasoning=False)
    assert again.returncode == 0 and "2 already done" in again.stderr, again.stderr[-2000:]


def test_harbor_tasks_on_a_backend_that_cannot_build_their_image_are_refused_before_any_model_call(cli, model, tasks):
    res = cli.run("tb-local", tasks, backend="local", require_reasoning=False)
    assert res.returncode == 1
    assert "run in an image built from a Dockerfile (Harbor tasks' environment/), which the local backend cannot " \
           "build: use --backend=docker" in res.stderr
    assert not model.requests


def test_a_broken_harbor_task_is_reported_by_name_and_the_others_run(cli, tasks):
    (tasks / "leave-me" / "task.toml").write_text("[verifier\n")
    res = cli.run("tb-broken", tasks, backend="docker", require_reasoning=False)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "harbor task 'leave-me': task.toml is not valid TOML" in res.stderr
    [only] = read_jsonl(cli.run_dir("tb-broken") / "trajectories.jsonl")
    assert only["metadata"]["dataset"]["harbor_name"] == "solve-me"
    assert json.loads(json.dumps(only["verification"]))["status"] == "pass"


def test_validate_runs_each_tasks_solution_and_tests_on_docker(tasks, tmp_path):
    """Harbor's oracle: solution/ copied to /solution and solve.sh run, then tests/test.sh; no model."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    for name, answer in (("solve-me", "42"), ("leave-me", "41")):
        (tasks / name / "solution").mkdir()
        (tasks / name / "solution" / "answer").write_text(answer + "\n")
        (tasks / name / "solution" / "solve.sh").write_text('cp "/solution/$ANSWER_FILE" /app/answer.txt\n')
        with open(tasks / name / "task.toml", "a") as f:  # Harbor's [solution.env] reaches solve.sh
            f.write('[solution.env]\nANSWER_FILE = "answer"\n')
    res = subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "validate", f"--dataset_file={tasks}",
                          "--backend=docker"], capture_output=True, text=True, timeout=600)
    table = {line.split()[1]: line.split()[2:5] for line in res.stdout.splitlines()[1:] if line.strip()}
    assert table == {"leave-me": ["fail,fail", "fail,fail", "broken"], "solve-me": ["fail,fail", "pass,pass", "ok"]}, \
        res.stdout + res.stderr
    assert res.returncode == 1 and "on docker" in res.stderr


REWARD_ON_SUCCESS = """#!/bin/bash
# a common style: a reward only when the tests pass; the exit code says nothing
[ -f /tests/conftest.sh ] && . /tests/conftest.sh  # as pytest reads a conftest.py it finds in /tests
if [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]; then echo 1 > /logs/verifier/reward.txt; fi
"""


def test_no_reward_file_is_never_a_pass_and_what_the_agent_put_in_tests_is_gone(cli, tasks):
    """A review: with no reward file the verdict fell back to test.sh's exit 0, so an agent that did
    nothing passed; one that planted /tests/conftest.sh passed too (and validate called the task ok)."""
    plant = ("echo 41 > answer.txt; mkdir -p /tests /logs/verifier; "
             "echo 'echo 1 > /logs/verifier/reward.txt; exit 0' > /tests/conftest.sh; echo 1 > /logs/verifier/reward.txt")
    for name, command in (("did-nothing", "true"), ("planted-tests", plant), ("did-it", "echo 42 > answer.txt")):
        make_task(tasks, name, command)
        (tasks / name / "tests" / "test.sh").write_text(REWARD_ON_SUCCESS)
    res = cli.run("tb", tasks, backend="docker", require_reasoning=False)
    assert res.returncode == 0, res.stderr[-3000:]
    records = {r["metadata"]["dataset"]["harbor_name"]: r["verification"]
               for r in read_jsonl(cli.run_dir("tb") / "trajectories.jsonl")}
    got = {name: (v["status"], v["score"]) for name, v in records.items()}
    assert got == {"did-nothing": ("fail", 0.0), "planted-tests": ("fail", 0.0), "did-it": ("pass", 1.0),
                   "solve-me": ("pass", 1.0), "leave-me": ("fail", 0.0)}, got
    assert "wrote no reward.txt or reward.json" in records["did-nothing"]["checks"][0]["error"]


def test_task_toml_is_applied_or_the_task_refused_by_name(cli, tasks):
    """A review ran real tasks: [environment.env] was ignored, the memory they asked for was not given,
    and a compose task ran without its services and just failed (a wrong verdict)."""
    memory = "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"  # v2, v1
    probe = make_task(tasks, "env-and-limits", f"echo \"AGENT_SEES=$GREETING\"; {memory}; echo 42 > answer.txt")
    (probe / "tests" / "test.sh").write_text('#!/bin/bash\n[ "$GREETING" = hello ] && [ "$(cat /app/answer.txt)" = 42 ] '
                                             '&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n')
    (probe / "task.toml").write_text('[environment]\nmemory_mb = 3072\nallow_internet = true\n'
                                     '[environment.env]\nGREETING = "hello"\n[verifier]\ntimeout_sec = 60.0\n')
    compose = make_task(tasks, "with-services", "true")
    (compose / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    stepped = make_task(tasks, "in-steps", "true")
    (stepped / "steps" / "one").mkdir(parents=True)
    as_user = make_task(tasks, "as-a-user", "true")
    (as_user / "task.toml").write_text('[agent]\nuser = "agent"\n')
    res = cli.run("toml", tasks, backend="docker", require_reasoning=False)
    assert res.returncode == 0, res.stderr[-3000:]
    for name, why in (("with-services", "environment/docker-compose.yaml: tasks of several containers are not run"),
                      ("in-steps", "a task of several steps is not run here"),
                      ("as-a-user", "task.toml's [agent] user is not applied here")):
        assert f"harbor task {name!r}: {why}" in res.stderr, res.stderr[-3000:]
    assert "task.toml settings not applied here (docs/verification.md has the table): [environment] allow_internet (1 task)" \
        in res.stderr
    records = {r["metadata"]["dataset"]["harbor_name"]: r for r in read_jsonl(cli.run_dir("toml") / "trajectories.jsonl")}
    assert sorted(records) == ["env-and-limits", "leave-me", "solve-me"]
    seen = records["env-and-limits"]["conversations"][-1]["value"]
    assert "AGENT_SEES=hello" in seen and str(3072 * 2**20) in seen, seen
    assert records["env-and-limits"]["verification"]["status"] == "pass"


def test_the_work_directory_is_the_built_image_s_own_workdir(cli, tasks):
    """A review: the Dockerfile's text was read, so `WORKDIR $VAR` (or one from the base image)
    fell back to /workspace and the agent never saw the task's files."""
    task = make_task(tasks, "var-workdir", "echo 42 > answer.txt")
    (task / "environment" / "Dockerfile").write_text(f"FROM {TEST_IMAGE}\nENV PROJECT=/srv/project\nWORKDIR $PROJECT\n"
                                                     "RUN echo seeded > seed.txt\n")
    (task / "tests" / "test.sh").write_text('#!/bin/bash\n[ "$(cat /srv/project/answer.txt)" = 42 ] && '
                                            'echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n')
    res = cli.run("wd", tasks, backend="docker", require_reasoning=False)
    assert res.returncode == 0, res.stderr[-3000:]
    records = {r["metadata"]["dataset"]["harbor_name"]: r for r in read_jsonl(cli.run_dir("wd") / "trajectories.jsonl")}
    seen = records["var-workdir"]["conversations"][-1]["value"]
    assert "/srv/project" in seen and "seeded" in seen, seen
    assert records["var-workdir"]["verification"]["status"] == "pass"


ENTRY_SH = """#!/bin/sh
set -e
# as Harbor task images do: root sets up and starts a service, then runs what it is given
n=0; (while :; do n=$((n+1)); echo $n > /run/svc.beat; sleep 0.1; done) &
echo "service started as $(id -u)" >&2
exec "$@"
"""


def test_a_task_s_image_runs_as_harbor_runs_it_entrypoint_as_root_and_a_test_that_switches_user(cli, tasks):
    """A review: the ENTRYPOINT ran as an unprivileged keeper with no capabilities, so an image whose
    entrypoint starts a service as root exited at once, and a test that runs a program as `nobody`
    could not switch user. The agent's root, meanwhile, must hold no capability."""
    task = make_task(tasks, "with-a-service", "grep CapBnd /proc/self/status > caps.txt; "
                     "su -s /bin/sh nobody -c true 2> su.txt; echo 42 > answer.txt; cat /run/svc.beat")
    (task / "environment" / "entry.sh").write_text(ENTRY_SH)
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {TEST_IMAGE}\nWORKDIR /app\nCOPY entry.sh /entry.sh\nRUN chmod +x /entry.sh\nENTRYPOINT [\"/entry.sh\"]\n")
    (task / "tests" / "test.sh").write_text(
        '#!/bin/bash\nb=$(cat /run/svc.beat); for i in $(seq 100); do sleep 0.1; [ "$(cat /run/svc.beat)" -gt "$b" ] && break; done\n'
        '[ "$(cat /run/svc.beat)" -gt "$b" ] || { echo service gone; exit 1; }\n'  # ten seconds: a loaded machine is slow
        'echo "as nobody: $(su -s /bin/sh nobody -c "id -u")"\n'
        'grep -q "CapBnd:.0000000000000000" /app/caps.txt && grep -q "not permitted" /app/su.txt && '
        '[ "$(cat /app/answer.txt)" = 42 ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n')
    res = cli.run("svc", tasks, backend="docker", require_reasoning=False)
    assert res.returncode == 0, res.stderr[-3000:]
    records = {r["metadata"]["dataset"]["harbor_name"]: r for r in read_jsonl(cli.run_dir("svc") / "trajectories.jsonl")}
    verdict = records["with-a-service"]["verification"]
    assert verdict["status"] == "pass", json.dumps(verdict)[-2000:]
    assert "as nobody: 65534" in verdict["checks"][0]["stdout"]
    assert (records["solve-me"]["verification"]["status"], records["leave-me"]["verification"]["status"]) == ("pass", "fail")


# --- the image's own HOME and PYTHONPATH, and Harbor's order of reward files --------------------
# (the test image has no git: a stand-in reads the identity from $HOME/.gitconfig, as git does, and
# fails as git does without one)
GIT_ID = """#!/usr/bin/python3
import configparser, os, sys
config = configparser.ConfigParser()
config.read(os.path.join(os.environ.get("HOME", "/"), ".gitconfig"))
if not config.has_option("user", "email"):
    sys.exit("fatal: unable to auto-detect email address")
print(config["user"]["email"])
"""
ANSWER = "echo \"$(git-id) $(python3 -c 'import probe_lib; print(probe_lib.GREETING)')\""
PROBE_TEST_SH = f"""#!/bin/bash
# as some tasks do: a placeholder reward.txt, the real reward (and others) in reward.json
want=$({ANSWER})
echo "want: $want; HOME=$HOME"
if [ "$(cat /app/answer.txt 2>/dev/null)" = "$want" ] && [ "$want" = "probe@example.com hello" ]; then r=1.0; else r=0.0; fi
echo 0 > /logs/verifier/reward.txt
echo "{{\\"reward\\": $r, \\"style\\": 0.0}}" > /logs/verifier/reward.json
"""
# planted by an agent where a check that took the agent's home or PYTHONPATH would load it: it
# writes a passing reward and kills the test before the test writes its own
FORGE_PY = ("import os; open('/logs/verifier/reward.json', 'w').write('{\\\"reward\\\": 1.0}'); "
            "os.killpg(0, 9)")


def probe_task(root: Path, name: str, command: str) -> Path:
    """A task like the probe behind issue 49: an image with a git identity in root's ~/.gitconfig and a
    PYTHONPATH (one directory of the image's, one the agent writes), a test.sh writing both reward files."""
    task = make_task(root, name, command)
    (task / "environment" / "git-id").write_text(GIT_ID)
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {TEST_IMAGE}\nLABEL hermes-batch-test={root}\n"
        "RUN printf '[user]\\nemail = probe@example.com\\n' > /root/.gitconfig\n"
        "COPY git-id /usr/local/bin/git-id\n"
        "RUN chmod +x /usr/local/bin/git-id && mkdir -p /opt/lib && echo 'GREETING = \"hello\"' > /opt/lib/probe_lib.py\n"
        "ENV PYTHONPATH=/opt/lib:/app\nWORKDIR /app\n")
    (task / "tests" / "test.sh").write_text(PROBE_TEST_SH)
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text(f"{ANSWER} > /app/answer.txt\n")
    return task


@pytest.fixture
def probe_root(tmp_path):
    why = docker_status()
    if why:
        unavailable("docker", why)
    root = tmp_path / "probes"
    yield root
    import docker

    client = docker.from_env()
    for image in client.images.list(filters={"label": "hermes-batch.built-from"}):
        if str(root) in image.labels.get("hermes-batch.built-from", ""):
            client.images.remove(image.id, force=True)
    client.close()


def test_validate_finds_a_task_ok_whose_image_sets_home_and_pythonpath_and_whose_test_writes_both_reward_files(probe_root):
    """Issue 49: the task's own solution failed (`fatal: unable to auto-detect email address`: its
    commands' HOME was not the image's, and its PYTHONPATH was lost), and reward.txt's placeholder 0
    was read before reward.json's 1.0, which Harbor's verifier (harbor 0.26.0) reads first."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    probe_task(probe_root, "probe", "true")
    res = subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "validate", f"--dataset_file={probe_root}",
                          "--backend=docker"], capture_output=True, text=True, timeout=600)
    table = {line.split()[1]: line.split()[2:5] for line in res.stdout.splitlines()[1:] if line.strip()}
    assert table == {"probe": ["fail,fail", "pass,pass", "ok"]}, res.stdout + res.stderr
    assert res.returncode == 0


def test_the_agent_works_in_the_image_s_home_and_the_check_reads_a_fresh_copy_of_it(cli, probe_root):
    """The agent's commands get the image's HOME (/root, theirs to write, as under Harbor) and its
    PYTHONPATH; the check gets a fresh copy of that home as the image has it and the PYTHONPATH's
    directories the agent cannot write: an identity the agent rewrote in ~/.gitconfig, a
    usercustomize in its home and a sitecustomize in /app (on the image's PYTHONPATH) are not read."""
    probe_task(probe_root, "honest", f"echo HOME=$HOME; cat ~/.gitconfig; {ANSWER} | tee answer.txt")
    user_site = "$(python3 -c 'import site; print(site.getusersitepackages())')"
    plant = (f"printf '[user]\\nemail = me@example.com\\n' > ~/.gitconfig; {ANSWER} > answer.txt; "
             f"mkdir -p {user_site}; for f in {user_site}/usercustomize.py /app/sitecustomize.py; do "
             f"echo {shlex.quote(FORGE_PY)} > $f; done; cat answer.txt; ls ~/.local/lib/*/site-packages")
    probe_task(probe_root, "forger", plant)
    res = cli.run("probe", probe_root, backend="docker", require_reasoning=False)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "its PYTHONPATH holds /app, which the agent's commands can write; checks run without it" in res.stderr
    records = {r["metadata"]["dataset"]["harbor_name"]: r for r in read_jsonl(cli.run_dir("probe") / "trajectories.jsonl")}
    honest, forger = records["honest"], records["forger"]
    seen = honest["conversations"][-1]["value"]
    assert "HOME=/root" in seen and "email = probe@example.com" in seen and "probe@example.com hello" in seen, seen
    assert "me@example.com hello" in forger["conversations"][-1]["value"]  # its home was its own to write
    assert "usercustomize.py" in forger["conversations"][-1]["value"]
    failed = forger["verification"]["checks"][0]
    assert (forger["verification"]["status"], failed["score"]) == ("fail", 0.0), failed
    assert "want: probe@example.com hello" in failed["stdout"]
    check = honest["verification"]["checks"][0]
    assert (honest["verification"]["status"], check["rewards"]) == ("pass", {"reward": 1.0, "style": 0.0}), check
    assert "want: probe@example.com hello; HOME=/tmp/hermes-check-" in check["stdout"]
