"""The PySpark job against a plain-Python reference on the same generated history:
every count equal, every histogram percentile the same bucket bound."""

import glob
import json
import math
from collections import defaultdict

import pytest

from broker.rpcstats import BOUNDS
from cluster import analysis
from cluster.historygen import generate

COUNTS = analysis.COUNTS


def reference(history, seconds):
    """Plain Python: the same per-period figures from the JSON lines."""
    groups = defaultdict(lambda: {"counts": [0] * len(COUNTS), "buckets": [0] * (len(BOUNDS) + 1),
                                  "peak": 0})
    for path in glob.glob(f"{history}/**/*.jsonl", recursive=True):
        for line in open(path):
            r = json.loads(line)
            key = (r["provider"], r["rpc"], r["served_by"],
                   int(math.floor(r["window_start"] / seconds) * seconds))
            g = groups[key]
            g["counts"] = [a + r[c] for a, c in zip(g["counts"], COUNTS)]
            g["buckets"] = [a + b for a, b in zip(g["buckets"], r["latency_buckets"])]
            g["peak"] = max(g["peak"], r["peak_in_flight"])
    out = {}
    for key, g in groups.items():
        total, cum, qs = sum(g["buckets"]), 0, {}
        for pos, n in enumerate(g["buckets"]):
            cum += n
            for q in analysis.QUANTILES:
                if q not in qs and total > 0 and cum >= total * q:
                    qs[q] = (list(BOUNDS) + [math.inf])[pos]
        out[key] = {**dict(zip(COUNTS, g["counts"])), "peak_in_flight": g["peak"],
                    **{f"p{int(q * 100)}_s": qs.get(q) for q in analysis.QUANTILES}}
    return out


@pytest.fixture(scope="module")
def spark():
    s = analysis.session("local[2]")
    s.sparkContext.setLogLevel("ERROR")
    yield s
    analysis.stop(s)


def test_every_figure_equals_the_reference(spark, tmp_path):
    history, out = tmp_path / "history", tmp_path / "out"
    rows = generate(str(history), nodes=2, providers=4, rpcs=3, hours=1.5, window=10,
                    slow=("p2",), failing=("p3",), seed=7)
    assert rows > 1000
    written = analysis.analyze(spark, str(history), str(out))
    for table, seconds in analysis.PERIODS.items():
        expected = reference(history, seconds)
        got = {(r["provider"], r["rpc"], r["served_by"], r["period_start"]): r.asDict()
               for r in spark.read.parquet(f"{out}/{table}").collect()}
        assert written[table] == len(expected) == len(got)
        for key, want in expected.items():
            row = got[key]
            for field, value in want.items():
                assert row[field] == value, (table, key, field, row[field], value)
            assert row["calls_per_s"] == pytest.approx(want["calls"] / seconds)
    slow = spark.read.parquet(f"{out}/per_hour").where("provider = 'p2'").collect()
    fast = spark.read.parquet(f"{out}/per_hour").where("provider = 'p1'").collect()
    assert min(r["p50_s"] for r in slow) > max(r["p50_s"] for r in fast)   # generated slow
