"""``rpcbus analyze``, ``rpcbus analyze-bundle`` and ``rpcbus history-gen`` (registered as
``rpcbus.commands`` entry points: the node's CLI finds them without importing this layer)."""

from __future__ import annotations

import os
import time
import zipfile

import click


@click.command(context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def analyze(args: tuple[str, ...]) -> None:
    """PySpark job over the load history: rpcbus analyze --history DIR --out DIR (--help)."""
    try:
        import pyspark  # noqa: F401  (only to say what is missing, in one line)
    except ImportError:
        raise click.ClickException(
            "rpcbus analyze needs PySpark: pip install 'rpcbus[spark]'") from None
    from rpcbus.analytics.analysis import main as analyze_main

    analyze_main(list(args))


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
@click.option("--slow", multiple=True, help="A provider that answers ~10x slower (repeat).")
@click.option("--failing", multiple=True, help="A provider that fails ~20% (repeat).")
@click.option("--hog", multiple=True, help="A provider given twice its share (repeat).")
@click.option("--seed", default=1, show_default=True)
def history_gen(out: str, nodes: int, providers: int, rpcs: int, hours: float, window: float,
                rate: float, slow: tuple[str, ...], failing: tuple[str, ...],
                hog: tuple[str, ...], seed: int) -> None:
    """Write a synthetic provider load history (providers are p1, p2, ...)."""
    from rpcbus.analytics.historygen import generate

    t0 = time.monotonic()
    rows = generate(out, nodes=nodes, providers=providers, rpcs=rpcs, hours=hours,
                    window=window, slow=slow, failing=failing, hogs=hog, seed=seed, rate=rate)
    click.echo(f"{rows:,} rows under {out} in {time.monotonic() - t0:.1f} s")
