"""The PySpark data source: reads the segment log's on-disk format directly."""
