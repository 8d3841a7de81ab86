// MQTT.js against a loopback MQTT peer (tests/mqtt/test_mqtt_js.py):
//   node mqtt_client.js PORT LEVEL MODE
// LEVEL 3, 4 or 5 (MQTT 3.1, 3.1.1, 5.0). MODE "session": CONNECT (will, credentials,
// 5.0 properties), SUBSCRIBE js/0..2 at QoS 0..2, PUBLISH one message to each at that
// QoS, wait for the three echoes, UNSUBSCRIBE, DISCONNECT. MODE "refused": CONNECT and
// report the refusal. Prints one JSON line of what the client reported, exits 0 when
// the session completed (or the refusal was seen), 1 on a timeout or a client error.
"use strict";
const mqtt = require("mqtt");

const [port, levelText, mode] = process.argv.slice(2);
const level = Number(levelText);
const v5 = level === 5;
const TOPICS = ["js/0", "js/1", "js/2"];
const report = { connack: null, granted: null, published: 0, messages: [], unsubscribed: false, error: null };

function finish(ok) {
  console.log(JSON.stringify(report));
  process.exit(ok ? 0 : 1);
}
setTimeout(() => { report.error = report.error || "timeout"; finish(false); }, 15000);

const options = {
  clientId: `mqttjs-${level}`,
  protocolVersion: level,
  protocolId: level === 3 ? "MQIsdp" : "MQTT",
  username: "device-2",
  password: "secret",
  keepalive: 30,
  clean: true,
  reconnectPeriod: 0,
  will: { topic: "devices/device-2/status", payload: Buffer.from("offline"), qos: 1, retain: true },
};
if (v5) {
  options.properties = {
    sessionExpiryInterval: 120, receiveMaximum: 16, maximumPacketSize: 100000,
    topicAliasMaximum: 4, requestProblemInformation: true, userProperties: { client: "mqtt.js" },
  };
  options.will.properties = {
    willDelayInterval: 2, contentType: "text/plain", messageExpiryInterval: 90,
    userProperties: { why: "lost" },
  };
}
const client = mqtt.connect(`mqtt://127.0.0.1:${port}`, options);

client.on("error", (error) => {
  report.error = { message: error.message, code: error.code };
  finish(mode === "refused");
});

client.on("connect", (connack) => {
  report.connack = { returnCode: connack.returnCode, reasonCode: connack.reasonCode,
                     sessionPresent: connack.sessionPresent, properties: connack.properties || null };
  if (mode === "refused") { finish(false); return; }
  const subscriptions = {};
  TOPICS.forEach((topic, qos) => { subscriptions[topic] = { qos }; });
  const subOptions = v5 ? { properties: { subscriptionIdentifier: 9 } } : {};
  client.subscribe(subscriptions, subOptions, (error, granted) => {
    if (error) { report.error = String(error); finish(false); return; }
    report.granted = granted.map((g) => g.qos);
    TOPICS.forEach((topic, qos) => {
      const publishOptions = { qos };
      if (v5) {
        publishOptions.properties = {
          contentType: "application/json", responseTopic: "replies/js",
          correlationData: Buffer.from([0, 2]), userProperties: { n: String(qos) },
          payloadFormatIndicator: true, messageExpiryInterval: 45,
        };
      }
      client.publish(topic, JSON.stringify({ n: qos }), publishOptions, (publishError) => {
        if (publishError) { report.error = String(publishError); finish(false); return; }
        report.published += 1;
        maybeDone();
      });
    });
  });
});

client.on("message", (topic, payload, packet) => {
  report.messages.push({ topic, payload: payload.toString(), qos: packet.qos,
                         properties: packet.properties || null });
  maybeDone();
});

function maybeDone() {
  if (report.published < TOPICS.length || report.messages.length < TOPICS.length) return;
  client.unsubscribe(TOPICS, (error) => {
    if (error) { report.error = String(error); finish(false); return; }
    report.unsubscribed = true;
    client.end(false, () => finish(true));
  });
}
