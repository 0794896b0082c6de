"""Telling a right trajectory from a wrong one (docs/verification.md): what a row asks (`Task`, read by
`read_task`), its answer checks (`answers`), its command checks run in the sandbox and the verdict
they add up to (`verdict`), the model judge of a rubric (`Judge`), and Harbor's task format and reward
contract (`harbor`). Nothing here runs the agent or writes a run's files."""

from .answers import normalised
from .judge import Judge
from .settings import CheckSettings
from .task import CHECK_KEYS, TASK_KEYS, Task, TaskError, directory_digests, read_task, source_directories
from .verdicts import CheckResult, Verdict, check_answer, check_command, verdict, write_files

__all__ = [
    "CHECK_KEYS",
    "CheckResult",
    "CheckSettings",
    "Judge",
    "TASK_KEYS",
    "Task",
    "TaskError",
    "Verdict",
    "check_answer",
    "check_command",
    "directory_digests",
    "normalised",
    "read_task",
    "source_directories",
    "verdict",
    "write_files",
]
