"""The small tables the analysis driver writes itself (analytics/files.py), read back as
Spark would find them: a directory of one Parquet file, replaced on every run."""

import os

import pyarrow.parquet as pq
import pytest

from rpcbus.analytics import files

DDL = "rpc STRING, calls BIGINT, rank INT, share DOUBLE, hot BOOLEAN"


def test_a_table_is_replaced_whole_and_keeps_the_ddl_types(tmp_path):
    out = str(tmp_path / "hot_rpcs")
    files.write_table(None, out, [{"rpc": "a", "calls": 3, "rank": 1, "share": 0.5,
                                   "hot": True}] * 3, DDL)
    files.write_table(None, out, [{"rpc": "b", "calls": None, "rank": 2, "share": None,
                                   "hot": False}], DDL)
    assert sorted(os.listdir(out)) == ["_SUCCESS", files.PART]
    table = pq.read_table(out)
    assert table.to_pylist() == [{"rpc": "b", "calls": None, "rank": 2, "share": None,
                                  "hot": False}]
    assert [str(t) for t in table.schema.types] == ["string", "int64", "int32", "double",
                                                    "bool"]
    files.write_table(None, out, [], DDL)      # an empty table still says its columns
    assert pq.read_table(out).num_rows == 0 and pq.read_table(out).schema.names[0] == "rpc"


def test_a_value_of_another_type_or_a_row_of_other_columns_is_refused():
    with pytest.raises(TypeError, match="calls"):   # pyarrow alone would cut it to 1
        files.arrow_table([{"rpc": "a", "calls": 1.5, "rank": 1, "share": 0.0, "hot": True}], DDL)
    with pytest.raises(TypeError):
        files.arrow_table([{"rpc": 7, "calls": 1, "rank": 1, "share": 0.0, "hot": True}], DDL)
    with pytest.raises(ValueError, match="columns"):
        files.arrow_table([{"calls": 1, "rpc": "a", "rank": 1, "share": 0.0, "hot": True}], DDL)


def test_a_big_table_is_written_a_part_at_a_time_nan_as_null(tmp_path, monkeypatch):
    import numpy as np

    monkeypatch.setattr(files.TableFile, "GROUP_ROWS", 3)     # row groups of 3 rows or more
    out = str(tmp_path / "per_minute")
    os.makedirs(out)
    with open(os.path.join(out, "stale.parquet"), "wb") as f:   # replaced, as Spark would
        f.write(b"old")
    table = files.TableFile(None, out, "rpc STRING, calls BIGINT, share DOUBLE")
    table.add({"rpc": ["a", "b"], "calls": np.array([1.0, 2.0]),
               "share": np.array([0.5, np.nan])})
    table.add({"rpc": ["c", "d"], "calls": np.array([3.0, np.nan]),
               "share": np.array([1.0, 2.0])})
    table.add({"rpc": ["e"], "calls": np.array([5.0]), "share": np.array([0.1])})
    assert table.close() == 5
    assert sorted(os.listdir(out)) == ["_SUCCESS", files.PART]
    read = pq.read_table(out)
    assert str(read.schema.field("calls").type) == "int64"
    assert read.to_pydict() == {"rpc": ["a", "b", "c", "d", "e"], "calls": [1, 2, 3, None, 5],
                                "share": [0.5, None, 1.0, 2.0, 0.1]}
    assert pq.ParquetFile(os.path.join(out, files.PART)).num_row_groups == 2
    broken = files.TableFile(None, out, "rpc STRING")
    broken.add({"rpc": ["x"]})
    broken.abort()                          # an error before close: nothing left behind
    assert not os.path.exists(out)
