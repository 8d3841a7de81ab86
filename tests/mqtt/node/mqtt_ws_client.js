// MQTT.js against a broker over WebSocket, TLS or secure WebSocket
// (tests/mqtt/test_gateway_websocket.py, test_gateway_tls.py):
//   node mqtt_ws_client.js URL LEVEL CLIENT_ID [CA_FILE]
// URL ws://127.0.0.1:PORT/mqtt, mqtts://127.0.0.1:PORT or wss://127.0.0.1:PORT/mqtt;
// LEVEL 3, 4 or 5. With CA_FILE the server's certificate must chain to that CA and name
// "localhost" (verified: rejectUnauthorized); without it a TLS URL trusts Node's default
// CAs only. CONNECT as guest, SUBSCRIBE ws/js/# at QoS 1, PUBLISH ws/js/a at QoS 1 and
// ws/js/b at QoS 0, wait for both echoes, DISCONNECT. Prints one JSON line of what the
// client reported (an error with its code); exits 0 when it all completed.
"use strict";
const mqtt = require("mqtt");

const fs = require("fs");

const [url, levelText, clientId, caFile] = process.argv.slice(2);
const level = Number(levelText);
const report = { connack: null, granted: null, messages: [], error: null };

function finish(ok) {
  console.log(JSON.stringify(report));
  process.exit(ok ? 0 : 1);
}
setTimeout(() => { report.error = report.error || "timeout"; finish(false); }, 15000);

const options = {
  clientId, protocolVersion: level, protocolId: level === 3 ? "MQIsdp" : "MQTT",
  username: "guest", password: "guest", clean: true, reconnectPeriod: 0,
  rejectUnauthorized: true, servername: "localhost",
};
if (caFile) options.ca = fs.readFileSync(caFile);
const client = mqtt.connect(url, options);
client.on("error", (error) => {
  report.error = { message: String(error), code: error.code || null };
  finish(false);
});
client.on("connect", (connack) => {
  report.connack = { returnCode: connack.returnCode, reasonCode: connack.reasonCode };
  client.subscribe("ws/js/#", { qos: 1 }, (error, granted) => {
    if (error) { report.error = String(error); finish(false); return; }
    report.granted = granted.map((g) => g.qos);
    client.publish("ws/js/a", "one", { qos: 1 });
    client.publish("ws/js/b", "two", { qos: 0 });
  });
});
client.on("message", (topic, payload, packet) => {
  report.messages.push({ topic, payload: payload.toString(), qos: packet.qos });
  if (report.messages.length === 2) client.end(false, {}, () => finish(true));
});
