"""Progress display for the slow steps that are not training (first-run data preparation).

A step that can take more than a few seconds (encoding a corpus into the embedding cache,
parsing the standard library into query -> code pairs) first prints one line saying what it
does and where its result is cached, then a ``tqdm`` bar (count, rate, elapsed and remaining
time) on standard error. The bar shows in a terminal and in a log file alike; when standard error
is not a terminal it is redrawn at most every :data:`LOG_INTERVAL` seconds, so logs stay short.

``LOSSES_PROGRESS=0`` in the environment (or ``progress=False`` where a function takes it)
turns both the line and the bar off.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

__all__ = ["PROGRESS_ENV", "progress_enabled", "progress_bar", "progress_note"]

PROGRESS_ENV = "LOSSES_PROGRESS"  #: ``0`` / ``false`` / ``no`` / ``off`` turns progress output off
TTY_INTERVAL = 0.5  #: seconds between redraws in a terminal
LOG_INTERVAL = 10.0  #: seconds between redraws when standard error is a file or a pipe


def progress_enabled(progress: Optional[bool] = None) -> bool:
    """``progress`` if given, else whether ``$LOSSES_PROGRESS`` leaves progress output on."""
    if progress is not None:
        return bool(progress)
    return os.environ.get(PROGRESS_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def progress_note(message: str, progress: Optional[bool] = None) -> None:
    """Print ``message`` on standard error (the line before a bar) unless progress is off."""
    if progress_enabled(progress):
        print(message, file=sys.stderr, flush=True)


def progress_bar(total: int, desc: str, unit: str, progress: Optional[bool] = None):
    """A ``tqdm`` bar on standard error for ``total`` steps of ``unit`` (disabled when progress is off).

    Use it as a context manager and call ``update(n)``; it closes showing ``total/total``.
    """
    from tqdm import tqdm

    stream = sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return tqdm(total=int(total), desc=desc, unit=unit, unit_scale=False, file=stream,
                disable=not progress_enabled(progress), mininterval=TTY_INTERVAL if tty else LOG_INTERVAL,
                maxinterval=max(LOG_INTERVAL, 10.0), dynamic_ncols=tty, ncols=None if tty else 100,
                leave=True)
