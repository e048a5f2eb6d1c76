"""The export's tables as Spark schemas (from :mod:`martinet.swiftlets.spark.api`)."""

from __future__ import annotations

from pyspark.sql import types as T

from martinet.swiftlets.spark.api import TABLES

__all__ = ["spark_schema"]

_TYPES = {"string": T.StringType(), "timestamp": T.TimestampType(), "double": T.DoubleType(), "long": T.LongType()}


def spark_schema(table: str) -> T.StructType:
    """The Spark schema of ``rows`` or ``events``.

    Raises:
        ValueError: no such table.
    """
    if table not in TABLES:
        raise ValueError(f"no table {table!r}: use {' or '.join(TABLES)}")
    return T.StructType([T.StructField(name, _TYPES[kind]) for name, kind in TABLES[table]])
