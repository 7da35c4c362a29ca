"""structlog set-up: JSON lines when stderr is not a terminal, readable lines when it is."""

from __future__ import annotations

import logging
import sys

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO,
           "warning": logging.WARNING, "error": logging.ERROR}


def configure(level: str = "info", fmt: str = "auto", **context: str) -> None:
    """Route structlog (and the standard library's warnings) to stderr.

    ``fmt`` is ``json``, ``console`` or ``auto`` (console on a terminal).
    ``context`` is bound to every line (the node's name, for instance).
    """
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer = (structlog.processors.JSONRenderer() if fmt == "json"
                else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(**context)
    logging.basicConfig(level=max(logging.WARNING, _LEVELS[level]), stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
