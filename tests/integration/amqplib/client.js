// amqplib against a streamq broker: confirms, a topic exchange, prefetch and acks,
// mandatory returns and a 404 channel error. Prints one JSON line with what happened.
"use strict";
const amqp = require("amqplib");

const TIMEOUT_MS = 10000;

async function main(port) {
  const connection = await amqp.connect(`amqp://guest:guest@127.0.0.1:${port}`);
  const result = { bodies: [], headers: [], returned: [], errorCode: null };
  const channel = await connection.createConfirmChannel();
  await channel.assertExchange("js-ex", "topic", { durable: true });
  await channel.assertQueue("js-q", { durable: true });
  await channel.bindQueue("js-q", "js-ex", "a.#");
  channel.on("return", (message) => result.returned.push(message.fields.replyCode));
  for (let n = 0; n < 50; n++) {
    channel.publish("js-ex", "a.b", Buffer.from(`m${n}`), { headers: { n } });
  }
  channel.publish("js-ex", "zzz", Buffer.from("stray"), { mandatory: true });
  await channel.waitForConfirms();
  await channel.prefetch(10);
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("consume timed out")), TIMEOUT_MS);
    channel.consume("js-q", (message) => {
      result.bodies.push(message.content.toString());
      result.headers.push(message.properties.headers.n);
      channel.ack(message);
      if (result.bodies.length === 50) {
        clearTimeout(timer);
        resolve();
      }
    });
  });
  const other = await connection.createChannel();
  other.on("error", () => {});
  try {
    await other.checkQueue("no-such-queue");
  } catch (error) {
    result.errorCode = error.code;
  }
  await channel.close();
  await connection.close();
  return result;
}

main(Number(process.argv[2])).then(
  (result) => {
    console.log(JSON.stringify(result));
  },
  (error) => {
    console.error(error.stack || String(error));
    process.exit(1);
  },
);
