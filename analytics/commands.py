"""``rpcbus analyze``, ``rpcbus analyze-bundle`` and ``rpcbus history-gen`` (registered as
``rpcbus.commands`` entry points: the node's CLI finds them without importing this layer)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import time
import zipfile
from datetime import datetime

import click

NOTHING_TO_ANALYSE = 3  # exit status: no usable history row (in the span asked for)


def _iso(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            datetime.fromisoformat(value)
        except ValueError:
            raise click.BadParameter(f"{value!r} is no ISO date/time "
                                     "(2026-11-23 or 2026-11-23T10:00)") from None
    return value


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--history", required=True,
              help="The nodes' history directory (or any path Spark reads: hdfs://, s3a://).")
@click.option("--out", required=True, help="The directory the tables and weights.json go to.")
@click.option("--since", callback=_iso, help="First window to include (ISO date/time, UTC).")
@click.option("--until", callback=_iso,
              help="End of the windows to include (ISO date/time, UTC, exclusive).")
@click.option("--master", default=None,
              help="Spark master [local[*]; under spark-submit, its --master].")
@click.option("--half-life", type=click.FloatRange(min=0, min_open=True), default=3600.0,
              show_default=True, help="Seconds: half-life of old minutes in the weights.")
@click.option("--format", "fmt", type=click.Choice(["auto", "json", "parquet"]),
              default="auto", show_default=True,
              help="History files: JSON lines (the nodes') or Parquet.")
@click.option("--report-dir", default=None, help="A local directory for report.html and the "
              "charts [OUT/report; needed when OUT is not local].")
@click.option("--no-report", is_flag=True, help="Tables and weights only.")
def analyze(history: str, out: str, since: str | None, until: str | None, master: str | None,
            half_life: float, fmt: str, report_dir: str | None, no_report: bool) -> None:
    """PySpark job over the nodes' provider load history.

    \b
    Writes under --out:
      per_minute, per_hour  Parquet: per provider, rpc and node: calls, outcomes,
                            rates, peak in flight, bytes, latency p50/p95/p99
      per_provider          the same over the whole span
      fairness, outliers, hot_rpcs, peak_minutes, weights
                            Parquet: the findings
      weights.json          recommended weights (the node's rpc.weights_file)
      report/report.html    the findings in words, with charts

    On a Spark cluster: rpcbus analyze-bundle prints the spark-submit line.

    Exit status: 0 analysed; 1 Spark failed (the reason in one line); 2 a usage
    mistake, found before Spark starts (no history at the path, a history file that
    cannot be read, an output that cannot be written); 3 no usable row in the
    history or span.
    """
    missing = [name for name in ("pyspark", "pyarrow") if importlib.util.find_spec(name) is None]
    if missing:   # said in one line, before anything imports them
        raise click.ClickException(
            f"rpcbus analyze needs {' and '.join(missing)}: pip install 'rpcbus[spark]'")
    if "://" in out and not out.startswith("file://") and not report_dir and not no_report:
        raise click.UsageError("--out is not a local path: give --report-dir (local) "
                               "or --no-report")
    if ("://" not in history or history.startswith("file://")) and not os.path.exists(
            history.removeprefix("file://")):
        raise _Mistake(f"no history at {history}: give the nodes' history directory "
                       "(their history.dir)")
    if not _java():
        raise click.ClickException(
            "rpcbus analyze needs Java for Spark (17 or newer): install a JRE (Debian/Ubuntu: "
            "apt install default-jre-headless) or set JAVA_HOME")
    made = _check_local_paths(history, out, None if no_report else
                              report_dir or os.path.join(out, "report"))
    from rpcbus.analytics.analysis import Failed, NothingToAnalyse, run

    try:
        run(history, out, since, until, master, half_life, fmt, not no_report, report_dir)
    except Failed as exc:
        raise click.ClickException(str(exc)) from None
    except NothingToAnalyse as exc:
        _remove_if_empty(made)
        click.echo(f"rpcbus analyze: {exc}: nothing written", err=True)
        sys.exit(NOTHING_TO_ANALYSE)


def _local(path: str) -> str | None:
    """The local path of ``path`` (plain or file://), None for another file system."""
    if "://" not in path:
        return path
    return path.removeprefix("file://") if path.startswith("file://") else None


def _check_local_paths(history: str, out: str, report_dir: str | None) -> list[str]:
    """Before Spark starts, one line (exit status 2) for what could only fail later:
    a history file or folder that cannot be read, an output that cannot be written.
    Returns the directories it made (the outermost of each new path)."""
    root = _local(history)
    if root is not None:
        files = [root] if os.path.isfile(root) else [
            os.path.join(folder, name)
            for folder, _dirs, names in os.walk(root, onerror=_unreadable) for name in names]
        for path in files:
            try:
                with open(path, "rb") as f:
                    f.read(1)
            except OSError as exc:
                _unreadable(exc, path)
    made: list[str] = []
    for target in (out, report_dir):
        local = _local(target) if target else None
        if local is None:
            continue
        outermost = os.path.abspath(local)
        while not os.path.exists(os.path.dirname(outermost)):
            outermost = os.path.dirname(outermost)
        try:
            if not os.path.exists(outermost):
                made.append(outermost)
            os.makedirs(local, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=local, prefix=".rpcbus-write-check"):
                pass
        except OSError as exc:
            raise _Mistake(f"cannot write to {target}: {exc.strerror or exc}: give an output "
                           "directory this user can write") from None
    return made


def _remove_if_empty(folders: list[str]) -> None:
    """Remove the directories ``_check_local_paths`` made, where nothing was written in
    them (folders only): a run with nothing to analyse leaves nothing behind."""
    for folder in reversed(folders):
        if os.path.isdir(folder) and not any(names for _, _, names in os.walk(folder)):
            shutil.rmtree(folder, ignore_errors=True)


def _unreadable(exc: OSError, path: str | None = None) -> None:
    raise _Mistake(f"cannot read {path or exc.filename}: {exc.strerror or exc}: every "
                   "history file must be readable (or moved out of the history folder)")


class _Mistake(click.ClickException):
    """A user's mistake, said in one line (no usage text), exit status 2."""

    exit_code = 2


def _java() -> bool:
    """Whether Spark will find a java executable (JAVA_HOME first, as PySpark looks)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return os.access(os.path.join(home, "bin", "java"), os.X_OK)
    return shutil.which("java") is not None


@click.command("analyze-bundle")
@click.argument("path", type=click.Path(dir_okay=False, writable=True))
def analyze_bundle(path: str) -> None:
    """Write a zip for spark-submit --py-files (the SDK core and the analytics, no node),
    and print the spark-submit line that uses it."""
    import rpcbus

    sdk = os.path.dirname(os.path.abspath(rpcbus.__file__))
    here = os.path.dirname(os.path.abspath(__file__))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for folder, inside in ((sdk, "rpcbus"), (here, "rpcbus/analytics")):
            for name in sorted(os.listdir(folder)):
                if name.endswith(".py"):
                    z.write(os.path.join(folder, name), f"{inside}/{name}")
    click.echo(f"spark-submit --py-files {path} {os.path.join(here, 'analysis.py')} "
               "--history HISTORY --out OUT [--report-dir DIR]")


@click.command("history-gen")
@click.option("--out", required=True, help="Directory to write the history under.")
@click.option("--nodes", default=3, show_default=True)
@click.option("--providers", default=6, show_default=True)
@click.option("--rpcs", default=4, show_default=True)
@click.option("--hours", default=1.0, show_default=True, help="Time span.")
@click.option("--window", default=10.0, show_default=True, help="Seconds per window.")
@click.option("--rate", default=50.0, show_default=True, help="Mean calls/s per provider.")
@click.option("--slow", multiple=True, metavar="NAME[@A-B]",
              help="A provider that answers ~10x slower (from minute A to B; repeat).")
@click.option("--failing", multiple=True, metavar="NAME[@A-B]",
              help="A provider that fails ~20% (from minute A to B; repeat).")
@click.option("--hog", multiple=True, help="A provider given twice its share (repeat).")
@click.option("--starved", multiple=True,
              help="A provider connected but given no call after its first minute (repeat).")
@click.option("--skew", multiple=True, metavar="NODE=SECONDS[@MINUTE]",
              help="A node whose clock is that many seconds off (from minute MINUTE on: "
              "a clock that stepped; repeat).")
@click.option("--policy", type=click.Choice(["cluster", "local-first"]), default="cluster",
              show_default=True, help="The nodes' cluster.policy: local-first keeps each "
              "node's calls on its providers, with uneven callers per node.")
@click.option("--seed", default=1, show_default=True)
def history_gen(out: str, nodes: int, providers: int, rpcs: int, hours: float, window: float,
                rate: float, slow: tuple[str, ...], failing: tuple[str, ...],
                hog: tuple[str, ...], starved: tuple[str, ...], skew: tuple[str, ...],
                policy: str, seed: int) -> None:
    """Write a synthetic provider load history (providers are p1, p2, ...)."""
    from rpcbus.analytics.historygen import generate

    offsets: dict[str, float | tuple[float, float]] = {}
    for item in skew:
        node, _, value = item.partition("=")
        seconds, at, minute = value.partition("@")
        try:
            offsets[node] = (float(seconds), float(minute)) if at else float(seconds)
        except ValueError:
            raise click.BadParameter(f"{item!r}: give NODE=SECONDS (n2=3600), or "
                                     "NODE=SECONDS@MINUTE (n2=3600@60: from minute 60)",
                                     param_hint="--skew") from None
    for item in (*slow, *failing):
        _, _, when = item.partition("@")
        if when and not all(x.replace(".", "", 1).isdigit() for x in when.split("-", 1)):
            raise click.BadParameter(f"{item!r}: give NAME or NAME@A-B (minutes: p2@30-40)")
    t0 = time.monotonic()
    try:
        rows = generate(out, nodes=nodes, providers=providers, rpcs=rpcs, hours=hours,
                        window=window, slow=slow, failing=failing, hogs=hog, seed=seed,
                        rate=rate, starved=starved, skew=offsets, policy=policy)
    except ValueError as exc:
        raise _Mistake(str(exc)) from None
    click.echo(f"{rows:,} rows under {out} in {time.monotonic() - t0:.1f} s")
