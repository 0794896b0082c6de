"""Claude Code (`@anthropic-ai/claude-code` from the npm registry), unmodified: its own loop, system
prompt, tools and their schemas, run in print mode inside the prompt's sandbox, where its Bash,
Read, Write and Edit tools act.

Its Linux build is a self-contained executable (a glibc one, as its optional package
`@anthropic-ai/claude-code-linux-x64` or `-arm64`): the sandbox needs no Node.js, only a glibc
userland and a writable HOME, a fresh directory of the prompt's own (its settings and sessions).
Its model is the interception endpoint, spoken to as Anthropic's Messages API under the prompt's
key; its telemetry, error reports, update checks and other non-essential traffic are off. It runs
with its permission prompts skipped (the sandbox is the boundary, as its `IS_SANDBOX` says), at most
--max_turns turns."""

from __future__ import annotations

import platform
import shlex

from .base import Harness, Start

ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}


def binary() -> str:
    """Where a sandbox finds the executable in the install (the machine's own architecture: sandboxes share it)."""
    arch = ARCH.get(platform.machine().lower(), platform.machine())
    return f"{{harness}}/node_modules/@anthropic-ai/claude-code-linux-{arch}/claude"


class ClaudeCode(Harness):
    name = "claude-code"
    package = "@anthropic-ai/claude-code"
    installer = "npm"
    default_version = "2.1.332"
    own_tools = "Bash, Read, Write, Edit, Glob, Grep and its others"  # --toolsets do not reach it

    def start(self, *, prompt: str, task_id: str, model: str, base_url: str, key: str, toolsets: list[str],
              max_calls: int, home: str) -> Start:
        run = [binary(), "-p", "--output-format", "json", "--dangerously-skip-permissions", "--model", model,
               "--max-turns", str(max_calls)]
        return Start(files={"prompt.txt": prompt.encode()},
                     argv=["sh", "-c", f"mkdir -p {shlex.quote(home)} && exec {shlex.join(run)} < {{dir}}/prompt.txt"],
                     env={"HOME": home, "ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"), "ANTHROPIC_API_KEY": key,
                          "ANTHROPIC_SMALL_FAST_MODEL": model, "IS_SANDBOX": "1",
                          "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
                          "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_BUG_COMMAND": "1"})
