"""One local SparkSession for the whole test run (a JVM costs seconds and 0.5 GB), with
the streamq source registered. pyspark (the `spark` extra) and Java are prerequisites that
`make test` installs: a missing one fails the run, it never skips these tests quietly."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pytest

if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    raise RuntimeError(
        "the Spark tests need Java 17 or 21: `make test` installs Debian's "
        "openjdk-17-jre-headless (tools/install-system-packages.sh)"
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession  # noqa: PLC0415  # only after the Java check

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
