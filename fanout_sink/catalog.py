"""One Iceberg catalog seen from two engines: PyIceberg on the sink's side, Spark SQL on the reader's.

The embedded default is PyIceberg's SQL catalog on SQLite. Iceberg's JDBC catalog reads the same
SQLite file only when it is registered in Spark under the same catalog name, because both key
their rows by that name; keeping one settings object for both engines keeps the names equal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

_SQLITE_PREFIX = "sqlite:///"
PY_IO_IMPL = "py-io-impl"
"""PyIceberg's catalog property naming the FileIO class; a user's choice is kept."""
DURABLE_FILE_IO = "fanout_sink.durable_io.DurableFileIO"


class CatalogSettings(BaseModel):
    """The ``catalog:`` section: Iceberg catalog property names, passed through as they are."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)

    name: str = Field(default="lake", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    type: str = "sql"
    uri: str | None = None
    warehouse: str | None = None

    def properties(self) -> dict[str, str]:
        """Catalog properties as PyIceberg's ``load_catalog`` takes them (every key but ``name``)."""
        props: dict[str, Any] = {"type": self.type, **(self.model_extra or {})}
        if self.uri is not None:
            props["uri"] = self.uri
        if self.warehouse is not None:
            props["warehouse"] = self.warehouse
        return {key: str(value) for key, value in props.items()}


def sqlite_path(uri: str) -> Path | None:
    """The file behind a SQLAlchemy SQLite URI (``sqlite:///rel`` or ``sqlite:////abs``), else None."""
    if not uri.startswith(_SQLITE_PREFIX):
        return None
    return Path(uri[len(_SQLITE_PREFIX) :]).resolve()


def load_catalog(settings: CatalogSettings) -> Any:
    """A PyIceberg catalog; the SQLite file's folder is created so a first run needs no set-up."""
    from pyiceberg.catalog import load_catalog as pyiceberg_load_catalog

    if settings.type == "sql" and settings.uri and (path := sqlite_path(settings.uri)) is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    if settings.warehouse and settings.warehouse.startswith("file://"):
        Path(settings.warehouse[len("file://") :]).mkdir(parents=True, exist_ok=True)
    properties = settings.properties()
    if is_local_warehouse(settings.warehouse) and PY_IO_IMPL not in properties:
        # Files a Kafka transaction or a catalog commit names must be on disk first: fsync them.
        properties[PY_IO_IMPL] = DURABLE_FILE_IO
    return pyiceberg_load_catalog(settings.name, **properties)


def is_local_warehouse(warehouse: str | None) -> bool:
    """A warehouse on a local or mounted filesystem (``file://`` or a plain path): files need fsync."""
    return warehouse is not None and (warehouse.startswith("file:") or "://" not in warehouse)


def spark_catalog_conf(settings: CatalogSettings) -> dict[str, str]:
    """Spark properties registering the same catalog in Spark SQL under the same name."""
    prefix = f"spark.sql.catalog.{settings.name}"
    conf = {prefix: "org.apache.iceberg.spark.SparkCatalog"}
    passthrough = {k: v for k, v in settings.properties().items() if k not in {"type", "uri"}}
    if settings.type == "sql":
        uri = settings.uri or ""
        path = sqlite_path(uri)
        conf[f"{prefix}.type"] = "jdbc"
        conf[f"{prefix}.uri"] = f"jdbc:sqlite:{path}" if path is not None else f"jdbc:{uri}"
    else:
        conf[f"{prefix}.type"] = settings.type
        if settings.uri is not None:
            conf[f"{prefix}.uri"] = settings.uri
    for key, value in passthrough.items():
        conf[f"{prefix}.{key}"] = value
    return conf
