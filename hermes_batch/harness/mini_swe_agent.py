"""mini-swe-agent (`mini-swe-agent` from PyPI), unmodified: its own loop, configuration, system
prompt and one tool (`bash`), run inside the prompt's sandbox, where its commands act.

A short driver (ours, below) builds it as its batch runners build one task's agent: its default
agent (`DefaultAgent`), the default configuration of its `mini` command (`mini.yaml`: a task of any
kind, where the SWE-bench one asks for a git patch of /testbed), its local environment (the sandbox,
in the prompt's work directory) and its litellm model, pointed at the interception endpoint as an
OpenAI-compatible server. Its steps are bounded by --max_turns; its cost limit is off (the run's
budgets hold); its model calls are not retried by it (the run's model client has retried them);
litellm keeps to its bundled model map. Its state (`MSWEA_GLOBAL_CONFIG_DIR`) is a fresh directory
of the prompt's own.

Its loop ends when a command prints `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`: that call's result is
never sent to the model, so the driver leaves it, rendered by its own template, with how the loop
ended (`Ending`), and the record keeps the submitting turn answered."""

from __future__ import annotations

import json

from .base import Harness, Start

_DRIVER = r'''import json, os, sys
spec = json.load(open(sys.argv[1]))
os.environ.pop("PYTHONPATH", None)  # its commands run with the sandbox's own Python path, not the harness's
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import builtin_config_dir, get_config_from_spec
from minisweagent.environments.local import LocalEnvironment
from minisweagent.exceptions import Submitted
from minisweagent.models import get_model
from minisweagent.utils.serialize import recursive_merge


class Environment(LocalEnvironment):
    """Its local environment, keeping what each call's command printed for the end."""

    outputs = {}

    def execute(self, action, cwd="", **kwargs):
        try:
            output = super().execute(action, cwd, **kwargs)
        except Submitted as end:  # what its command printed, less the line the submission drops
            self.outputs[action.get("tool_call_id")] = {
                "output": "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n" + end.messages[0]["content"], "returncode": 0,
                "exception_info": ""}
            raise
        self.outputs[action.get("tool_call_id")] = output
        return output


# its own file, by path: never a mini.yaml of the work directory's
config = recursive_merge(get_config_from_spec(builtin_config_dir / spec["config"]), spec["settings"])
model = get_model(config=config.get("model", {}))
env = Environment(**config.get("environment", {}))
agent = DefaultAgent(model, env, **config.get("agent", {}))
status, unsent = "crashed", []
try:
    status = agent.run(spec["prompt"]).get("exit_status") or "ended"
    if status == "Submitted":  # the results of the reply that submitted, as it would have sent them
        reply = [m for m in agent.messages if m.get("role") == "assistant"][-1]
        outputs = []
        for action in reply.get("extra", {}).get("actions", []):
            if action.get("tool_call_id") not in env.outputs:
                break
            outputs.append(env.outputs[action.get("tool_call_id")])
        unsent = [{k: v for k, v in m.items() if k != "extra"}
                  for m in model.format_observation_messages(reply, outputs, agent.get_template_vars())]
except Exception as exc:
    status = type(exc).__name__
    raise
finally:
    with open(os.path.join(os.path.dirname(sys.argv[1]), "ending.json"), "w") as f:
        json.dump({"status": status, "finished": status == "Submitted", "unsent": unsent}, f)
'''


class MiniSweAgent(Harness):
    name = "mini-swe-agent"
    package = "mini-swe-agent"
    default_version = "2.4.6"
    python = (3, 11)  # its dependencies' wheels (pydantic-core, tiktoken, tokenizers, ...) are built per Python
    own_tools = "bash"

    def start(self, *, prompt: str, task_id: str, model: str, base_url: str, key: str, toolsets: list[str],
              max_calls: int, home: str) -> Start:
        settings = {"agent": {"step_limit": max_calls, "cost_limit": 0},
                    "model": {"model_name": f"openai/{model}", "model_kwargs": {"api_base": base_url, "api_key": key}}}
        spec = {"prompt": prompt, "config": "mini.yaml", "settings": settings}
        return Start(files={"drive.py": _DRIVER.encode(), "spec.json": json.dumps(spec).encode()},
                     argv=["python3", "{dir}/drive.py", "{dir}/spec.json"], ending="ending.json",
                     env={"MSWEA_GLOBAL_CONFIG_DIR": home, "MSWEA_SILENT_STARTUP": "1",
                          "MSWEA_COST_TRACKING": "ignore_errors", "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",
                          "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_OFFLINE_MODE": "true",
                          "PYTHONUNBUFFERED": "1"})
