// Bindings of one queue (as destination) or one exchange (as source), with add and remove.

import { api, enc } from './api.js';
import { card, clear, dangerButton, field, fmtValue, h, kvList, link, parseArgs, run, select, table, toast } from './dom.js';

function bindingPath(b) {
  const kind = b.destination_type === 'exchange' ? 'e' : 'q';
  const props = b.properties_key === undefined ? enc(b.routing_key || '~') : enc(b.properties_key);
  return `/api/bindings/${enc(b.vhost)}/e/${enc(b.source)}/${kind}/${enc(b.destination)}/${props}`;
}

function endpoint(vhost, kind, name) {
  if (name === '') return '(AMQP default)';
  return link(`#/${kind}/${enc(vhost)}/${enc(name)}`, name);
}

// side: 'queue' (bindings to this queue) or 'exchange' (bindings from this exchange).
export function bindingsCard(vhost, side, name) {
  const list = h('div');
  const listPath = side === 'queue'
    ? `/api/queues/${enc(vhost)}/${enc(name)}/bindings`
    : `/api/exchanges/${enc(vhost)}/${enc(name)}/bindings/source`;
  const refresh = async () => {
    const bindings = await api(listPath);
    clear(list, table('bindings-table', [
      { title: 'From', value: (b) => endpoint(vhost, 'exchange', b.source) },
      { title: 'To', value: (b) => endpoint(vhost, b.destination_type === 'exchange' ? 'exchange' : 'queue', b.destination) },
      { title: 'Routing key', value: (b) => fmtValue(b.routing_key) },
      { title: 'Arguments', value: (b) => kvList(b.arguments) },
      {
        title: '',
        class: 'actions-cell',
        value: (b) => (b.source === '' ? '' : dangerButton('Unbind', async () => {
          await api(bindingPath(b), { method: 'DELETE' });
          toast('Binding removed.', 'ok');
          await refresh();
        })),
      },
    ], Array.isArray(bindings) ? bindings : [], { empty: 'No bindings.' }));
  };
  const other = h('input', { id: 'binding-other', required: true });
  const kind = side === 'exchange' ? select('binding-destination-type', [['q', 'Queue'], ['e', 'Exchange']], 'q') : null;
  const form = h('form', { class: 'form', id: 'binding-form' },
    h('div', { class: 'row' },
      kind ? field('Destination type', kind) : null,
      field(side === 'queue' ? 'From exchange' : 'To', other),
      field('Routing key', h('input', { id: 'binding-routing-key' })),
      field('Arguments', h('textarea', { id: 'binding-arguments', rows: 1, placeholder: 'key=value' }))),
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary' }, 'Bind')));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    run(form.querySelector('button[type=submit]'), async () => {
      const [source, destType, dest] = side === 'queue'
        ? [other.value, 'q', name] : [name, kind.value, other.value];
      await api(`/api/bindings/${enc(vhost)}/e/${enc(source)}/${destType}/${enc(dest)}`, {
        method: 'POST',
        body: {
          routing_key: form.querySelector('#binding-routing-key').value,
          arguments: parseArgs(form.querySelector('#binding-arguments').value),
        },
      });
      toast('Binding added.', 'ok');
      other.value = '';
      await refresh();
    });
  });
  return { el: card('Bindings', list, h('h3', {}, 'Add binding'), form), refresh };
}
