"""chassis-worker's consumer side: the daemon, and what a tool declares for it."""

from .declarations import Handler, JobDeclaration, JobInfo, QueueOptions, Schedule

__all__ = ["Handler", "JobDeclaration", "JobInfo", "QueueOptions", "Schedule"]
