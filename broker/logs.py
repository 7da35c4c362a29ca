"""structlog set-up: JSON lines when stderr is not a terminal, readable lines when it is.

Every module logs through ``structlog.get_logger(module="rpcbus.<module>")``, so
each line names its module; ``levels`` (``[log] levels``) sets a level per
module prefix (the longest matching prefix wins; others use ``level``).
Nothing is logged per successful call at ``info``: per-call events are warnings
and are throttled (counters in /stats and /metrics have them all).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Mapping

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO,
           "warning": logging.WARNING, "error": logging.ERROR}


def _by_module(default: int, levels: Mapping[str, str]) -> Any:
    """A processor dropping lines below their module's level."""
    prefixes = sorted(((p, _LEVELS[v]) for p, v in levels.items()),
                      key=lambda pv: len(pv[0]), reverse=True)
    cache: dict[str, int] = {}

    def drop_below(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        name = event.get("module", "")
        floor = cache.get(name)
        if floor is None:
            floor = next((lvl for p, lvl in prefixes if name == p or
                          name.startswith(p + ".")), default)
            cache[name] = floor
        if _LEVELS.get(method, logging.ERROR) < floor:
            raise structlog.DropEvent
        return event

    return drop_below


def configure(level: str = "info", fmt: str = "auto",
              levels: Mapping[str, str] | None = None, **context: str) -> None:
    """Route structlog (and the standard library's warnings) to stderr.

    ``fmt`` is ``json``, ``console`` or ``auto`` (console on a terminal).
    ``context`` is bound to every line (the node's name, for instance).
    """
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer = (structlog.processors.JSONRenderer() if fmt == "json"
                else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    levels = dict(levels or {})
    lowest = min([_LEVELS[level], *(_LEVELS[v] for v in levels.values())])
    structlog.configure(
        processors=[
            *([_by_module(_LEVELS[level], levels)] if levels else []),
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lowest),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(**context)
    logging.basicConfig(level=max(logging.WARNING, _LEVELS[level]), stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
