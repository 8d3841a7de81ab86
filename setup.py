"""Build configuration for streamq's C accelerators (the rest is in pyproject.toml).

All sit on the per-message hot path (STYLE.md section 11) and are measured in
docs/perf.md: `amqp_gateway.codec._scan` splits a read's publishes into runs,
`amqp_gateway.codec._deliver` writes a delivery's frames (and a run of deliveries
straight from log records), `mqtt_gateway.codec._scan` splits a read's MQTT PUBLISH
packets into runs, and `streamq.log._records` encodes a run of log records
with their CRC32C, and `streamq.log._streamwire` turns a stream-protocol Publish frame into
records and builds chunks for stream consumers (and a stored chunk's entries as records
for AMQP consumers), and `streamq.log._amqp10` converts stream clients'
AMQP 1.0 messages for AMQP 0-9-1 consumers and the Spark source. They need a C
compiler and Python's headers at install time (`pip install -e .` builds them in place).
"""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-Wall", "-Wextra"]

setup(
    ext_modules=[
        Extension(
            "amqp_gateway.codec._scan",
            ["amqp_gateway/codec/_scan.c", "amqp_gateway/codec/_scan_acks.c"],
            depends=["amqp_gateway/codec/_scan_frames.h", "streamq/_steal_tuple.h"],
            extra_compile_args=_FLAGS,
        ),
        Extension(
            "amqp_gateway.codec._deliver",
            ["amqp_gateway/codec/_deliver.c", "amqp_gateway/codec/_deliver_runs.c"],
            depends=[
                "amqp_gateway/codec/_deliver_frames.h",
                "streamq/log/_le.h",
                "streamq/log/_amqp10_convert.h",
                "streamq/log/_amqp10_values.h",
            ],
            extra_compile_args=_FLAGS,
        ),
        Extension(
            "mqtt_gateway.codec._scan",
            ["mqtt_gateway/codec/_scan.c"],
            depends=["streamq/_steal_tuple.h"],
            extra_compile_args=_FLAGS,
        ),
        Extension(
            "streamq.log._records",
            ["streamq/log/_records.c", "streamq/log/_records_scan.c"],
            depends=["streamq/log/_crc32c.h", "streamq/log/_le.h", "streamq/log/_records_layout.h"],
            extra_compile_args=_FLAGS,
        ),
        Extension(
            "streamq.log._streamwire",
            [
                "streamq/log/_streamwire.c",
                "streamq/log/_streamwire_runs.c",
                "streamq/log/_streamwire_publish.c",
                "streamq/log/_streamwire_chunks.c",
                "streamq/log/_streamwire_publish_frames.c",
            ],
            depends=[
                "streamq/log/_crc32.h",
                "streamq/log/_crc32c.h",
                "streamq/log/_le.h",
                "streamq/log/_streamwire_entries.h",
            ],
            extra_compile_args=_FLAGS,
        ),
        Extension(
            "streamq.log._amqp10",
            ["streamq/log/_amqp10.c"],
            depends=["streamq/log/_amqp10_convert.h", "streamq/log/_amqp10_values.h"],
            extra_compile_args=_FLAGS,
        ),
    ]
)
