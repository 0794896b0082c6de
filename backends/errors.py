"""What a sandbox's failures are called: their own file, so every backend module (egress.py too)
takes them without importing base.py."""


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, lost its container, ...): not the code's fault."""


class SandboxExhausted(SandboxError):
    """The sandbox ended, or cannot run the runner's commands, through what ran in it (its memory used
    up, each new process killed): the agent's doing."""


class ImageUnavailable(SandboxError):
    """The image a prompt asked for cannot be had (not present locally and cannot be pulled)."""
