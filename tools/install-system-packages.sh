#!/bin/sh
# The Debian packages the test suite needs, installed when missing (`make test` runs this
# first): rabbitmq-server for the differential tests and the rabbitmqadmin tests, which
# start their own RabbitMQ on free loopback ports; chromium and chromium-driver for the
# web UI's browser tests; nodejs and npm for the JavaScript clients (amqplib,
# rabbitmq-stream-js-client, and @cloudamqp/amqp-client in the browser), which the tests
# install with `npm ci`; etcd-server
# for the clustering tests, which start their own etcd on free loopback ports; iproute2
# for the fault suite's test hosts (`ip netns`, tests/faults/netns.py); libfaketime for
# its wall-clock steps on one node (tests/faults/clock.py); a Java runtime
# for the Spark tests' local SparkSession; systemd for `systemd-analyze`, which checks the
# unit file (packaging/systemd/streamq.service). As root it
# installs them with apt-get; otherwise through
# `sudo -n` when that needs no password; else it prints the one command to run and stops.
set -eu
PACKAGES="rabbitmq-server chromium chromium-driver nodejs npm etcd-server iproute2 libfaketime openjdk-17-jre-headless systemd"
missing=""
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || missing="$missing rabbitmq-server"
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
command -v chromedriver >/dev/null 2>&1 || missing="$missing chromium-driver"
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
command -v etcd >/dev/null 2>&1 || missing="$missing etcd-server"
command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
ls /usr/lib/*/faketime/libfaketimeMT.so.1 >/dev/null 2>&1 || missing="$missing libfaketime"
command -v java >/dev/null 2>&1 || [ -n "${JAVA_HOME:-}" ] || missing="$missing openjdk-17-jre-headless"
command -v systemd-analyze >/dev/null 2>&1 || missing="$missing systemd"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    run=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    run="sudo -n"
else
    echo "The tests need Debian packages that are missing:$missing" >&2
    echo "Install them once with: sudo apt-get install -y $PACKAGES" >&2
    exit 1
fi
echo "Installing Debian packages the tests need:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
# The package index of a fresh machine may be stale or empty: update when install fails.
# shellcheck disable=SC2086 # $missing is a list of words
$run apt-get install -y -q $missing || { $run apt-get update -q && $run apt-get install -y -q $missing; }
