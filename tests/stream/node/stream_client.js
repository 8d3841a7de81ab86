// RabbitMQ's stream client for Node.js (rabbitmq-stream-js-client) against a broker's
// stream port; one scenario per run, one JSON line on stdout with what happened.
//   dedup PORT STREAM       publishing ids 0, 1, 2 under a new reference: the confirms,
//                           then every stored message read back from the first offset
//   resolver PORT STREAM    through the client's address resolver (a load balancer in
//                           front: it dials 127.0.0.1 and keeps the connection whose
//                           advertised host and port are Metadata's leader): publishes
//                           one message and reads it back
//   closed PORT STREAM      prints "ready" once a publisher is declared, then waits for
//                           the broker to close the connection (the test closes it from
//                           the management API): how the client saw the end
"use strict";
const rabbit = require("rabbitmq-stream-js-client");

const TIMEOUT_MS = 10000;

function connect(port, listeners = {}, more = {}) {
  return rabbit.connect({
    hostname: "127.0.0.1",
    port,
    username: "guest",
    password: "guest",
    vhost: "/",
    listeners,
    ...more,
  });
}

function within(promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} timed out`)), TIMEOUT_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function dedup(port, stream) {
  const client = await connect(port);
  await client.createStream({ stream, arguments: {} });
  const publisher = await client.declarePublisher({ stream, publisherRef: "new-reference" });
  const confirmed = [];
  const allConfirmed = new Promise((resolve) => {
    publisher.on("publish_confirm", (error, ids) => {
      if (error === null) confirmed.push(...ids.map(Number));
      if (confirmed.length >= 3) resolve();
    });
  });
  // send() takes an explicit publishingId only when truthy (0n is not): basicSend puts
  // the given id on the wire as it is.
  for (const id of [0n, 1n, 2n]) {
    await publisher.basicSend(id, Buffer.from(`m${id}`));
  }
  await publisher.flush();
  await within(allConfirmed, "confirms");
  const sequence = Number(await publisher.getLastPublishingId());
  const stored = [];
  const enough = new Promise((resolve) => {
    const done = () => setTimeout(resolve, 300); // and nothing more after the third
    client
      .declareConsumer({ stream, offset: rabbit.Offset.first() }, (message) => {
        stored.push(message.content.toString());
        if (stored.length === 3) done();
      })
      .catch(resolve);
  });
  await within(enough, "consume").catch((error) => {
    throw new Error(`${error.message}: stored ${JSON.stringify(stored)}, confirmed ${confirmed}`);
  });
  await client.close();
  return { confirmed: confirmed.sort(), sequence, stored };
}

async function resolver(port, stream) {
  const endpoint = { host: "127.0.0.1", port };
  const client = await connect(port, {}, { addressResolver: { enabled: true, endpoint } });
  await client.createStream({ stream, arguments: {} });
  const publisher = await client.declarePublisher({ stream });
  const confirmed = new Promise((resolve) => publisher.on("publish_confirm", resolve));
  await publisher.send(Buffer.from("through the resolver"));
  await publisher.flush();
  await within(confirmed, "confirm");
  const stored = [];
  const read = new Promise((resolve) => {
    client
      .declareConsumer({ stream, offset: rabbit.Offset.first() }, (message) => {
        stored.push(message.content.toString());
        resolve();
      })
      .catch(resolve);
  });
  await within(read, "consume");
  await client.close();
  return { stored };
}

async function closed(port, stream) {
  let resolveClosed;
  const ended = new Promise((resolve) => {
    resolveClosed = resolve;
  });
  const errors = [];
  process.on("uncaughtException", (error) => errors.push(`uncaught: ${error.message}`));
  const client = await connect(port, {
    connection_closed: (hadError) => resolveClosed(`connection_closed hadError=${hadError}`),
  });
  await client.createStream({ stream, arguments: {} });
  const publisher = await client.declarePublisher({ stream });
  await publisher.send(Buffer.from("before"));
  await publisher.flush();
  console.log("ready");
  const outcome = await within(ended, "the broker's close");
  return { outcome, errors };
}

const [mode, port, stream] = process.argv.slice(2);
const run = { dedup, resolver, closed }[mode];
run(Number(port), stream).then(
  (result) => {
    console.log(JSON.stringify(result));
    process.exit(0);
  },
  (error) => {
    console.error(error.stack || String(error));
    process.exit(1);
  },
);
