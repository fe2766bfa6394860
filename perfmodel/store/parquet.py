"""Parquet export and import of a store, for shipping profiles with the repo (`profiles/`) or between machines.

An export is a folder with one Parquet file per table and a `manifest.json` written last (so a folder with a
manifest is complete). Op and ONNX rows point at their profile by its `uid`, never by a database id, so exports
can be imported into any store; JSON columns are stored as JSON text. Since schema v5 an export also holds
`graphs.parquet` (job_key, graph_json): the stored graph IR of each job the exported runs name, so a store that
imports it trains without capturing graphs again; exports of v1-v4 have no graphs file and still import. Only the
runs and their graphs are exported: the `op_measurements` and `whole_job_measurements` tables (public benchmark
data, see `perfmodel import`) and the service's tables are not.
"""

from __future__ import annotations

import json
import os
from collections.abc import Container, Iterator
from datetime import datetime, timezone
from itertools import groupby
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError
from sqlalchemy import JSON, Column, Connection, Double, Engine, Integer, Select, String, Table, select

import perfmodel
from perfmodel.core.atomic import write_json_atomically
from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph
from perfmodel.records import Profile
from perfmodel.store.rows import ONNX_FIELDS, OP_FIELDS, decode_json_columns, to_profile
from perfmodel.store.schema import STORE_SCHEMA_VERSION
from perfmodel.store.tables import GraphRow, OnnxNodeRow, OpRecordRow, ProfileRow, UTCDateTime

FORMAT = "perfmodel-profiles"
# exports of these store schema versions hold the same three tables, so each can be imported: v2 only added
# `op_measurements`, which exports leave out (imported public benchmark data is re-imported from its source with
# `perfmodel import`, not shipped), v3 the service's tables (jobs, observations, model_events), left out too, and
# v4 custom accelerators (`accelerators`), left out too; v5 added `graphs`, exported as graphs.parquet (the graphs of
# the exported runs' jobs), which older exports lack; v6 added `whole_job_measurements`, left out like op_measurements;
# v7 only made SQLite's `observations` AUTOINCREMENT, v8 added two columns to it (both left out too)
READABLE_SCHEMA_VERSIONS = frozenset({1, 2, 3, 4, 5, 6, 7, 8})
GRAPHS = "graphs"
# IR JSON repeats itself a lot: zstd makes the corpus's graphs file 0.9 MB where the default (snappy) makes 2.7 MB
GRAPHS_COMPRESSION = "zstd"
FIRST_VERSION_WITH_GRAPHS = 5
MANIFEST = "manifest.json"
BATCH_ROWS = 50_000

_PROFILES: Table = ProfileRow.__table__  # type: ignore[assignment]
TABLES: dict[str, Table] = {
    "profiles": _PROFILES,
    "op_records": OpRecordRow.__table__,  # type: ignore[dict-item]
    "onnx_nodes": OnnxNodeRow.__table__,  # type: ignore[dict-item]
}
_GRAPHS: Table = GraphRow.__table__  # type: ignore[assignment]
GRAPHS_SCHEMA = pa.schema([pa.field("job_key", pa.string(), nullable=False),
                           pa.field("graph_json", pa.string(), nullable=False)])


def _columns(name: str) -> list[tuple[str, Column[Any]]]:
    """The exported columns of a table: (name in the file, database column)."""
    table = TABLES[name]
    if table is _PROFILES:
        return [(c.name, c) for c in table.c if c.name != "id"]
    return [("profile_uid", _PROFILES.c.uid), *((c.name, c) for c in table.c if c.name != "profile_id")]


def _arrow_type(column: Column[Any]) -> pa.DataType:
    kind = column.type
    if isinstance(kind, JSON):
        return pa.string()  # JSON text
    if isinstance(kind, UTCDateTime):
        return pa.timestamp("us", tz="UTC")
    if isinstance(kind, Integer):
        return pa.int64()
    if isinstance(kind, Double):
        return pa.float64()
    if isinstance(kind, String):
        return pa.string()
    raise TypeError(f"no Parquet type for column {column.name} ({kind!r})")


def arrow_schema(name: str) -> pa.Schema:
    return pa.schema([pa.field(n, _arrow_type(c), nullable=bool(c.nullable)) for n, c in _columns(name)])


def _json_names(name: str) -> set[str]:
    return {n for n, c in _columns(name) if isinstance(c.type, JSON)}


def _query(name: str) -> Select[Any]:
    table = TABLES[name]
    query = select(*(column.label(n) for n, column in _columns(name)))
    if table is _PROFILES:
        return query.order_by(_PROFILES.c.id)
    return query.join_from(table, _PROFILES).order_by(table.c.profile_id, table.c.position)


# --- export ---


def _write_table(connection: Connection, name: str, directory: Path) -> int:
    schema, json_names = arrow_schema(name), _json_names(name)
    temporary = directory / f".{name}.parquet.tmp"
    rows = 0
    result = connection.execute(_query(name).execution_options(yield_per=BATCH_ROWS))
    with pq.ParquetWriter(str(temporary), schema) as writer:
        for part in result.partitions():
            columns = {n: [r[i] for r in part] for i, n in enumerate(schema.names)}
            for n in json_names:
                columns[n] = [None if value is None else json.dumps(value) for value in columns[n]]
            writer.write_batch(pa.RecordBatch.from_pydict(columns, schema=schema))
            rows += len(part)
    os.replace(temporary, directory / f"{name}.parquet")
    return rows


def _write_graphs(connection: Connection, directory: Path) -> int:
    """graphs.parquet: the stored graphs of the jobs the exported runs name, by job key."""
    query = (select(_GRAPHS.c.job_key, _GRAPHS.c.graph_json)
             .where(_GRAPHS.c.job_key.in_(select(_PROFILES.c.job_key).distinct()))
             .order_by(_GRAPHS.c.job_key))
    temporary = directory / f".{GRAPHS}.parquet.tmp"
    rows = 0
    result = connection.execute(query.execution_options(yield_per=BATCH_ROWS))
    with pq.ParquetWriter(str(temporary), GRAPHS_SCHEMA, compression=GRAPHS_COMPRESSION) as writer:
        for part in result.partitions():
            columns = {"job_key": [r[0] for r in part], "graph_json": [r[1] for r in part]}
            writer.write_batch(pa.RecordBatch.from_pydict(columns, schema=GRAPHS_SCHEMA))
            rows += len(part)
    os.replace(temporary, directory / f"{GRAPHS}.parquet")
    return rows


def export_tables(engine: Engine, directory: Path) -> dict[str, int]:
    """Write every table of the store to `directory`, then the manifest; returns the row count of each file."""
    directory.mkdir(parents=True, exist_ok=True)
    with engine.connect() as connection:
        if connection.dialect.name == "postgresql":  # one snapshot for all the tables
            connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            counts = {name: _write_table(connection, name, directory) for name in TABLES}
            counts[GRAPHS] = _write_graphs(connection, directory)
    manifest = {
        "format": FORMAT,
        "schema_version": STORE_SCHEMA_VERSION,
        "perfmodel_version": perfmodel.__version__,
        "exported_at": datetime.now(timezone.utc).isoformat(),
        "row_counts": counts,
    }
    write_json_atomically(directory / MANIFEST, manifest)
    return counts


# --- import ---


def _read_manifest(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise PerfmodelError(f"no profile export at {directory}: not a folder")
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise PerfmodelError(f"{directory} is not a complete profile export: no {MANIFEST}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PerfmodelError(f"{path} is not readable JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PerfmodelError(f"{path} is not a perfmodel profile export manifest")
    version = manifest.get("schema_version")
    if not isinstance(version, int) or version > STORE_SCHEMA_VERSION:
        raise PerfmodelError(
            f"export schema v{version} is newer than this perfmodel supports (v{STORE_SCHEMA_VERSION}); "
            "upgrade perfmodel"
        )
    if version not in READABLE_SCHEMA_VERSIONS:
        readable = ", ".join(f"v{v}" for v in sorted(READABLE_SCHEMA_VERSIONS))
        raise PerfmodelError(f"cannot import an export of store schema v{version} (only {readable})")
    counts = manifest.get("row_counts")
    required = [*TABLES, GRAPHS] if version >= FIRST_VERSION_WITH_GRAPHS else list(TABLES)
    if not isinstance(counts, dict) or not all(isinstance(counts.get(name), int) for name in required):
        raise PerfmodelError(f"{path} has no row count for every table")
    return manifest


def _read_table(directory: Path, name: str, expected_rows: int, schema: pa.Schema | None = None) -> pa.Table:
    path = directory / f"{name}.parquet"
    schema = arrow_schema(name) if schema is None else schema
    try:
        table = pq.read_table(str(path))
        missing = sorted(set(schema.names) - set(table.column_names))
        if missing:
            raise PerfmodelError(f"{path} lacks the columns {', '.join(missing)}")
        table = table.select(schema.names).cast(schema)
    except (OSError, pa.ArrowException) as exc:
        raise PerfmodelError(f"cannot read {path}: {exc}") from None
    if table.num_rows != expected_rows:
        raise PerfmodelError(f"{path} has {table.num_rows} rows but the manifest says {expected_rows}")
    return table


def _decode(row: dict[str, Any], json_names: set[str]) -> dict[str, Any]:
    for n in json_names:
        if row[n] is not None:
            row[n] = json.loads(row[n])
    return row


class _ByProfile:
    """The records of an op or ONNX table grouped by profile uid, in position order: dicts of `fields`."""

    def __init__(self, name: str, table: pa.Table, fields: tuple[str, ...]) -> None:
        self._json_names = [n for n in fields if n in _json_names(name)]
        self._fields = list(fields)
        self._table = table.sort_by([("profile_uid", "ascending"), ("position", "ascending")])
        self._slices: dict[str, tuple[int, int]] = {}
        start = 0
        for uid, run in groupby(self._table.column("profile_uid").to_pylist()):
            length = sum(1 for _ in run)
            self._slices[uid] = (start, length)
            start += length

    def rows(self, uid: str) -> list[dict[str, Any]]:
        start, length = self._slices.get(uid, (0, 0))
        part = self._table.slice(start, length)
        rows = part.select(self._fields).to_pylist()
        decode_json_columns(rows, self._json_names, f"run {uid}")  # one parse per column, not per row (4x faster)
        return rows


def read_profiles(directory: Path, skip: Container[str] = ()) -> Iterator[tuple[str, Profile]]:
    """The (uid, profile) pairs of an export, but those whose uid is in `skip`. Checks the whole export first."""
    manifest = _read_manifest(directory)
    tables = {name: _read_table(directory, name, manifest["row_counts"][name]) for name in TABLES}
    return _profiles(directory, tables, skip)


def _profiles(directory: Path, tables: dict[str, pa.Table], skip: Container[str]) -> Iterator[tuple[str, Profile]]:
    ops = _ByProfile("op_records", tables["op_records"], OP_FIELDS)
    nodes = _ByProfile("onnx_nodes", tables["onnx_nodes"], ONNX_FIELDS)
    json_names = _json_names("profiles")
    for row in tables["profiles"].to_pylist():
        uid = row["uid"]
        if uid in skip:
            continue
        try:
            profile = to_profile(_decode(row, json_names), ops.rows(uid), nodes.rows(uid))
        except (ValidationError, json.JSONDecodeError) as exc:
            raise PerfmodelError(f"profile {uid} in {directory} is not valid: {exc}") from None
        yield uid, profile


def read_graphs(directory: Path) -> dict[str, str]:
    """The graphs of an export as IR JSON by job key, each checked to parse (`Graph.from_json`) and to name its job:
    {} for an export of schema v1-v4 without a graphs file. Reads the whole graphs file before returning."""
    manifest = _read_manifest(directory)
    expected = manifest["row_counts"].get(GRAPHS)
    if not isinstance(expected, int):  # a v1-v4 export (v5 manifests must have the count: see _read_manifest)
        return {}
    table = _read_table(directory, GRAPHS, expected, GRAPHS_SCHEMA)
    graphs: dict[str, str] = {}
    for job_key, text in zip(table.column("job_key").to_pylist(), table.column("graph_json").to_pylist()):
        if job_key is None or text is None:
            raise PerfmodelError(f"{directory / (GRAPHS + '.parquet')} has an empty job key or graph")
        if job_key in graphs:
            raise PerfmodelError(f"{directory / (GRAPHS + '.parquet')} holds job {job_key} twice")
        try:
            graph = Graph.from_json(text)
        except (ValueError, PerfmodelError) as exc:  # ValidationError and JSONDecodeError are ValueErrors
            raise PerfmodelError(f"the graph of job {job_key} in {directory} is not valid: {exc}") from None
        if graph.job_id is not None and graph.job_id != job_key:
            raise PerfmodelError(f"the graph of job {job_key} in {directory} names job {graph.job_id}")
        graphs[job_key] = text
    return graphs
