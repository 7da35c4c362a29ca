"""What the driver of ``rpcbus analyze`` writes itself, without a Spark job:
``weights.json``, the small tables (``per_provider``, ``fairness``, ``weights``, ...:
one row per provider, rpc or finding), which the driver computed (analytics/findings.py),
and the per-period tables a part at a time (``TableFile``; analytics/periods.py).

A small table is written as Spark writes a table: a directory holding one Parquet file
(snappy) and an empty ``_SUCCESS``, whatever was there removed first (Spark's
``overwrite``); pyarrow makes the file. Written as Spark jobs, each of the nine small
ones cost 0.3-0.6 s of planning, code generation and commit alone, about 4 s of CPU
per analysis, and the two per-period tables as much again (analytics/periods.py).

Local paths (or ``file://``) are written directly; others (``hdfs://``, ``s3a://``)
through Hadoop's FileSystem in the driver's JVM (``spark``), as Spark writes them.
Errors propagate: an unwritable local path raises OSError, a remote one Py4JJavaError.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from numbers import Integral
from typing import Any

import numpy as np
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


def arrow_table(rows: list[dict[str, Any]], ddl: str) -> pa.Table:
    """``rows`` (dicts whose keys are the DDL's columns, in its order) as an Arrow table.
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
    return pa.Table.from_arrays(columns, schema=schema)


def write_table(spark: Any, path: str, rows: list[dict[str, Any]], ddl: str) -> None:
    """The table ``rows`` (Spark DDL ``ddl``) at ``path``, replacing what was there (once
    the rows are found right: ``arrow_table``)."""
    part = arrow_table(rows, ddl)
    table = TableFile(spark, path, ddl)
    table.add_table(part)
    table.close()


class TableFile:
    """A table written a part at a time (``add``: ``per_minute``, ``per_hour``; or whole,
    ``write_table``): parts are kept until ``GROUP_ROWS`` rows, then
    written as a row group, so memory holds one group whatever the table's size. A
    local ``path`` is written in place (what was there removed now); another goes to a
    local temporary file first, copied through Hadoop's FileSystem at ``close``.
    ``close`` returns the rows written; ``abort`` (on an error before it) removes what
    was written. Errors propagate as ``write_table``'s."""

    GROUP_ROWS = 1 << 17

    def __init__(self, spark: Any, path: str, ddl: str) -> None:
        self._spark, self._path = spark, path
        self._schema = arrow_schema(ddl)
        if _local(path):
            self._folder: str | None = path.removeprefix("file://")
            shutil.rmtree(self._folder, ignore_errors=True)
            os.makedirs(self._folder)
            self._file = os.path.join(self._folder, PART)
        else:
            self._folder = None
            handle, self._file = tempfile.mkstemp(suffix=".parquet", prefix="rpcbus-")
            os.close(handle)
        self._writer = pq.ParquetWriter(self._file, self._schema, compression="snappy")
        self._parts: list[pa.Table] = []
        self._held = 0
        self.rows = 0

    def add(self, columns: dict[str, Any]) -> None:
        """Rows as columns named as the DDL's: str columns as lists, the others as numpy
        arrays (float64 too for BIGINT columns; NaN is null)."""
        arrays = []
        for field in self._schema:
            values = columns[field.name]
            if pa.types.is_string(field.type):
                arrays.append(pa.array(values, type=field.type))
                continue
            values = np.asarray(values, dtype=np.float64)
            missing = np.isnan(values)
            if pa.types.is_integer(field.type):
                values = np.where(missing, 0, values).astype(np.int64)
            arrays.append(pa.array(values, type=field.type, mask=missing))
        self.add_table(pa.Table.from_arrays(arrays, schema=self._schema))

    def add_table(self, part: pa.Table) -> None:
        """Rows as an Arrow table of the DDL's schema."""
        self._parts.append(part)
        self._held += part.num_rows
        if self._held >= self.GROUP_ROWS:
            self._flush()

    def close(self) -> int:
        self._flush()
        self._writer.close()
        if self._folder is not None:
            with open(os.path.join(self._folder, "_SUCCESS"), "wb"):
                pass
            return self.rows
        jvm = self._spark.sparkContext._jvm
        folder = jvm.org.apache.hadoop.fs.Path(self._path)
        fs = folder.getFileSystem(self._spark.sparkContext._jsc.hadoopConfiguration())
        fs.delete(folder, True)
        try:
            stream = fs.create(jvm.org.apache.hadoop.fs.Path(folder, PART), True)
            try:
                with open(self._file, "rb") as f:
                    while chunk := f.read(8 << 20):
                        stream.write(bytearray(chunk))
            finally:
                stream.close()
        finally:
            os.unlink(self._file)
        _write_remote(fs, jvm.org.apache.hadoop.fs.Path(folder, "_SUCCESS"), b"")
        return self.rows

    def abort(self) -> None:
        self._writer.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
        else:
            os.unlink(self._file)

    def _flush(self) -> None:
        if self._parts:
            self._writer.write_table(pa.concat_tables(self._parts))
            self.rows += self._held
            self._parts, self._held = [], 0


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
