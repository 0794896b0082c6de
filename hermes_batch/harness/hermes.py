"""The Hermes Agent (`hermes-agent` from PyPI), unmodified: its own loop, system prompt, tool
schemas and tools, run inside the prompt's sandbox, where its terminal and file tools act.

A short driver (ours, below) builds its agent as its own batch runner does (`run_agent.AIAgent`:
the model at the interception endpoint, the prompt's sampled toolsets as its enabled toolsets, its
iterations bounded by --max_turns, no context files, no memory) and runs one conversation; its
state (`HERMES_HOME`) is a directory of the prompt's own, empty or the row's `agent_home` (whose
config.yaml then decides on memory, as a user's would)."""

from __future__ import annotations

import json

from .base import Harness, Start

# this product's toolsets as the Hermes Agent names them (its `toolsets.py`)
TOOLSETS = {"terminal": "terminal", "file": "file", "code": "code_execution", "web": "web", "vision": "vision",
            "image_gen": "image_gen", "browser": "browser", "tts": "tts"}

_DRIVER = r'''import json, os, sys
spec = json.load(open(sys.argv[1]))
from run_agent import AIAgent
home = os.environ["HERMES_HOME"]
seeded = os.path.isdir(home) and bool(os.listdir(home))  # a row's agent_home: its config decides on memory
agent = AIAgent(base_url=spec["base_url"], api_key=spec["key"], model=spec["model"],
                max_iterations=spec["max_iterations"], enabled_toolsets=spec["toolsets"], save_trajectories=False,
                quiet_mode=True, skip_context_files=True, skip_memory=not seeded)
result = agent.run_conversation(spec["prompt"], task_id=spec["task_id"])
print(json.dumps({"completed": bool(result.get("completed")), "final_response": result.get("final_response")}))
'''


class Hermes(Harness):
    name = "hermes"
    package = "hermes-agent"
    default_version = "0.19.0"
    python = (3, 11)

    def start(self, *, prompt: str, task_id: str, model: str, base_url: str, key: str, toolsets: list[str],
              max_calls: int, home: str) -> Start:
        spec = {"prompt": prompt, "task_id": task_id, "model": model, "base_url": base_url, "key": key,
                "toolsets": sorted({TOOLSETS[t] for t in toolsets if t in TOOLSETS}), "max_iterations": max_calls}
        return Start(files={"drive.py": _DRIVER.encode(), "spec.json": json.dumps(spec).encode()},
                     argv=["python3", "{dir}/drive.py", "{dir}/spec.json"],
                     env={"HERMES_HOME": home, "HERMES_QUIET": "1", "PYTHONUNBUFFERED": "1"})
