// amqplib closing a connection while publishes are still queued in its channel's
// buffer: the connection.close frame can go out before them, so the broker receives
// publishes after its close-ok. RabbitMQ reads and discards them until the client hangs
// up; a broker that closes the socket at once resets the connection and close() never
// returns. Prints one JSON line: how many publishes were queued and how close() ended.
"use strict";
const amqp = require("amqplib");

const TIMEOUT_MS = 15000;
const MESSAGES = Number(process.argv[4] || 2000);
const BODY_BYTES = 64 * 1024;

async function main(port, queue) {
  const connection = await amqp.connect(`amqp://guest:guest@127.0.0.1:${port}`);
  const errors = [];
  connection.on("error", (error) => errors.push(error.code || String(error)));
  const channel = await connection.createChannel();
  channel.on("error", (error) => errors.push(error.code || String(error)));
  await channel.assertQueue(queue, { durable: false });
  const body = Buffer.alloc(BODY_BYTES, 120);
  let refused = 0; // publish() returned false: the channel buffers the rest
  for (let n = 0; n < MESSAGES; n++) {
    if (!channel.publish("", queue, body)) refused++;
  }
  const started = Date.now();
  const outcome = await Promise.race([
    connection.close().then(
      () => "closed",
      (error) => `rejected: ${error.code || error.message}`,
    ),
    new Promise((resolve) => setTimeout(() => resolve("timed out"), TIMEOUT_MS)),
  ]);
  return { outcome, refused, errors, closeMs: Date.now() - started };
}

main(Number(process.argv[2]), process.argv[3] || "js-close-queued").then(
  (result) => {
    console.log(JSON.stringify(result));
    process.exit(0);
  },
  (error) => {
    console.error(error.stack || String(error));
    process.exit(1);
  },
);
