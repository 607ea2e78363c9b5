"""Iceberg v2 position-delete files: written from (data file, position) pairs, and read back.

A position-delete file is Parquet with two columns under Iceberg's reserved field ids, ``file_path``
(2147483546) and ``pos`` (2147483545), sorted by path then position (the spec requires it: readers
merge them with data files in order). Its manifest entry carries the partition and spec id of the
data files it points at, and ``file_path`` bounds that are never truncated: when lower and upper are
equal, readers know the file deletes from that one data file only (PyIceberg's delete-file index and
Java's ``ContentFileUtil.referencedDataFile``); otherwise PyIceberg still skips the data files whose
path falls outside the bounds.

One file per spec and partition per commit, not one per data file: a round of random updates touches
most files of a partition, every delete file is one more object to open at each scan (PyIceberg
loads all delete files of a scan first), and a partition hit in one data file only still gets a
file-scoped delete file (equal bounds). Spark's ``rewrite_position_delete_files`` and
``rewrite_data_files`` with ``delete-file-threshold`` fold them later.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, StringType

from fanout_sink.protocol import datafiles

FILE_PATH_ID = 2147483546
"""Iceberg's reserved field id of a position-delete file's ``file_path`` column."""
POS_ID = 2147483545
"""Iceberg's reserved field id of a position-delete file's ``pos`` column."""
FIELD_ID = b"PARQUET:field_id"
PATH, POS = "file_path", "pos"
SCHEMA = pa.schema(
    [
        pa.field(PATH, pa.string(), nullable=False, metadata={FIELD_ID: str(FILE_PATH_ID).encode()}),
        pa.field(POS, pa.int64(), nullable=False, metadata={FIELD_ID: str(POS_ID).encode()}),
    ]
)


def read(io: FileIO, path: str) -> pa.Table:
    """The (file_path, pos) rows of one position-delete file, whoever wrote it (Spark may add a
    ``row`` column; it is not read)."""
    with io.new_input(path).open() as stream:
        return pq.read_table(stream, columns=[PATH, POS]).cast(
            pa.schema([pa.field(PATH, pa.string()), pa.field(POS, pa.int64())])
        )


def write(
    table: Table, files: Sequence[DataFile], file_index: pa.Array, positions: pa.Array
) -> list[DataFile]:
    """Position-delete files (not committed) deleting row ``positions[i]`` of ``files[file_index[i]]``.

    One file per spec id and partition of the data files hit. The pairs must be distinct.
    """
    if len(positions) == 0:
        return []
    paths = pa.array([f.file_path for f in files], pa.string())
    # Per data file (not per row): its group, and its rank in path order for the required sort.
    groups: dict[tuple[int, tuple[object, ...]], int] = {}
    group_of_file = np.array(
        [groups.setdefault((int(f.spec_id), _partition(f)), len(groups)) for f in files], dtype=np.int32
    )
    rank_of_file = np.empty(len(files), dtype=np.int32)
    rank_of_file[pc.sort_indices(paths).to_numpy()] = np.arange(len(files), dtype=np.int32)
    index = file_index.to_numpy(zero_copy_only=False)
    rows = pa.table(
        {
            "_group": pa.array(group_of_file[index]),
            "_rank": pa.array(rank_of_file[index]),
            "_file": file_index,
            POS: positions,
        }
    ).sort_by([("_group", "ascending"), ("_rank", "ascending"), (POS, "ascending")])
    written = []
    group_ids = rows["_group"].to_numpy()
    bounds = np.flatnonzero(np.diff(group_ids)) + 1
    starts, stops = np.concatenate([[0], bounds]), np.concatenate([bounds, [len(group_ids)]])
    for start, stop in zip(starts, stops, strict=True):
        part = rows.slice(int(start), int(stop - start))
        first_file = files[part["_file"][0].as_py()]
        deletes = pa.table([paths.take(part["_file"]), part[POS]], schema=SCHEMA)
        written.append(_write_file(table, deletes, first_file))
    return written


def _partition(data_file: DataFile) -> tuple[object, ...]:
    return tuple(data_file.partition[i] for i in range(len(data_file.partition)))


def _write_file(table: Table, rows: pa.Table, hit: DataFile) -> DataFile:
    """One sorted position-delete file under the table's data location, in ``hit``'s spec and partition."""
    path, size = datafiles.write_parquet(table, rows, f"{uuid.uuid4()}-deletes.parquet")
    paths, positions = rows[PATH], rows[POS]
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(*_partition(hit)),
        record_count=rows.num_rows,
        file_size_in_bytes=size,
        column_sizes={},
        value_counts={FILE_PATH_ID: rows.num_rows, POS_ID: rows.num_rows},
        null_value_counts={FILE_PATH_ID: 0, POS_ID: 0},
        nan_value_counts={},
        # Sorted by path: the first and last rows are the path bounds, never truncated.
        lower_bounds={
            FILE_PATH_ID: to_bytes(StringType(), paths[0].as_py()),
            POS_ID: to_bytes(LongType(), pc.min(positions).as_py()),
        },
        upper_bounds={
            FILE_PATH_ID: to_bytes(StringType(), paths[-1].as_py()),
            POS_ID: to_bytes(LongType(), pc.max(positions).as_py()),
        },
        key_metadata=None,
        split_offsets=None,
        equality_ids=None,
        sort_order_id=None,
    )
    # PyIceberg 0.12 drops spec_id in DataFile.from_args (it is not a manifest field).
    delete_file.spec_id = hit.spec_id
    return delete_file
