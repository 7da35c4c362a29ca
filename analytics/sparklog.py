"""Spark's own log (the JVM's log4j: its warnings, errors and their Java traces) goes to a
file that ``rpcbus analyze`` names, never to the terminal, where the job prints its
progress and at most one line of error.

``to_file()`` makes the file and the log4j2 configuration that writes to it, and
returns the Spark setting that hands it to the driver's JVM (before it starts; under
``spark-submit`` the JVM is up already and its own log4j configuration stays). In
local mode the executors run in that JVM and log there too.
"""

from __future__ import annotations

import os
import tempfile

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
    """Whether the log holds anything (an empty one is removed); its configuration file
    is removed either way (the JVM read it as it started)."""
    try:
        os.remove(_config(path))
    except OSError:
        pass
    try:
        if os.path.getsize(path) > 0:
            return True
        os.remove(path)
    except OSError:
        pass
    return False
