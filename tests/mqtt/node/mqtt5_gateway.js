// MQTT.js 5.0 against the streamq broker (tests/mqtt/test_gateway_mqtt5_properties.py):
//   node mqtt5_gateway.js PORT
// CONNECT with Topic Alias Maximum 2, SUBSCRIBE js5/# at QoS 1, PUBLISH js5/a, js5/b,
// js5/c, js5/a, js5/b, js5/c at QoS 1 with properties and MQTT.js's own Topic Aliases
// (autoAssignTopicAlias: it aliases every topic, reusing the least recently used alias
// once the broker's maximum is reached), wait for the six deliveries (the broker's
// aliases resolved by MQTT.js), DISCONNECT. Prints one JSON line of what it saw; exits 0
// when it saw all, 1 on a timeout or a client error.
"use strict";
const mqtt = require("mqtt");

const [port] = process.argv.slice(2);
const TOPICS = ["js5/a", "js5/b", "js5/c", "js5/a", "js5/b", "js5/c"];
const report = { connack: null, published: 0, messages: [], error: null };

function finish(ok) {
  console.log(JSON.stringify(report));
  process.exit(ok ? 0 : 1);
}
setTimeout(() => { report.error = report.error || "timeout"; finish(false); }, 15000);

const client = mqtt.connect(`mqtt://127.0.0.1:${port}`, {
  clientId: "mqttjs-5-gateway", protocolVersion: 5, username: "guest", password: "guest",
  clean: true, reconnectPeriod: 0, autoAssignTopicAlias: true,
  properties: { topicAliasMaximum: 2 },
});
client.on("error", (error) => { report.error = error.message; finish(false); });

client.on("connect", (connack) => {
  report.connack = { reasonCode: connack.reasonCode, properties: connack.properties || null };
  client.subscribe("js5/#", { qos: 1 }, (error) => {
    if (error) { report.error = String(error); finish(false); return; }
    publishNext(0);
  });
});

function publishNext(index) {  // one after the other: the aliases go in a known order
  if (index === TOPICS.length) return;
  const properties = {
    contentType: "text/plain", correlationData: Buffer.from([index, 255]),
    responseTopic: "js5/replies", userProperties: { n: String(index) },
    messageExpiryInterval: 300, payloadFormatIndicator: true,
  };
  client.publish(TOPICS[index], `m${index}`, { qos: 1, properties }, (error) => {
    if (error) { report.error = String(error); finish(false); return; }
    report.published += 1;
    publishNext(index + 1);
  });
}

client.on("message", (topic, payload, packet) => {
  const properties = packet.properties || {};
  report.messages.push({
    topic, payload: payload.toString(), qos: packet.qos,
    topicAlias: properties.topicAlias === undefined ? null : properties.topicAlias,
    contentType: properties.contentType || null,
    correlationData: properties.correlationData ? [...properties.correlationData] : null,
    responseTopic: properties.responseTopic || null,
    userProperties: properties.userProperties || null,
    messageExpiryInterval: properties.messageExpiryInterval === undefined
      ? null : properties.messageExpiryInterval,
    payloadFormatIndicator: properties.payloadFormatIndicator || false,
  });
  if (report.messages.length === TOPICS.length) client.end(false, () => finish(true));
});
