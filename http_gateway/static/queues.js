// Queues and streams: the list (depth, rates, consumers, policy, stream offsets), a form
// to declare one, and a page per queue with consumers, bindings, publish, get, purge, delete.

import { api, enc, listPath, queuePath } from './api.js';
import { LineChart } from './chart.js';
import { bindingsCard } from './bindings.js';
import {
  badge, card, checkbox, clear, dangerButton, details, field, fmtBytes, fmtNum, fmtRate, fmtValue,
  get, h, kvList, link, parseArgs, run, select, table, toast,
} from './dom.js';
import { getForm, publishForm } from './messages.js';

const ARGUMENT_BADGES = {
  'x-message-ttl': 'TTL',
  'x-expires': 'Exp',
  'x-max-length': 'Lim',
  'x-max-length-bytes': 'Lim B',
  'x-dead-letter-exchange': 'DLX',
  'x-dead-letter-routing-key': 'DLK',
  'x-max-priority': 'Pri',
  'x-max-age': 'Age',
  'x-stream-max-segment-size-bytes': 'Seg',
  'x-single-active-consumer': 'SAC',
};

const isStream = (q) => q.type === 'stream' || get(q, 'arguments.x-queue-type') === 'stream';

function features(q) {
  const out = [];
  if (q.durable) out.push(badge('D', 'feature'));
  if (q.auto_delete) out.push(badge('AD', 'feature'));
  if (q.exclusive) out.push(badge('Excl', 'feature'));
  for (const key of Object.keys(q.arguments || {})) {
    if (ARGUMENT_BADGES[key]) out.push(badge(ARGUMENT_BADGES[key], 'feature'));
  }
  return out.length ? h('span', { class: 'badges', title: JSON.stringify(q.arguments || {}) }, out) : '–';
}

// A stream's offsets: first_offset .. last_offset (or RabbitMQ's committed_offset), and
// its segment count.
function streamInfo(q) {
  if (!isStream(q)) return '–';
  const first = get(q, 'first_offset');
  const last = get(q, 'last_offset', get(q, 'committed_offset'));
  const segments = segmentCount(q);
  return h('span', { class: 'stream-info' }, `${fmtNum(first)} … ${fmtNum(last)}`,
    segments === undefined ? null : h('span', { class: 'muted' }, `${fmtNum(segments)} segment${segments === 1 ? '' : 's'}`));
}

function segmentCount(q) {
  const segments = get(q, 'segments');
  if (Array.isArray(segments)) return segments.length;
  return segments;
}

function stateBadge(q) {
  const value = q.state || 'running';
  return badge(value, value === 'running' ? 'ok' : value === 'idle' ? '' : 'warn');
}

function queueLink(q) {
  return link(`#/queue/${enc(q.vhost)}/${enc(q.name)}`, q.name);
}

function createForm(ctx, onCreated) {
  const vhost = select('queue-vhost', ctx.vhosts.map((v) => [v, v]), ctx.vhost || ctx.vhosts[0]);
  const form = h('form', { class: 'form', id: 'queue-form' },
    h('div', { class: 'row' },
      field('Type', select('queue-type', [['classic', 'Classic'], ['stream', 'Stream']], 'classic')),
      field('Virtual host', vhost),
      field('Name', h('input', { id: 'queue-name', required: true, autocomplete: 'off' })),
      field('Options', h('div', { class: 'checks' },
        checkbox('queue-durable', 'Durable', true), checkbox('queue-auto-delete', 'Auto delete', false)))),
    field('Arguments', h('textarea', { id: 'queue-arguments', rows: 2, placeholder: 'x-max-length=1000\nx-message-ttl=60000' }),
      'key=value, one a line; numbers and true/false are typed.'),
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary', id: 'queue-add' }, 'Add queue')));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    run(form.querySelector('#queue-add'), async () => {
      const name = form.querySelector('#queue-name').value.trim();
      const type = form.querySelector('#queue-type').value;
      const args = parseArgs(form.querySelector('#queue-arguments').value);
      if (type !== 'classic') args['x-queue-type'] = type;
      await api(queuePath(vhost.value, name), {
        method: 'PUT',
        body: {
          durable: type === 'stream' || form.querySelector('#queue-durable').checked,
          auto_delete: form.querySelector('#queue-auto-delete').checked,
          arguments: args,
        },
      });
      toast(`Queue ${name} declared.`, 'ok');
      form.querySelector('#queue-name').value = '';
      await onCreated();
    });
  });
  return h('details', { class: 'card collapsible', id: 'queue-add-panel', open: true },
    h('summary', {}, 'Add a queue or stream'), form);
}

export async function listPage(ctx) {
  ctx.setTitle('Queues & streams');
  const filter = h('input', { id: 'queue-filter', type: 'search', placeholder: 'Filter by name' });
  const list = h('div', { id: 'queues-list' });
  let last = [];
  const draw = () => {
    const needle = filter.value.trim().toLowerCase();
    const rows = last.filter((q) => !needle || String(q.name).toLowerCase().includes(needle));
    clear(list, table('queues-table', [
      ctx.vhost || ctx.vhosts.length < 2 ? null : { title: 'Virtual host', value: (q) => q.vhost },
      { title: 'Name', value: queueLink, class: 'name' },
      { title: 'Type', value: (q) => badge(q.type || (isStream(q) ? 'stream' : 'classic'), isStream(q) ? 'stream' : 'classic') },
      { title: 'Features', value: features },
      { title: 'Policy', value: (q) => q.policy || q.operator_policy || '–' },
      { title: 'State', value: stateBadge },
      { title: 'Ready', num: true, field: 'messages_ready', value: (q) => fmtNum(q.messages_ready) },
      { title: 'Unacked', num: true, field: 'messages_unacknowledged', value: (q) => fmtNum(q.messages_unacknowledged) },
      { title: 'Total', num: true, field: 'messages', value: (q) => fmtNum(q.messages) },
      { title: 'Incoming', num: true, value: (q) => fmtRate(get(q, 'message_stats.publish_details.rate')) },
      { title: 'Deliver', num: true, value: (q) => fmtRate(get(q, 'message_stats.deliver_get_details.rate')) },
      { title: 'Ack', num: true, value: (q) => fmtRate(get(q, 'message_stats.ack_details.rate')) },
      { title: 'Consumers', num: true, field: 'consumers', value: (q) => fmtNum(q.consumers) },
      { title: 'Stream offsets', num: true, value: streamInfo },
    ].filter(Boolean), rows, { empty: needle ? 'No queue matches.' : 'No queues yet.', key: (q) => `${q.vhost}/${q.name}` }));
  };
  filter.addEventListener('input', draw);
  const refresh = async () => {
    const queues = await api(listPath('queues', ctx.vhost));
    last = Array.isArray(queues) ? queues : [];
    draw();
  };
  ctx.main.append(createForm(ctx, refresh), card('All queues', h('div', { class: 'toolbar' }, filter), list));
  return { refresh };
}

function consumersTable(consumers) {
  return table('consumers-table', [
    { title: 'Consumer tag', value: (c) => c.consumer_tag },
    { title: 'Channel', value: (c) => get(c, 'channel_details.name', '–') },
    { title: 'Peer', value: (c) => get(c, 'channel_details.peer_host', '–') },
    { title: 'Ack required', value: (c) => fmtValue(c.ack_required) },
    { title: 'Exclusive', value: (c) => fmtValue(c.exclusive) },
    { title: 'Prefetch', num: true, value: (c) => fmtNum(c.prefetch_count) },
    // RabbitMQ's activity_status: up, or single_active / waiting on a single-active-consumer queue.
    { title: 'Activity', value: (c) => c.activity_status || fmtValue(c.active) },
    { title: 'Arguments', value: (c) => kvList(c.arguments) },
  ], consumers, { empty: 'No consumers.' });
}

function summary(q) {
  const pairs = [
    ['Type', q.type || (isStream(q) ? 'stream' : 'classic')],
    ['State', q.state],
    ['Durable', q.durable],
    ['Auto delete', q.auto_delete],
    ['Exclusive', q.exclusive],
    ['Arguments', q.arguments && Object.keys(q.arguments).length ? q.arguments : undefined],
    ['Policy', q.policy],
    ['Operator policy', q.operator_policy],
    ['Effective policy definition', q.effective_policy_definition && Object.keys(q.effective_policy_definition).length ? q.effective_policy_definition : undefined],
    ['Consumers', q.consumers],
    ...(q.single_active_consumer_tag ? [['Single active consumer', q.single_active_consumer_tag]] : []),
    ...(q.exclusive_consumer_tag ? [['Exclusive consumer', q.exclusive_consumer_tag]] : []),
    ['Messages ready', q.messages_ready],
    ['Messages unacked', q.messages_unacknowledged],
    ['Messages total', q.messages],
    ['Message bytes', typeof (q.message_bytes ?? q.message_bytes_ready) === 'number' ? fmtBytes(q.message_bytes ?? q.message_bytes_ready) : undefined],
  ];
  if (isStream(q)) {
    pairs.push(['First offset', get(q, 'first_offset')],
      ['Last offset', get(q, 'last_offset', get(q, 'committed_offset'))],
      ['Segments', segmentCount(q)]);
  }
  return details(pairs);
}

export async function detailPage(ctx) {
  const [vhost, name] = ctx.params;
  ctx.setTitle(`Queue ${name}`);
  const info = h('div', { id: 'queue-summary' });
  const consumers = h('div');
  const depth = new LineChart('chart-queue-depth', [
    { key: 'messages_ready', label: 'Ready' }, { key: 'messages_unacknowledged', label: 'Unacked' },
  ], 'count');
  const rates = new LineChart('chart-queue-rates', [
    { key: 'publish', label: 'Incoming' }, { key: 'deliver_get', label: 'Deliver / get' }, { key: 'ack', label: 'Ack' },
  ], 'rate');
  const bindings = bindingsCard(vhost, 'queue', name);
  const path = queuePath(vhost, name);
  const purge = dangerButton('Purge messages', async () => {
    await api(`${path}/contents`, { method: 'DELETE' });
    toast(`Queue ${name} purged.`, 'ok');
  }, { id: 'queue-purge' });
  const actions = h('div', { class: 'actions' }, purge,
    dangerButton('Delete queue', async () => {
      await api(path, { method: 'DELETE' });
      toast(`Queue ${name} deleted.`, 'ok');
      location.hash = '#/queues';
    }, { id: 'queue-delete' }));
  ctx.main.append(
    h('p', { class: 'crumbs' }, link('#/queues', 'Queues & streams'), ' › ', h('strong', {}, name),
      h('span', { class: 'muted' }, ` in virtual host ${vhost}`)),
    h('div', { class: 'grid-2' }, card('Details', info, actions),
      h('div', {}, card('Queued messages', depth.el), card('Message rates', rates.el))),
    card('Consumers', consumers),
    bindings.el,
    h('div', { class: 'grid-2' }, publishForm(vhost, '', name), getForm(vhost, name)),
  );
  const refresh = async () => {
    const q = await api(path);
    clear(info, summary(q));
    purge.hidden = isStream(q); // streams cannot be purged (RabbitMQ: not_supported); retention trims them
    depth.add({ messages_ready: q.messages_ready, messages_unacknowledged: q.messages_unacknowledged });
    const sample = {};
    for (const key of ['publish', 'deliver_get', 'ack']) sample[key] = get(q, `message_stats.${key}_details.rate`, 0);
    rates.add(sample);
    let list = Array.isArray(q.consumer_details) ? q.consumer_details : null;
    if (list === null) {
      try {
        const all = await api(`/api/consumers/${enc(vhost)}`);
        list = all.filter((c) => get(c, 'queue.name') === name);
      } catch (exc) {
        if (exc.status === 401) throw exc;
        list = [];
      }
    }
    clear(consumers, consumersTable(list));
    await bindings.refresh();
  };
  return { refresh };
}
