"""The PySpark data source: reads the segment log's on-disk format directly.

`from spark_source import StreamqDataSource` needs pyspark (the `spark` extra); the other
modules (`options`, `planning`, `logdir`, `arrow`) need only pyarrow, so they are imported
lazily here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spark_source.source import StreamqDataSource

__all__ = ["StreamqDataSource"]


def __getattr__(name: str) -> object:
    if name == "StreamqDataSource":
        from spark_source.source import StreamqDataSource  # noqa: PLC0415  # needs pyspark

        return StreamqDataSource
    raise AttributeError(name)
