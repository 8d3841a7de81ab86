// Shovels and federation: the shovels with their state, what they moved and why they
// stopped (pause, resume, restart, delete, and a form to add one), and the federation
// upstreams with the links running from them. A shovel or upstream is a runtime parameter
// (/api/parameters/shovel, /api/parameters/federation-upstream) with RabbitMQ's keys.

import { api, enc, listPath } from './api.js';
import { formCard } from './admin.js';
import {
  badge, card, checkbox, clear, dangerButton, field, fmtNum, h, kvList, run, select, table, toast,
} from './dom.js';

const value = (form, id) => form.querySelector(`#${id}`).value.trim();
const STATE_BADGES = { running: 'ok', starting: 'warn', paused: 'warn', terminated: 'bad', error: 'bad' };

function stateBadge(state) {
  return badge(state || '?', STATE_BADGES[state] || '');
}

function actionButton(label, id, action) {
  const button = h('button', { type: 'button', id }, label);
  button.addEventListener('click', () => run(button, action));
  return button;
}

function end(entry, side) {
  const where = entry[`${side}_queue`] !== undefined ? `queue ${entry[`${side}_queue`]}`
    : entry[`${side}_exchange`] !== undefined ? `exchange ${entry[`${side}_exchange`]}` : '(message\'s own)';
  return h('span', {}, h('code', {}, entry[`${side}_uri`] || '?'), ' ', where);
}

function shovelActions(entry, refresh) {
  const path = `/api/shovels/vhost/${enc(entry.vhost)}/${enc(entry.name)}`;
  const key = `${entry.vhost}/${entry.name}`; // ids such as "shovel-pause:/name"
  const act = (verb, method, done) => actionButton(verb, `shovel-${verb.toLowerCase()}:${key}`, async () => {
    await api(`${path}/${verb.toLowerCase()}`, { method });
    toast(`Shovel ${entry.name} ${done}.`, 'ok');
    await refresh();
  });
  return h('span', { class: 'badges' },
    entry.state === 'paused' ? act('Resume', 'PUT', 'resumed') : act('Pause', 'PUT', 'paused'),
    act('Restart', 'DELETE', 'restarted'),
    dangerButton('Delete', async () => {
      await api(`/api/parameters/shovel/${enc(entry.vhost)}/${enc(entry.name)}`, { method: 'DELETE' });
      toast(`Shovel ${entry.name} deleted.`, 'ok');
      await refresh();
    }, { id: `shovel-delete:${key}` }));
}

function shovelValue(form) {
  const body = { 'src-uri': value(form, 'shovel-src-uri'), 'dest-uri': value(form, 'shovel-dest-uri') };
  body[`src-${value(form, 'shovel-src-kind')}`] = value(form, 'shovel-src-name');
  if (value(form, 'shovel-src-kind') === 'exchange' && value(form, 'shovel-src-key')) body['src-exchange-key'] = value(form, 'shovel-src-key');
  if (value(form, 'shovel-dest-name')) body[`dest-${value(form, 'shovel-dest-kind')}`] = value(form, 'shovel-dest-name');
  body['ack-mode'] = value(form, 'shovel-ack-mode');
  const prefetch = value(form, 'shovel-prefetch');
  if (prefetch) body['src-prefetch-count'] = Number(prefetch);
  if (form.querySelector('#shovel-forward-headers').checked) body['dest-add-forward-headers'] = true;
  return body;
}

export async function shovelsPage(ctx) {
  ctx.setTitle('Shovels');
  const list = h('div');
  const refresh = async () => {
    const shovels = await api(listPath('shovels', ctx.vhost));
    clear(list, table('shovels-table', [
      { title: 'Virtual host', value: (s) => s.vhost },
      { title: 'Name', class: 'name', value: (s) => s.name },
      { title: 'State', field: 'state', value: (s) => stateBadge(s.state) },
      { title: 'Source', value: (s) => end(s, 'src') },
      { title: 'Destination', value: (s) => end(s, 'dest') },
      { title: 'Transferred', num: true, value: (s) => fmtNum(s.transferred) },
      { title: 'Error', field: 'error', value: (s) => s.error || s.reason || '–' },
      { title: '', class: 'actions-cell', value: (s) => shovelActions(s, refresh) },
    ], Array.isArray(shovels) ? shovels : [], { key: (s) => `${s.vhost}/${s.name}`, empty: 'No shovels.' }));
  };
  ctx.main.append(
    formCard('Add or update a shovel', 'shovel-form', [
      field('Virtual host', select('shovel-vhost', ctx.vhosts.map((v) => [v, v]), ctx.vhost || ctx.vhosts[0])),
      field('Name', h('input', { id: 'shovel-name', required: true, autocomplete: 'off' })),
      field('Source URI', h('input', { id: 'shovel-src-uri', required: true, value: 'amqp://' }), 'amqp://user:pass@host:port/vhost; amqp:// is this broker.'),
      field('Source', select('shovel-src-kind', [['queue', 'Queue'], ['exchange', 'Exchange']], 'queue')),
      field('Source name', h('input', { id: 'shovel-src-name', required: true })),
      field('Routing key (exchange source)', h('input', { id: 'shovel-src-key', placeholder: '#' })),
      field('Prefetch', h('input', { id: 'shovel-prefetch', type: 'number', min: '0', placeholder: '1000' })),
      field('Destination URI', h('input', { id: 'shovel-dest-uri', required: true, value: 'amqp://' }), 'amqp[s]://..., or http(s):// to POST each message.'),
      field('Destination', select('shovel-dest-kind', [['queue', 'Queue'], ['exchange', 'Exchange']], 'queue')),
      field('Destination name', h('input', { id: 'shovel-dest-name' }), 'Empty: each message\'s own exchange and routing key.'),
      field('Ack mode', select('shovel-ack-mode', [['on-confirm', 'on-confirm'], ['on-publish', 'on-publish'], ['no-ack', 'no-ack']], 'on-confirm')),
      checkbox('shovel-forward-headers', 'Add forwarding headers', false),
    ], 'Save shovel', async (form) => {
      const name = value(form, 'shovel-name');
      await api(`/api/parameters/shovel/${enc(value(form, 'shovel-vhost'))}/${enc(name)}`, {
        method: 'PUT', body: { value: shovelValue(form) },
      });
      toast(`Shovel ${name} saved.`, 'ok');
      await refresh();
    }),
    card('Shovels', list),
  );
  return { refresh };
}

function upstreamValue(form) {
  const body = { uri: value(form, 'upstream-uri') };
  for (const [id, key, number] of [['upstream-exchange', 'exchange', false], ['upstream-queue', 'queue', false],
    ['upstream-max-hops', 'max-hops', true], ['upstream-prefetch', 'prefetch-count', true], ['upstream-expires', 'expires', true]]) {
    const given = value(form, id);
    if (given) body[key] = number ? Number(given) : given;
  }
  body['ack-mode'] = value(form, 'upstream-ack-mode');
  return body;
}

export async function federationPage(ctx) {
  ctx.setTitle('Federation');
  const upstreams = h('div');
  const links = h('div');
  const refresh = async () => {
    const [upstreamList, linkList] = await Promise.all([
      // Upstreams are parameters: policymakers and administrators only, as in RabbitMQ.
      api(listPath('parameters/federation-upstream', ctx.vhost)).catch((exc) => {
        if (exc.status === 403) return [];
        throw exc;
      }),
      api(listPath('federation-links', ctx.vhost)),
    ]);
    clear(upstreams, table('upstreams-table', [
      { title: 'Virtual host', value: (u) => u.vhost },
      { title: 'Name', class: 'name', value: (u) => u.name },
      { title: 'URI', value: (u) => h('code', {}, [].concat(u.value.uri).join(', ').replace(/:\/\/([^:@/]*):[^@/]*@/g, '://$1:********@')) },
      { title: 'Settings', value: (u) => kvList(Object.fromEntries(Object.entries(u.value).filter(([k]) => k !== 'uri'))) },
      {
        title: '',
        class: 'actions-cell',
        value: (u) => dangerButton('Delete', async () => {
          await api(`/api/parameters/federation-upstream/${enc(u.vhost)}/${enc(u.name)}`, { method: 'DELETE' });
          toast(`Upstream ${u.name} deleted.`, 'ok');
          await refresh();
        }, { id: `upstream-delete:${u.vhost}/${u.name}` }),
      },
    ], Array.isArray(upstreamList) ? upstreamList : [], { key: (u) => `${u.vhost}/${u.name}`, empty: 'No upstreams.' }));
    clear(links, table('federation-links-table', [
      { title: 'Virtual host', value: (l) => l.vhost },
      { title: 'Federated', class: 'name', value: (l) => `${l.type || ''} ${l.exchange || l.queue || l.name}`.trim() },
      { title: 'Upstream', value: (l) => l.upstream || '–' },
      { title: 'URI', value: (l) => h('code', {}, l.uri || '–') },
      { title: 'Status', field: 'status', value: (l) => stateBadge(l.status) },
      { title: 'Transferred', num: true, value: (l) => fmtNum(l.transferred) },
      { title: 'Error', value: (l) => l.error || '–' },
    ], Array.isArray(linkList) ? linkList : [], { key: (l) => `${l.vhost}/${l.name}`, empty: 'No federation links: a policy with federation-upstream or federation-upstream-set starts them.' }));
  };
  ctx.main.append(
    formCard('Add or update an upstream', 'upstream-form', [
      field('Virtual host', select('upstream-vhost', ctx.vhosts.map((v) => [v, v]), ctx.vhost || ctx.vhosts[0])),
      field('Name', h('input', { id: 'upstream-name', required: true, autocomplete: 'off' })),
      field('URI', h('input', { id: 'upstream-uri', required: true, placeholder: 'amqp://user:pass@host:5672/vhost' })),
      field('Exchange', h('input', { id: 'upstream-exchange' }), 'Empty: the federated exchange\'s own name.'),
      field('Queue', h('input', { id: 'upstream-queue' }), 'Empty: the federated queue\'s own name.'),
      field('Max hops', h('input', { id: 'upstream-max-hops', type: 'number', min: '1', placeholder: '1' })),
      field('Prefetch', h('input', { id: 'upstream-prefetch', type: 'number', min: '0', placeholder: '1000' })),
      field('Expires (ms)', h('input', { id: 'upstream-expires', type: 'number', min: '0' })),
      field('Ack mode', select('upstream-ack-mode', [['on-confirm', 'on-confirm'], ['on-publish', 'on-publish'], ['no-ack', 'no-ack']], 'on-confirm')),
    ], 'Save upstream', async (form) => {
      const name = value(form, 'upstream-name');
      await api(`/api/parameters/federation-upstream/${enc(value(form, 'upstream-vhost'))}/${enc(name)}`, {
        method: 'PUT', body: { value: upstreamValue(form) },
      });
      toast(`Upstream ${name} saved.`, 'ok');
      await refresh();
    }),
    card('Upstreams', upstreams),
    card('Federation links', links),
  );
  return { refresh };
}
