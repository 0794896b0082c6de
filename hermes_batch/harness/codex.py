"""Codex (`@openai/codex` from the npm registry), unmodified: its own loop, instructions, tools and
their schemas, run as `codex exec` inside the prompt's sandbox, where its shell tool acts.

Its Linux build is a statically linked executable (musl; the package's optional dependency
`@openai/codex-linux-x64` or `-arm64`), so any Linux sandbox runs it, with a writable home of the
prompt's own (`CODEX_HOME`: its sessions). Its model is the interception endpoint as a model
provider of its own speaking OpenAI's Responses API under the prompt's key (set by `-c`, no file);
update checks and analytics off. Approvals and its own sandbox are bypassed: the prompt's sandbox
is the boundary (its own is not tried inside it). Its calls are capped by the endpoint
(--max_turns), as it has no limit of its own to set."""

from __future__ import annotations

import platform
import shlex

from .base import Harness, Start

TRIPLE = {"x86_64": ("x64", "x86_64"), "amd64": ("x64", "x86_64"), "aarch64": ("arm64", "aarch64"),
          "arm64": ("arm64", "aarch64")}
KEY_VARIABLE = "HERMES_BATCH_HARNESS_KEY"


def vendor() -> str:
    """Its executables' directory in the install (the machine's own architecture: sandboxes share it)."""
    arch, cpu = TRIPLE.get(platform.machine().lower(), (platform.machine(), platform.machine()))
    return f"{{harness}}/node_modules/@openai/codex-linux-{arch}/vendor/{cpu}-unknown-linux-musl"


class Codex(Harness):
    name = "codex"
    package = "@openai/codex"
    installer = "npm"
    default_version = "0.171.0"
    own_tools = "exec_command, write_stdin, view_image and its others"  # --toolsets do not reach it

    def start(self, *, prompt: str, task_id: str, model: str, base_url: str, key: str, toolsets: list[str],
              max_calls: int, home: str) -> Start:
        provider = (f'{{name="hermes-batch", base_url="{base_url}", env_key="{KEY_VARIABLE}", '
                    'wire_api="responses"}')
        run = [f"{vendor()}/bin/codex", "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
               "--model", model, "-c", "model_provider=hermes-batch", "-c", f"model_providers.hermes-batch={provider}",
               "-c", "check_for_update_on_startup=false", "-c", "analytics.enabled=false", "-"]
        return Start(files={"prompt.txt": prompt.encode()},
                     argv=["sh", "-c", f"mkdir -p {shlex.quote(home)} && PATH={vendor()}/codex-path:$PATH "
                                       f"exec {shlex.join(run)} < {{dir}}/prompt.txt"],
                     env={"HOME": home, "CODEX_HOME": home, KEY_VARIABLE: key})
