"""Algorithmic tasks whose answer is exact (issue 44): generators, their tokenizer and their stream."""

from posab.data.tasks.example import TaskExample
from posab.data.tasks.generators import TASKS, Task, task_named
from posab.data.tasks.stream import TaskStream, example_batch
from posab.data.tasks.vocab import TaskTokenizer, TaskTracker

__all__ = [
    "TASKS",
    "Task",
    "TaskExample",
    "TaskStream",
    "TaskTokenizer",
    "TaskTracker",
    "example_batch",
    "task_named",
]
