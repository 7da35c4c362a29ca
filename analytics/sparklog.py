"""Spark's own log (the JVM's log4j: its warnings, errors and their Java traces) goes to a
file that ``rpcbus analyze`` names, never to the terminal, where the job prints its
progress and at most one line of error.

``to_file()`` makes the file and the log4j2 configuration that writes to it, and
returns the Spark setting that hands it to the driver's JVM (before it starts; under
``spark-submit`` the JVM is up already and its own log4j configuration stays). In
local mode the executors run in that JVM and log there too.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

#: what the JVM prints at every start with Spark 4 (not worth keeping a log for)
_INCUBATOR = b"WARNING: Using incubator modules: jdk.incubator.vector\n"
_CONFIG = """\
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
"""


def to_file() -> tuple[str, dict[str, str]]:
    """A new log file (in the temporary directory) and the Spark settings that send the
    driver JVM's log there (its log4j2 configuration is a file beside it, which
    ``kept`` removes)."""
    fd, path = tempfile.mkstemp(prefix="rpcbus-analyze-", suffix=".log")
    os.close(fd)
    config = _config(path)
    with open(config, "w", encoding="utf-8") as f:
        f.write(_CONFIG.format(path=path))
    return path, {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{config}"}


def _config(path: str) -> str:
    return path.removesuffix(".log") + ".log4j2.properties"


def kept(path: str) -> bool:
    """Whether the log holds anything but the JVM's start-up line (else it is removed);
    its configuration file is removed either way (the JVM read it as it started)."""
    try:
        os.remove(_config(path))
    except OSError:
        pass
    try:
        with open(path, "rb") as f:
            head = f.read(len(_INCUBATOR) + 1)
        if head and head != _INCUBATOR:  # something besides the JVM's start-up line
            return True
        os.remove(path)
    except OSError:
        pass
    return False


def add(path: str, text: str) -> None:
    """``text`` at the end of the log: the error that stopped the job, with its Java
    trace (Spark logs an aborted job's reason in a line, without one)."""
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text.rstrip("\n") + "\n")
    except OSError:
        pass


@contextlib.contextmanager
def jvm_stderr_to(path: str) -> Iterator[None]:
    """A JVM started inside (pyspark starts the driver's as a child) writes its stderr to
    ``path``: what it prints before log4j is up (Spark 4's "WARNING: Using incubator
    modules") reaches the log, not the terminal. This process's stderr is back after."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
