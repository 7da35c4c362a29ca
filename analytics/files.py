"""What the driver of ``rpcbus analyze`` writes itself, without a Spark job:
``weights.json`` and the small tables (``per_provider``, ``fairness``, ``weights``, ...:
one row per provider, rpc or finding), which the driver computed (analytics/findings.py).

A small table is written as Spark writes a table: a directory holding one Parquet file
(snappy) and an empty ``_SUCCESS``, whatever was there removed first (Spark's
``overwrite``); pyarrow makes the file. Each of the nine written as a Spark job cost
0.3-0.6 s of planning, code generation and commit alone, about 4 s of CPU per analysis
beside the per-minute and per-hour tables (docs/history.md "Scale").

Local paths (or ``file://``) are written directly; others (``hdfs://``, ``s3a://``)
through Hadoop's FileSystem in the driver's JVM (``spark``), as Spark writes them.
Errors propagate: an unwritable local path raises OSError, a remote one Py4JJavaError.
"""

from __future__ import annotations

import os
import shutil
from numbers import Integral
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ARROW = {"STRING": pa.string(), "BIGINT": pa.int64(), "INT": pa.int32(),
         "DOUBLE": pa.float64(), "BOOLEAN": pa.bool_()}
PART = "part-00000.snappy.parquet"


def arrow_schema(ddl: str) -> pa.Schema:
    """The Arrow schema of a flat Spark DDL (``"rpc STRING, calls BIGINT, ..."``, the
    types in ``ARROW``), every column nullable as Spark's are."""
    fields = [column.split() for column in ddl.split(",")]
    return pa.schema([pa.field(name, ARROW[kind.upper()]) for name, kind in fields])


def parquet(rows: list[dict[str, Any]], ddl: str) -> bytes:
    """``rows`` (dicts whose keys are the DDL's columns, in its order) as one Parquet file.
    Raises ValueError on a row of other columns, TypeError on a value of another type
    (as Spark's ``createDataFrame`` checks)."""
    schema = arrow_schema(ddl)
    for row in rows:
        if list(row) != schema.names:
            raise ValueError(f"a row's columns {list(row)} are not the table's {schema.names}")
    columns = []
    for field in schema:
        name = field.name
        values = [row[name] for row in rows]
        if pa.types.is_integer(field.type):   # pyarrow would cut a float's fraction off
            wrong = [v for v in values
                     if v is not None and (isinstance(v, bool) or not isinstance(v, Integral))]
            if wrong:
                raise TypeError(f"column {name} ({field.type}) got {wrong[0]!r}")
        columns.append(pa.array(values, type=field.type))
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_arrays(columns, schema=schema), sink, compression="snappy")
    return bytes(sink.getvalue())


def write_table(spark: Any, path: str, rows: list[dict[str, Any]], ddl: str) -> None:
    """The table ``rows`` (Spark DDL ``ddl``) at ``path``, replacing what was there."""
    files = {PART: parquet(rows, ddl), "_SUCCESS": b""}
    if _local(path):
        folder = path.removeprefix("file://")
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        for name, data in files.items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
        return
    jvm = spark.sparkContext._jvm
    folder = jvm.org.apache.hadoop.fs.Path(path)
    fs = folder.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    fs.delete(folder, True)
    for name, data in files.items():
        _write_remote(fs, jvm.org.apache.hadoop.fs.Path(folder, name), data)


def write_text(spark: Any, path: str, text: str) -> None:
    """One small text file at ``path`` (its folder made if need be), replaced."""
    if _local(path):
        local = path.removeprefix("file://")
        os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
        with open(local, "w", encoding="utf-8") as f:
            f.write(text)
        return
    jvm = spark.sparkContext._jvm
    target = jvm.org.apache.hadoop.fs.Path(path)
    fs = target.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    _write_remote(fs, target, text.encode())


def _local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _write_remote(fs: Any, target: Any, data: bytes) -> None:
    stream = fs.create(target, True)
    try:
        stream.write(bytearray(data))
    finally:
        stream.close()
