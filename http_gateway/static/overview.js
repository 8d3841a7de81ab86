// Overview: totals, live message-rate and queued-message graphs, node and listeners.

import { api } from './api.js';
import { LineChart } from './chart.js';
import { card, clear, details, fmtNum, get, h, table } from './dom.js';

const RATE_SERIES = [
  { key: 'publish', label: 'Publish' },
  { key: 'confirm', label: 'Publisher confirm' },
  { key: 'deliver_get', label: 'Deliver / get' },
  { key: 'ack', label: 'Consumer ack' },
  { key: 'redeliver', label: 'Redelivered' },
];
const QUEUED_SERIES = [
  { key: 'messages_ready', label: 'Ready' },
  { key: 'messages_unacknowledged', label: 'Unacked' },
  { key: 'messages', label: 'Total' },
];
const TOTALS = [
  ['connections', 'Connections'],
  ['channels', 'Channels'],
  ['exchanges', 'Exchanges'],
  ['queues', 'Queues'],
  ['consumers', 'Consumers'],
];

// The charts live for the whole session, so going back to the overview keeps the history.
const rates = new LineChart('chart-rates', RATE_SERIES, 'rate');
const queued = new LineChart('chart-queued', QUEUED_SERIES, 'count');

function stat(id, label, value) {
  return h('div', { class: 'stat', id }, h('div', { class: 'stat-value' }, value), h('div', { class: 'stat-label' }, label));
}

export async function page(ctx) {
  ctx.setTitle('Overview');
  const stats = h('div', { class: 'stats', id: 'overview-stats' });
  const node = h('div');
  const listeners = h('div');
  ctx.main.append(
    stats,
    h('div', { class: 'grid-2' },
      card('Message rates', rates.el),
      card('Queued messages', queued.el)),
    h('div', { class: 'grid-2' }, card('Node', node), card('Listeners', listeners)),
  );
  const refresh = async () => {
    const info = await api('/api/overview');
    const totals = info.queue_totals || {};
    clear(stats,
      stat('stat-messages', 'Messages', fmtNum(get(totals, 'messages'))),
      stat('stat-ready', 'Ready', fmtNum(get(totals, 'messages_ready'))),
      stat('stat-unacked', 'Unacked', fmtNum(get(totals, 'messages_unacknowledged'))),
      TOTALS.map(([key, label]) => stat(`stat-${key}`, label, fmtNum(get(info, `object_totals.${key}`)))));
    const sample = {};
    for (const { key } of RATE_SERIES) sample[key] = get(info, `message_stats.${key}_details.rate`, 0);
    rates.add(sample);
    const depth = {};
    for (const { key } of QUEUED_SERIES) depth[key] = get(totals, key);
    queued.add(depth);
    clear(node, details([
      ['Product', [info.product_name || 'streamq', info.product_version || info.rabbitmq_version].filter(Boolean).join(' ')],
      ['Node', info.node],
      ['Cluster', info.cluster_name],
      ['Management version', info.management_version],
      ['Rates mode', info.rates_mode],
    ]));
    clear(listeners, table('listeners-table', [
      { title: 'Protocol', value: (l) => l.protocol || '–' },
      { title: 'Bound to', value: (l) => l.ip_address || '–' },
      { title: 'Port', num: true, value: (l) => (l.port === undefined ? '–' : String(l.port)) },
    ], Array.isArray(info.listeners) ? info.listeners : [], { empty: 'Not reported.' }));
  };
  window.addEventListener('resize', () => {
    rates.render();
    queued.render();
  }, { once: true });
  return { refresh };
}
