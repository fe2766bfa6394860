"""Custom accelerators in the store (schema v4, table `accelerators`): users' spec sheets, validated
(`perfmodel.hardware.custom`), kept as `HardwareSpec` JSON so that every process on the store (every replica of the
service, the CLI) predicts for them. Functions take any `ProfileStore` (a `JobStore` too); each write is one
transaction. A name is added once: the same spec again is a no-op, another spec under a taken name is a clash.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Table, delete, select
from sqlalchemy.exc import IntegrityError

from perfmodel.hardware.custom import AcceleratorClash
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.records import utc_now
from perfmodel.store.schema import write_transaction
from perfmodel.store.tables import AcceleratorRow

_ACCELERATORS: Table = AcceleratorRow.__table__  # type: ignore[assignment]


class AcceleratorRecord(BaseModel):
    """A stored custom accelerator."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: HardwareSpec
    created_at: datetime


def _record(row: Any) -> AcceleratorRecord:
    return AcceleratorRecord(spec=HardwareSpec.model_validate(row["spec_json"]), created_at=row["created_at"])


def add_accelerator(store: Any, spec: HardwareSpec) -> tuple[AcceleratorRecord, bool]:
    """Store `spec` (already validated); returns it and whether it is new. The same spec under its name again is
    returned as stored; another spec under a taken name is `AcceleratorClash`."""
    values = spec.model_dump(mode="json")
    try:
        with write_transaction(store.engine) as connection:
            query = select(_ACCELERATORS).where(_ACCELERATORS.c.name == spec.name)
            found = connection.execute(query).mappings().first()
            if found is None:
                created_at = utc_now()
                connection.execute(_ACCELERATORS.insert().values(name=spec.name, spec_json=values,
                                                                 created_at=created_at))
                return AcceleratorRecord(spec=spec, created_at=created_at), True
    except IntegrityError:  # another writer added the name meanwhile
        found = _get_row(store, spec.name)
        if found is None:
            raise
    stored = _record(found)
    if stored.spec != spec:
        raise AcceleratorClash(f"custom accelerator {spec.name!r} exists with other figures: give the new spec "
                               f"sheet another name (or delete {spec.name!r} first)", spec.name)
    return stored, False


def _get_row(store: Any, name: str) -> Any:
    with store.engine.connect() as connection:
        return connection.execute(select(_ACCELERATORS).where(_ACCELERATORS.c.name == name)).mappings().first()


def get_accelerator_record(store: Any, name: str) -> AcceleratorRecord | None:
    """The custom accelerator stored under `name` (exact catalog id), or None."""
    row = _get_row(store, name)
    return None if row is None else _record(row)


def accelerator_records(store: Any) -> list[AcceleratorRecord]:
    """Every custom accelerator, oldest first."""
    with store.engine.connect() as connection:
        rows = connection.execute(select(_ACCELERATORS).order_by(_ACCELERATORS.c.id)).mappings().all()
    return [_record(row) for row in rows]


def custom_accelerators(store: Any) -> list[HardwareSpec]:
    """The custom accelerators of the store, as catalog entries (for `perfmodel.hardware.custom.LiveCatalog`)."""
    return [record.spec for record in accelerator_records(store)]


def delete_accelerator(store: Any, name: str) -> bool:
    """Forget a custom accelerator; False if there was none of that name."""
    with write_transaction(store.engine) as connection:
        return bool(connection.execute(delete(_ACCELERATORS).where(_ACCELERATORS.c.name == name)).rowcount)
