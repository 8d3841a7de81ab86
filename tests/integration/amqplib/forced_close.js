// amqplib publishing without pause when the broker closes its connection (the management
// API's close, 320 CONNECTION_FORCED): it must see that close, with no socket error.
// Prints "ready" once it publishes, then one JSON line with how the connection ended.
"use strict";
const amqp = require("amqplib");

const TIMEOUT_MS = 15000;
const BODY_BYTES = 64 * 1024;
const PUBLISHES_PER_TURN = 50;

async function main(port, queue) {
  const connection = await amqp.connect(`amqp://guest:guest@127.0.0.1:${port}`);
  const errors = [];
  connection.on("error", (error) => errors.push(error.code || String(error)));
  const closed = new Promise((resolve) => {
    connection.on("close", (error) => resolve(error ? String(error.message) : "none"));
  });
  const channel = await connection.createChannel();
  channel.on("error", (error) => errors.push(error.code || String(error)));
  await channel.assertQueue(queue, { durable: false });
  const body = Buffer.alloc(BODY_BYTES, 120);
  let stopped = false;
  const pump = () => {
    if (stopped) return;
    for (let n = 0; n < PUBLISHES_PER_TURN; n++) channel.publish("", queue, body);
    setImmediate(pump);
  };
  pump();
  console.log("ready");
  let timer;
  const timeout = new Promise((resolve) => {
    timer = setTimeout(() => resolve("timed out"), TIMEOUT_MS);
  });
  const outcome = await Promise.race([closed, timeout]);
  stopped = true;
  clearTimeout(timer);
  return { outcome, errors };
}

main(Number(process.argv[2]), process.argv[3] || "js-forced").then(
  (result) => {
    console.log(JSON.stringify(result));
    process.exit(0);
  },
  (error) => {
    console.error(error.stack || String(error));
    process.exit(1);
  },
);
