"""The profile store: every profiling run in a database (SQLite file by default), with Parquet export/import."""

from perfmodel.store.schema import STORE_SCHEMA_VERSION
from perfmodel.store.store import ProfileStore, ProfileSummary, WholeJobImport

__all__ = ["STORE_SCHEMA_VERSION", "ProfileStore", "ProfileSummary", "WholeJobImport"]
