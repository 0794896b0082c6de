"""Rollouts for trainers: groups of samples of a dataset's prompts, each through the same sandbox →
agent → check → record as a batch run, token-exact, and handed back as token sequences with their
rewards (`Rollouts`, `Rollout`, `Step`). Each step is a run of its own under the run's directory, so
a killed trainer loses no finished rollout. TRL's face is `trl.TRLRollouts` (the `[rl]` extra, imported
only when used); `write_gguf` turns a policy's weights into the file the embedded llama.cpp serves."""

from .engine import Rollout, Rollouts, Step
from .gguf import write_gguf

__all__ = [
    "Rollout",
    "Rollouts",
    "Step",
    "write_gguf",
]
