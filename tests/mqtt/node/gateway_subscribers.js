// MQTT.js 5.0 against the MQTT gateway (tests/mqtt/test_gateway_mqtt_js.py):
//   node gateway_subscribers.js PORT
// Two members of the shared group "g" subscribe to "$share/g/js/#" at QoS 2, a third
// client subscribes to "js/#" at QoS 2 with Subscription Identifier 42 and No Local, then
// publishes 10 messages at QoS 2 to "js/n" itself (none may come back to it: No Local)
// while the first member publishes 10 more. Prints one JSON line: what each client
// received (payload, QoS, subscription identifiers); exits 0 once all expected arrived
// and a quiet second passed, 1 on a timeout or a client error.
"use strict";
const mqtt = require("mqtt");

const port = Number(process.argv[2]);
const report = { members: [[], []], watcher: [], error: null };
const EXPECTED_SHARED = 20;
const EXPECTED_WATCHER = 10; // the member's 10; its own 10 are No Local

function finish(ok) {
  console.log(JSON.stringify(report));
  process.exit(ok ? 0 : 1);
}
setTimeout(() => { report.error = report.error || "timeout"; finish(false); }, 30000);

function client(id) {
  const c = mqtt.connect({
    host: "127.0.0.1", port, protocolVersion: 5, clientId: id, username: "guest",
    password: "guest", clean: true, reconnectPeriod: 0,
  });
  c.on("error", (err) => { report.error = String(err); finish(false); });
  return c;
}

function subscribed(c, filter, options) {
  return new Promise((resolve, reject) => {
    c.on("connect", () => c.subscribe(filter, options, (err, granted) => {
      if (err) reject(err); else resolve(granted);
    }));
  });
}

function record(list) {
  return (topic, payload, packet) => {
    const ids = (packet.properties && packet.properties.subscriptionIdentifier) || [];
    list.push({ topic, payload: payload.toString(), qos: packet.qos,
                ids: Array.isArray(ids) ? ids : [ids] });
    check();
  };
}

let quietTimer = null;
function check() {
  const shared = report.members[0].length + report.members[1].length;
  if (shared >= EXPECTED_SHARED && report.watcher.length >= EXPECTED_WATCHER) {
    clearTimeout(quietTimer);
    quietTimer = setTimeout(() => finish(true), 1000); // nothing more may come
  }
}

async function main() {
  const members = [client("js-member-0"), client("js-member-1")];
  const watcher = client("js-watcher");
  members.forEach((m, n) => m.on("message", record(report.members[n])));
  watcher.on("message", record(report.watcher));
  await Promise.all([
    subscribed(members[0], "$share/g/js/#", { qos: 2 }),
    subscribed(members[1], "$share/g/js/#", { qos: 2 }),
    subscribed(watcher, "js/#", { qos: 2, nl: true, properties: { subscriptionIdentifier: 42 } }),
  ]);
  for (let n = 0; n < 10; n++) {
    watcher.publish(`js/${n}`, `w${n}`, { qos: 2 });
    members[0].publish(`js/${n}`, `m${n}`, { qos: 2 });
  }
}
main().catch((err) => { report.error = String(err); finish(false); });
