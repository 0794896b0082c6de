"""What a harness is to the runner: a package installed once (install.py), and how one prompt runs
it inside its sandbox: the files and command that start it with the prompt as its task, its model at
the interception endpoint (intercept.py) under the prompt's own key, and the toolsets it is given."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass
class Start:
    """One prompt's harness start: files the runner writes into the sandbox's scratch, then the
    command it runs there as the agent's commands run (in the work directory)."""

    files: dict[str, bytes]  # name (in a scratch directory of the harness's own) -> content
    argv: list[str]  # `{dir}` in a word stands for that directory; `{harness}`, where the sandbox sees the install
    env: dict[str, str]
    ending: str | None = None  # a file (in that directory) where its driver leaves how its loop ended


@dataclass
class Ending:
    """How a harness's own loop ended, as its driver left it: in its own words (`status`); whether
    by its own rule for a finished task (a submission), not a limit or an error; and the messages
    it made from its last reply's results and never sent (its loop stopped there)."""

    status: str
    finished: bool
    unsent: list[dict[str, Any]]


class Harness:
    name: ClassVar[str]
    package: ClassVar[str]  # on the package index
    installer: ClassVar[str] = "pip"  # or "npm" (the npm registry's package)
    default_version: ClassVar[str]
    python: ClassVar[tuple[int, int] | None] = None  # the sandbox's python3 it needs (its wheels' ABI)
    # its own fixed tools, when it brings them (then --toolsets and --distribution are refused); None:
    # it is given each prompt's sampled toolsets
    own_tools: ClassVar[str | None] = None

    def requirement(self, version: str) -> str:
        return f"{self.package}@{version}" if self.installer == "npm" else f"{self.package}=={version}"

    def start(self, *, prompt: str, task_id: str, model: str, base_url: str, key: str, toolsets: list[str],
              max_calls: int, home: str) -> Start:
        """How to run it on `prompt`, its model at `base_url` with `key`; `home`: where its state lives."""
        raise NotImplementedError
