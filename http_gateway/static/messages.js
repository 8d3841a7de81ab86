// Publish a message to an exchange and get messages from a queue (RabbitMQ's
// POST .../publish and POST .../get), as forms shared by the queue and exchange pages.

import { api, exchangePath, queuePath } from './api.js';
import { card, checkbox, clear, details, field, fmtNum, h, parseArgs, run, select, toast } from './dom.js';

export function publishForm(vhost, exchange, routingKey = '') {
  const result = h('p', { id: 'publish-result', class: 'muted', role: 'status' });
  const form = h('form', { class: 'form', id: 'publish-form' },
    h('div', { class: 'row' },
      field('Routing key', h('input', { id: 'publish-routing-key', value: routingKey })),
      field('Delivery mode', select('publish-delivery-mode', [['2', '2 – persistent'], ['1', '1 – transient']], '2'))),
    h('div', { class: 'row' },
      field('Headers', h('textarea', { id: 'publish-headers', rows: 2, placeholder: 'key=value, one a line' })),
      field('Properties', h('textarea', { id: 'publish-properties', rows: 2, placeholder: 'content_type=text/plain' }))),
    field('Payload', h('textarea', { id: 'publish-payload', rows: 4 })),
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary', id: 'publish-submit' }, 'Publish message'), result));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    run(form.querySelector('#publish-submit'), async () => {
      const properties = parseArgs(form.querySelector('#publish-properties').value);
      const headers = parseArgs(form.querySelector('#publish-headers').value);
      properties.delivery_mode = Number(form.querySelector('#publish-delivery-mode').value);
      if (Object.keys(headers).length) properties.headers = headers;
      const answer = await api(`${exchangePath(vhost, exchange)}/publish`, {
        method: 'POST',
        body: {
          properties,
          routing_key: form.querySelector('#publish-routing-key').value,
          payload: form.querySelector('#publish-payload').value,
          payload_encoding: 'string',
        },
      });
      const routed = answer && answer.routed;
      result.textContent = routed === false ? 'Message published, but not routed to any queue.' : 'Message published.';
      result.className = routed === false ? 'warn' : 'ok';
      toast(result.textContent, routed === false ? 'warn' : 'ok');
    });
  });
  return card('Publish message', form);
}

function messageView(message, index) {
  const props = message.properties || {};
  return h('div', { class: 'message' },
    h('h3', {}, `Message ${index + 1}`),
    details([
      ['Exchange', message.exchange === '' ? '(AMQP default)' : message.exchange],
      ['Routing key', message.routing_key],
      ['Redelivered', message.redelivered],
      ['Remaining in queue', message.message_count],
      ['Properties', Object.keys(props).length ? props : undefined],
      ['Payload', h('pre', { class: 'payload' }, message.payload === undefined ? '' : String(message.payload))],
      ['Size', `${fmtNum(message.payload_bytes)} bytes, ${message.payload_encoding || 'string'}`],
    ]));
}

export function getForm(vhost, queue) {
  const out = h('div', { id: 'get-result' });
  const form = h('form', { class: 'form', id: 'get-form' },
    h('div', { class: 'row' },
      field('Ack mode', select('get-ackmode', [
        ['ack_requeue_true', 'Nack, requeue'],
        ['reject_requeue_false', 'Reject, do not requeue'],
        ['ack_requeue_false', 'Ack, remove from queue'],
      ], 'ack_requeue_true')),
      field('Encoding', select('get-encoding', [['auto', 'Auto string / base64'], ['base64', 'base64']], 'auto')),
      field('Messages', h('input', { id: 'get-count', type: 'number', min: 1, value: '1' }))),
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary', id: 'get-submit' }, 'Get messages'),
      checkbox('get-truncate', 'Truncate payloads at 50,000 bytes', true)));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    run(form.querySelector('#get-submit'), async () => {
      const body = {
        count: Number(form.querySelector('#get-count').value) || 1,
        ackmode: form.querySelector('#get-ackmode').value,
        encoding: form.querySelector('#get-encoding').value,
      };
      if (form.querySelector('#get-truncate').checked) body.truncate = 50000;
      const messages = await api(`${queuePath(vhost, queue)}/get`, { method: 'POST', body });
      clear(out, Array.isArray(messages) && messages.length
        ? messages.map(messageView) : h('p', { class: 'muted' }, 'Queue is empty.'));
    });
  });
  return card('Get messages', form, out);
}
