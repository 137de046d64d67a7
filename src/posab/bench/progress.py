"""Where a benchmark run stands, on stderr: tqdm bars on a terminal, one line per case otherwise."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import TypeVar

from tqdm import tqdm

Item = TypeVar("Item")


def describe(item: object) -> str:
    """A case as the progress shows it: ("multiscale", 512) -> "multiscale 512"."""
    return " ".join(str(part) for part in item) if isinstance(item, tuple) else str(item)


class Progress:
    """A bar over the sections and, below it, one over the running section's cases (`bars`, the default
    on a terminal); without bars (stderr not a terminal, `--no-progress`) a line per case and note."""

    def __init__(self, bars: bool) -> None:
        self.bars = bars
        self.current: tqdm | None = None  # the innermost open bar

    @staticmethod
    def default() -> bool:
        """Bars when stderr is a terminal."""
        return sys.stderr.isatty()

    def over(self, items: Sequence[Item], what: str, keep: bool = False) -> Iterator[Item]:
        """`items` one by one, each shown as `what: item`; the bar stays on screen at the end when `keep`."""
        if not self.bars:
            for item in items:
                self.note(f"{what}: {describe(item)}")
                yield item
            return
        outer, bar = self.current, tqdm(items, desc=what, leave=keep, dynamic_ncols=True)
        self.current = bar
        try:
            for item in bar:
                bar.set_postfix_str(describe(item))
                yield item
        finally:
            bar.close()
            self.current = outer

    def note(self, text: str) -> None:
        """What is running now, within the current case: on the innermost bar, or as a line."""
        if self.current is not None:
            self.current.set_postfix_str(text)
        else:
            print(text, file=sys.stderr, flush=True)
