"""One local SparkSession for the whole test run (a JVM costs seconds and 0.5 GB), with
the streamq source registered. Skipped only when pyspark or Java is missing."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("the Spark tests need Java 17 or 21", allow_module_level=True)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession  # noqa: PLC0415  # only after the skip checks

    from spark_source import StreamqDataSource  # noqa: PLC0415

    # Workers run PYSPARK_PYTHON, else whatever python3 is on PATH (no venv, no package).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("streamq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(StreamqDataSource)
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()
