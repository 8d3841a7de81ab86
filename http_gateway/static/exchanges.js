// Exchanges: the list with rates, a form to declare one, and a page per exchange with its
// bindings and a publish form.

import { api, enc, exchangePath, listPath } from './api.js';
import { bindingsCard } from './bindings.js';
import {
  badge, card, checkbox, clear, dangerButton, details, field, fmtRate, get, h, link, parseArgs, run,
  select, table, toast,
} from './dom.js';
import { publishForm } from './messages.js';

const TYPES = ['direct', 'fanout', 'topic', 'headers', 'x-consistent-hash', 'x-delayed-message'];

const displayName = (x) => (x.name === '' ? '(AMQP default)' : x.name);

function features(x) {
  const out = [];
  if (x.durable) out.push(badge('D', 'feature'));
  if (x.auto_delete) out.push(badge('AD', 'feature'));
  if (x.internal) out.push(badge('I', 'feature'));
  if (x.arguments && Object.keys(x.arguments).length) out.push(badge('Args', 'feature'));
  return out.length ? h('span', { class: 'badges', title: JSON.stringify(x.arguments || {}) }, out) : '–';
}

function createForm(ctx, onCreated) {
  const vhost = select('exchange-vhost', ctx.vhosts.map((v) => [v, v]), ctx.vhost || ctx.vhosts[0]);
  const form = h('form', { class: 'form', id: 'exchange-form' },
    h('div', { class: 'row' },
      field('Virtual host', vhost),
      field('Name', h('input', { id: 'exchange-name', required: true, autocomplete: 'off' })),
      field('Type', select('exchange-type', TYPES.map((t) => [t, t]), 'direct')),
      field('Options', h('div', { class: 'checks' }, checkbox('exchange-durable', 'Durable', true),
        checkbox('exchange-auto-delete', 'Auto delete', false), checkbox('exchange-internal', 'Internal', false)))),
    field('Arguments', h('textarea', { id: 'exchange-arguments', rows: 1, placeholder: 'alternate-exchange=unrouted' })),
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary', id: 'exchange-add' }, 'Add exchange')));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    run(form.querySelector('#exchange-add'), async () => {
      const name = form.querySelector('#exchange-name').value.trim();
      await api(exchangePath(vhost.value, name), {
        method: 'PUT',
        body: {
          type: form.querySelector('#exchange-type').value,
          durable: form.querySelector('#exchange-durable').checked,
          auto_delete: form.querySelector('#exchange-auto-delete').checked,
          internal: form.querySelector('#exchange-internal').checked,
          arguments: parseArgs(form.querySelector('#exchange-arguments').value),
        },
      });
      toast(`Exchange ${name} declared.`, 'ok');
      form.querySelector('#exchange-name').value = '';
      await onCreated();
    });
  });
  return h('details', { class: 'card collapsible' }, h('summary', {}, 'Add an exchange'), form);
}

export async function listPage(ctx) {
  ctx.setTitle('Exchanges');
  const list = h('div');
  const refresh = async () => {
    const exchanges = await api(listPath('exchanges', ctx.vhost));
    clear(list, table('exchanges-table', [
      ctx.vhost || ctx.vhosts.length < 2 ? null : { title: 'Virtual host', value: (x) => x.vhost },
      { title: 'Name', class: 'name', value: (x) => link(`#/exchange/${enc(x.vhost)}/${enc(x.name === '' ? 'amq.default' : x.name)}`, displayName(x)) },
      { title: 'Type', value: (x) => x.type || '–' },
      { title: 'Features', value: features },
      { title: 'Policy', value: (x) => x.policy || '–' },
      { title: 'Rate in', num: true, value: (x) => fmtRate(get(x, 'message_stats.publish_in_details.rate')) },
      { title: 'Rate out', num: true, value: (x) => fmtRate(get(x, 'message_stats.publish_out_details.rate')) },
    ].filter(Boolean), Array.isArray(exchanges) ? exchanges : [], { key: (x) => `${x.vhost}/${x.name}` }));
  };
  ctx.main.append(createForm(ctx, refresh), card('All exchanges', list));
  return { refresh };
}

export async function detailPage(ctx) {
  const [vhost, pathName] = ctx.params;
  const name = pathName === 'amq.default' ? '' : pathName;
  ctx.setTitle(`Exchange ${name || '(AMQP default)'}`);
  const info = h('div');
  const bindings = bindingsCard(vhost, 'exchange', name);
  const removable = name !== '' && !name.startsWith('amq.');
  ctx.main.append(
    h('p', { class: 'crumbs' }, link('#/exchanges', 'Exchanges'), ' › ', h('strong', {}, name || '(AMQP default)'),
      h('span', { class: 'muted' }, ` in virtual host ${vhost}`)),
    card('Details', info, removable ? h('div', { class: 'actions' }, dangerButton('Delete exchange', async () => {
      await api(exchangePath(vhost, name), { method: 'DELETE' });
      toast(`Exchange ${name} deleted.`, 'ok');
      location.hash = '#/exchanges';
    }, { id: 'exchange-delete' })) : null),
    bindings.el,
    publishForm(vhost, name, ''),
  );
  const refresh = async () => {
    const x = await api(exchangePath(vhost, name));
    clear(info, details([
      ['Type', x.type],
      ['Durable', x.durable],
      ['Auto delete', x.auto_delete],
      ['Internal', x.internal],
      ['Arguments', x.arguments && Object.keys(x.arguments).length ? x.arguments : undefined],
      ['Policy', x.policy],
      ['Rate in', fmtRate(get(x, 'message_stats.publish_in_details.rate'))],
      ['Rate out', fmtRate(get(x, 'message_stats.publish_out_details.rate'))],
    ]));
    if (name !== '') await bindings.refresh();
  };
  return { refresh };
}
