"""Small client programs the security tests run as real clients (node for kafkajs)."""

from __future__ import annotations

# kafkajs over SASL (argv: broker mechanism username password topic [ca.pem]): produces j0, j1, consumes
# them back in group g-<topic>, prints them as JSON.
KAFKAJS = """
const fs = require('fs');
const { Kafka, logLevel } = require('kafkajs');
const [broker, mechanism, username, password, topic, ca] = process.argv.slice(2);
// With a CA file: SASL_SSL (the test certificates name localhost, so no host name check); else SASL_PLAINTEXT.
const ssl = ca ? { ca: [fs.readFileSync(ca)], rejectUnauthorized: true, checkServerIdentity: () => undefined }
               : false;
const kafka = new Kafka({ brokers: [broker], sasl: { mechanism: mechanism.toLowerCase(), username, password },
                          ssl, logLevel: logLevel.NOTHING });
(async () => {
  const p = kafka.producer();
  await p.connect();
  await p.send({ topic, messages: [{ value: 'j0' }, { value: 'j1' }] });
  await p.disconnect();
  const c = kafka.consumer({ groupId: 'g-' + topic });
  await c.connect();
  await c.subscribe({ topic, fromBeginning: true });
  const got = [];
  await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('timeout')), 25000);
    c.run({ eachMessage: async ({ message }) => { got.push(message.value.toString());
      if (got.length === 2) { clearTimeout(t); resolve(); } } });
  });
  await c.disconnect();
  console.log(JSON.stringify(got));
})().catch((e) => { console.error(e); process.exit(1); });
"""
