"""Harbor task directories (Terminal-Bench 2, the Harbor adapters' suites) as a dataset.

    task/instruction.md         the prompt
    task/task.toml              [verifier] timeout_sec, env; [agent] timeout_sec;
                                [environment] docker_image, workdir
    task/environment/Dockerfile the image, built once per distinct directory on docker
    task/tests/test.sh          the check: copied with the rest of tests/ to /tests after the agent,
                                it writes /logs/verifier/reward.txt or reward.json
    task/solution/solve.sh      the reference solution (copied to /solution): only `validate` runs it
    [[environment.mcp_servers]] the task's MCP servers, its agent's tools (tools/mcp): a stdio one runs
                                in the task's container, one by URL is reached from the runner

`--dataset_file=DIR` names one task directory or a directory of them. Each becomes a row
`{"prompt": <instruction>, "harbor_task": <its absolute path>, "harbor_name": <its name>}` in the run's own
`harbor_tasks.jsonl`, which the run then reads as any dataset; `task.read_task` turns
`harbor_task` into the row's task (`harbor_task`).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from ..errors import UserError

ROWS_FILE = "harbor_tasks.jsonl"
TESTS_AT = "/tests"  # where Harbor's verifier finds its tests
SOLUTION_AT = "/solution"  # where Harbor's oracle agent finds solve.sh (`validate` runs it)
DEFAULT_VERIFIER_TIMEOUT = 600.0  # Harbor's own default
DEFAULT_MEMORY, DEFAULT_CPUS = "2048m", 1.0  # Harbor's, for a task.toml that says none (above --memory's 1g)
# task.toml settings that change what a task is: a task asking for one is refused, by name
REFUSED = {
    ("environment", "gpus"): "no sandbox here has a GPU",
    ("environment", "skills_dir"): "skills are not given to the agent",
    ("agent", "user"): "the agent's commands run as the image's user",
    ("verifier", "user"): "the tests run as the image's user",
}
# settings that do not change a verdict here, said once at the start
NOT_APPLIED = (("environment", "build_timeout_sec"), ("environment", "healthcheck"), ("environment", "storage_mb"),
               ("environment", "allow_internet"), ("environment", "network_mode"), ("verifier", "collect"),
               ("artifacts", None), ("environment_mode", None))


def is_task_dir(path: Path) -> bool:
    return (path / "instruction.md").is_file() and (path / "tests").is_dir()


def task_dirs(root: Path) -> list[Path]:
    """`root` itself if it is a task directory, else the task directories in it, by name."""
    if is_task_dir(root):
        return [root]
    return sorted(p for p in root.iterdir() if p.is_dir() and is_task_dir(p))


def write_rows(root: Path, run_dir: Path) -> Path:
    """The tasks under `root` as the run's JSONL dataset (rewritten only when it changed, so a
    resume reads the same file)."""
    tasks = task_dirs(root)
    if not tasks:
        raise UserError(f"{root} is a directory but holds no Harbor task directories (each needs instruction.md "
                        "and tests/; a dataset file is JSONL)")
    lines = []
    for task in tasks:
        try:
            prompt = (task / "instruction.md").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            prompt = f"(unreadable instruction.md: {exc})"  # the row is then reported, by task.read_task
        row = {"prompt": prompt, "harbor_task": str(task.resolve()), "harbor_name": task.name}
        lines.append(json.dumps(row, ensure_ascii=False))
    data = ("\n".join(lines) + "\n").encode()
    path = run_dir / ROWS_FILE
    if not path.exists() or path.read_bytes() != data:
        from ..util import atomic_write

        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)
    return path


def read_config(task: Path) -> dict[str, Any]:
    """task.toml's tables (absent: Harbor's defaults)."""
    path = task / "task.toml"
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"task.toml is not valid TOML ({exc})") from None


def unsupported(task: Path, config: dict[str, Any]) -> str | None:
    """Why this task cannot be run as Harbor runs it here (its sidecars, steps, MCP servers...), or None."""
    for name in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml"):
        if (task / "environment" / name).is_file():
            return (f"environment/{name}: tasks of several containers are not run here (without its services the "
                    "task would fail for that, not for the agent's work)")
    if (task / "steps").is_dir() or config.get("steps"):
        return "a task of several steps is not run here (its later steps would never be checked)"
    for (table, key), why in REFUSED.items():
        if (config.get(table) or {}).get(key):
            return f"task.toml's [{table}] {key} is not applied here: {why}"
    return None


def not_applied(config: dict[str, Any]) -> list[str]:
    """The task.toml settings this task has that this runner does not apply, as `[table] key`."""
    found = []
    for table, key in NOT_APPLIED:
        section = config.get(table)
        if key is None and section:
            found.append(table)
        elif key is not None and isinstance(section, dict) and key in section:
            found.append(f"[{table}] {key}")
    return found


def variables(table: dict[str, Any], name: str) -> dict[str, str]:
    """A table's `env`: its variables as text."""
    env = table.get("env") or {}
    if not isinstance(env, dict):
        raise ValueError(f"[{name}] env must be a table of variables, got {env!r}")
    return {str(k): str(v) for k, v in env.items()}
