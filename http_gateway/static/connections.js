// Connections (with close) and channels.

import { api, enc, listPath } from './api.js';
import { badge, card, clear, dangerButton, fmtByteRate, fmtNum, fmtRate, fmtTime, fmtValue, get, h, table, toast } from './dom.js';

function closeButton(name, after, label = 'Close') {
  return dangerButton(label, async () => {
    await api(`/api/connections/${enc(name)}`, { method: 'DELETE', headers: { 'X-Reason': 'Closed via management UI' } });
    toast(`Connection ${name} closed.`, 'ok');
    await after();
  }, { confirmLabel: 'Confirm close' });
}

function client(c) {
  const props = c.client_properties || {};
  return [props.connection_name, props.product, props.version].filter(Boolean).join(' · ') || '–';
}

export async function connectionsPage(ctx) {
  ctx.setTitle('Connections');
  const list = h('div');
  const refresh = async () => {
    const connections = await api(ctx.vhost ? `/api/vhosts/${enc(ctx.vhost)}/connections` : '/api/connections');
    clear(list, table('connections-table', [
      { title: 'Name', class: 'name', value: (c) => c.name },
      ctx.vhost || ctx.vhosts.length < 2 ? null : { title: 'Virtual host', value: (c) => c.vhost || '–' },
      { title: 'User', value: (c) => c.user || '–' },
      { title: 'Client', value: client },
      { title: 'Protocol', value: (c) => c.protocol || '–' },
      { title: 'State', value: (c) => badge(c.state || 'running', (c.state || 'running') === 'running' ? 'ok' : 'warn') },
      { title: 'Channels', num: true, value: (c) => fmtNum(c.channels) },
      { title: 'From client', num: true, value: (c) => fmtByteRate(get(c, 'recv_oct_details.rate')) },
      { title: 'To client', num: true, value: (c) => fmtByteRate(get(c, 'send_oct_details.rate')) },
      { title: 'Connected', value: (c) => fmtTime(c.connected_at) },
      { title: '', class: 'actions-cell', value: (c) => closeButton(c.name, refresh) },
    ].filter(Boolean), Array.isArray(connections) ? connections : [], { empty: 'No open connections.', key: (c) => c.name }));
  };
  ctx.main.append(card('Open connections', list));
  return { refresh };
}

export async function channelsPage(ctx) {
  ctx.setTitle('Channels');
  const list = h('div');
  const refresh = async () => {
    const channels = await api(ctx.vhost ? `/api/vhosts/${enc(ctx.vhost)}/channels` : listPath('channels'));
    clear(list, table('channels-table', [
      { title: 'Channel', class: 'name', value: (c) => c.name || `${get(c, 'connection_details.name', '?')} (${c.number})` },
      ctx.vhost || ctx.vhosts.length < 2 ? null : { title: 'Virtual host', value: (c) => c.vhost || '–' },
      { title: 'User', value: (c) => c.user || '–' },
      { title: 'Mode', value: (c) => [c.confirm ? 'C' : '', c.transactional ? 'T' : ''].join('') || '–' },
      { title: 'State', value: (c) => badge(c.state || 'running', (c.state || 'running') === 'running' ? 'ok' : 'warn') },
      { title: 'Consumers', num: true, value: (c) => fmtNum(c.consumer_count) },
      { title: 'Prefetch', num: true, value: (c) => fmtValue(c.prefetch_count) },
      { title: 'Unacked', num: true, value: (c) => fmtNum(c.messages_unacknowledged) },
      { title: 'Publish', num: true, value: (c) => fmtRate(get(c, 'message_stats.publish_details.rate')) },
      { title: 'Deliver / get', num: true, value: (c) => fmtRate(get(c, 'message_stats.deliver_get_details.rate')) },
      { title: 'Ack', num: true, value: (c) => fmtRate(get(c, 'message_stats.ack_details.rate')) },
      {
        title: '',
        class: 'actions-cell',
        value: (c) => {
          const connection = get(c, 'connection_details.name');
          return connection ? closeButton(connection, refresh, 'Close connection') : '';
        },
      },
    ].filter(Boolean), Array.isArray(channels) ? channels : [], { empty: 'No open channels.', key: (c) => c.name }));
  };
  ctx.main.append(card('Open channels', list, h('p', { class: 'hint' },
    'Mode: C = publisher confirms, T = transactional. RabbitMQ closes channels only with their connection.')));
  return { refresh };
}
