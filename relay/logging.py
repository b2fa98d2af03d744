"""structlog set-up: JSON lines when stdout is not a terminal, readable console output when it is.

Lines are written to stderr by a thread of their own (the standard library's
QueueHandler and QueueListener): a write to a slow or stalled stderr (a disk
busy with a WAL checkpoint's flush, a pipe nobody reads) must not stop the
event loop.  The queue is bounded; a line that finds it full is dropped.
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue
import sys
import time

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_QUEUED_LINES = 10_000  # lines waiting for stderr, at most


class _DroppingQueueHandler(logging.handlers.QueueHandler):
    """A QueueHandler that never blocks: past `_QUEUED_LINES` waiting lines, new ones are dropped."""

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            pass


_stderr: logging.StreamHandler | None = None  # the listener's output, pointed at the current sys.stderr


def _start_writer() -> logging.StreamHandler:
    """Route the `relay` loggers through the bounded queue to a writer thread; flushed at exit."""
    lines: queue.Queue = queue.Queue(_QUEUED_LINES)
    out = logging.StreamHandler(sys.stderr)
    listener = logging.handlers.QueueListener(lines, out)
    listener.start()

    def stop() -> None:
        while lines.full():  # the end marker needs room like any line: let the writer catch up
            time.sleep(0.01)
        listener.stop()

    atexit.register(stop)
    logger = logging.getLogger("relay")
    logger.handlers[:] = [_DroppingQueueHandler(lines)]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)  # structlog's bound logger filters by the configured level
    return out


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog for this process; logs go to stderr, written off the calling thread.

    `fmt` is "json", "console", or "auto" (console on a terminal, else JSON).
    """
    global _stderr
    if _stderr is None:
        _stderr = _start_writer()
    else:
        _stderr.setStream(sys.stderr)
    as_json = fmt == "json" or (fmt == "auto" and not (sys.stdout is not None and sys.stdout.isatty()))
    processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if as_json:
        processors += [structlog.processors.dict_tracebacks, structlog.processors.JSONRenderer()]
    else:
        processors += [structlog.dev.ConsoleRenderer()]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
