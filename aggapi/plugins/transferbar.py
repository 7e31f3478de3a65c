"""The copy plugin's progress bar: bytes, speed and ETA of one copy."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


class TransferBar:
    """A rich bar for one copy (the aggapi.client.copy Progress protocol)."""

    def __init__(self, label: str, console: Console | None = None) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(bar_width=30), TaskProgressColumn(),
            DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
            console=console or Console(stderr=True), refresh_per_second=8)
        self.task = self.progress.add_task(label, total=None)
        self.progress.start()

    def start(self, total: int | None, done: int = 0) -> None:
        self.progress.reset(self.task, total=total, completed=done)

    def advance(self, n: int) -> None:
        self.progress.advance(self.task, n)

    def close(self, ok: bool = True) -> None:
        task = self.progress.tasks[0]
        if ok and task.total is None:  # a directory: its size is known only at the end
            self.progress.update(self.task, total=task.completed)
        self.progress.stop()
