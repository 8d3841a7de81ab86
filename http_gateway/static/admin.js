// Users, permissions and topic permissions, virtual hosts and policies.

import { api, enc, listPath } from './api.js';
import {
  badge, card, clear, dangerButton, field, fmtNum, fmtRate, fmtValue, get, h, kvList, run, select, table,
  tagList, toast,
} from './dom.js';

export function formCard(title, id, fields, submitLabel, onSubmit) {
  const form = h('form', { class: 'form', id }, h('div', { class: 'row' }, fields),
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary', id: `${id}-submit` }, submitLabel)));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    run(form.querySelector('button[type=submit]'), () => onSubmit(form));
  });
  return h('details', { class: 'card collapsible' }, h('summary', {}, title), form);
}

const value = (form, id) => form.querySelector(`#${id}`).value;

export async function usersPage(ctx) {
  ctx.setTitle('Users');
  const users = h('div');
  const permissions = h('div');
  const topicPermissions = h('div');
  const refresh = async () => {
    const [userList, permissionList, topicList] = await Promise.all([
      api('/api/users'), api('/api/permissions'), api('/api/topic-permissions')]);
    clear(users, table('users-table', [
      { title: 'Name', class: 'name', value: (u) => u.name },
      { title: 'Tags', value: (u) => (tagList(u.tags).length ? h('span', { class: 'badges' }, tagList(u.tags).map((t) => badge(t))) : '–') },
      { title: 'Password', value: (u) => (u.password_hash ? String(u.hashing_algorithm || 'set').replace('rabbit_password_hashing_', '') : 'none (no password login)') },
      { title: 'Can access', value: (u) => permissionList.filter((p) => p.user === u.name).map((p) => p.vhost).join(', ') || '–' },
      {
        title: '',
        class: 'actions-cell',
        value: (u) => dangerButton('Delete', async () => {
          await api(`/api/users/${enc(u.name)}`, { method: 'DELETE' });
          toast(`User ${u.name} deleted.`, 'ok');
          await refresh();
        }),
      },
    ], userList, { key: (u) => u.name }));
    clear(permissions, table('permissions-table', [
      { title: 'User', value: (p) => p.user },
      { title: 'Virtual host', value: (p) => p.vhost },
      { title: 'Configure', value: (p) => h('code', {}, fmtValue(p.configure)) },
      { title: 'Write', value: (p) => h('code', {}, fmtValue(p.write)) },
      { title: 'Read', value: (p) => h('code', {}, fmtValue(p.read)) },
      {
        title: '',
        class: 'actions-cell',
        value: (p) => dangerButton('Clear', async () => {
          await api(`/api/permissions/${enc(p.vhost)}/${enc(p.user)}`, { method: 'DELETE' });
          toast('Permissions cleared.', 'ok');
          await refresh();
        }),
      },
    ], permissionList, { empty: 'No permissions.' }));
    clear(topicPermissions, table('topic-permissions-table', [
      { title: 'User', value: (t) => t.user },
      { title: 'Virtual host', value: (t) => t.vhost },
      { title: 'Exchange', value: (t) => t.exchange },
      { title: 'Write', value: (t) => h('code', {}, fmtValue(t.write)) },
      { title: 'Read', value: (t) => h('code', {}, fmtValue(t.read)) },
      {
        title: '',
        class: 'actions-cell',
        value: (t) => dangerButton('Clear', async () => {
          await clearTopicPermission(t, topicList);
          toast(`Topic permissions of ${t.user} on ${t.exchange} cleared.`, 'ok');
          await refresh();
        }),
      },
    ], topicList, { key: (t) => `${t.vhost}/${t.user}/${t.exchange}`, empty: 'No topic permissions.' }));
  };
  ctx.main.append(
    formCard('Add or update a user', 'user-form', [
      field('Username', h('input', { id: 'user-name', required: true, autocomplete: 'off' })),
      field('Password', h('input', { id: 'user-password', type: 'password', autocomplete: 'new-password' }), 'Empty: keep the current one (a new user gets none, so no password login).'),
      field('Tags', h('input', { id: 'user-tags', placeholder: 'administrator, monitoring' })),
    ], 'Save user', async (form) => {
      const name = value(form, 'user-name').trim();
      const password = value(form, 'user-password');
      const body = { tags: value(form, 'user-tags').split(',').map((t) => t.trim()).filter(Boolean) };
      if (password) {
        body.password = password;
      } else {
        // An update with no password keeps the user's current one; a new user gets none.
        const existing = await api(`/api/users/${enc(name)}`).catch((exc) => {
          if (exc.status === 404) return null;
          throw exc;
        });
        body.password_hash = existing && existing.password_hash ? existing.password_hash : '';
        if (existing && existing.hashing_algorithm) body.hashing_algorithm = existing.hashing_algorithm;
      }
      await api(`/api/users/${enc(name)}`, { method: 'PUT', body });
      toast(`User ${name} saved.`, 'ok');
      await refresh();
    }),
    card('Users', users),
    formCard('Set permissions', 'permission-form', [
      field('User', h('input', { id: 'permission-user', required: true })),
      field('Virtual host', select('permission-vhost', ctx.vhosts.map((v) => [v, v]), ctx.vhost || ctx.vhosts[0])),
      field('Configure', h('input', { id: 'permission-configure', value: '.*' })),
      field('Write', h('input', { id: 'permission-write', value: '.*' })),
      field('Read', h('input', { id: 'permission-read', value: '.*' })),
    ], 'Set permissions', async (form) => {
      const user = value(form, 'permission-user').trim();
      await api(`/api/permissions/${enc(value(form, 'permission-vhost'))}/${enc(user)}`, {
        method: 'PUT',
        body: { configure: value(form, 'permission-configure'), write: value(form, 'permission-write'), read: value(form, 'permission-read') },
      });
      toast(`Permissions of ${user} set.`, 'ok');
      await refresh();
    }),
    card('Permissions', permissions),
    formCard('Set topic permissions', 'topic-permission-form', [
      field('User', h('input', { id: 'topic-permission-user', required: true })),
      field('Virtual host', select('topic-permission-vhost', ctx.vhosts.map((v) => [v, v]), ctx.vhost || ctx.vhosts[0])),
      field('Exchange', h('input', { id: 'topic-permission-exchange', value: 'amq.topic', required: true })),
      field('Write', h('input', { id: 'topic-permission-write', value: '.*' }), 'Routing keys it may publish with; {username} and {vhost} expand.'),
      field('Read', h('input', { id: 'topic-permission-read', value: '.*' }), 'Binding keys it may bind with.'),
    ], 'Set topic permissions', async (form) => {
      const user = value(form, 'topic-permission-user').trim();
      await api(`/api/topic-permissions/${enc(value(form, 'topic-permission-vhost'))}/${enc(user)}`, {
        method: 'PUT',
        body: {
          exchange: value(form, 'topic-permission-exchange'),
          write: value(form, 'topic-permission-write'),
          read: value(form, 'topic-permission-read'),
        },
      });
      toast(`Topic permissions of ${user} set.`, 'ok');
      await refresh();
    }),
    card('Topic permissions', topicPermissions),
  );
  return { refresh };
}

// The API's DELETE clears all of a user's topic permissions in a vhost (RabbitMQ 3.10):
// to clear one exchange's, the others are put back after it.
async function clearTopicPermission(topic, topicList) {
  const path = `/api/topic-permissions/${enc(topic.vhost)}/${enc(topic.user)}`;
  const others = topicList.filter((t) => t.vhost === topic.vhost && t.user === topic.user && t.exchange !== topic.exchange);
  await api(path, { method: 'DELETE' });
  for (const t of others) {
    await api(path, { method: 'PUT', body: { exchange: t.exchange, write: t.write, read: t.read } });
  }
}

export async function vhostsPage(ctx) {
  ctx.setTitle('Virtual hosts');
  const list = h('div');
  const refresh = async () => {
    const vhosts = await api('/api/vhosts');
    const described = Array.isArray(vhosts) && vhosts.some((v) => v.description);
    clear(list, table('vhosts-table', [
      { title: 'Name', class: 'name', value: (v) => v.name },
      described ? { title: 'Description', value: (v) => v.description || '–' } : null,
      { title: 'Ready', num: true, value: (v) => fmtNum(v.messages_ready) },
      { title: 'Unacked', num: true, value: (v) => fmtNum(v.messages_unacknowledged) },
      { title: 'Total', num: true, value: (v) => fmtNum(v.messages) },
      { title: 'Publish', num: true, value: (v) => fmtRate(get(v, 'message_stats.publish_details.rate')) },
      { title: 'Deliver / get', num: true, value: (v) => fmtRate(get(v, 'message_stats.deliver_get_details.rate')) },
      {
        title: '',
        class: 'actions-cell',
        value: (v) => dangerButton('Delete', async () => {
          await api(`/api/vhosts/${enc(v.name)}`, { method: 'DELETE' });
          toast(`Virtual host ${v.name} deleted.`, 'ok');
          await ctx.reloadVhosts();
          await refresh();
        }),
      },
    ].filter(Boolean), Array.isArray(vhosts) ? vhosts : [], { key: (v) => v.name }));
  };
  ctx.main.append(
    formCard('Add a virtual host', 'vhost-form', [
      field('Name', h('input', { id: 'vhost-name', required: true, autocomplete: 'off' })),
    ], 'Add virtual host', async (form) => {
      const name = value(form, 'vhost-name').trim();
      await api(`/api/vhosts/${enc(name)}`, { method: 'PUT', body: {} });
      toast(`Virtual host ${name} added.`, 'ok');
      await ctx.reloadVhosts();
      await refresh();
    }),
    card('Virtual hosts', list),
  );
  return { refresh };
}

function parseDefinition(text) {
  const trimmed = text.trim();
  if (!trimmed) return {};
  const parsed = JSON.parse(trimmed);
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) throw new Error('the definition must be a JSON object');
  return parsed;
}

export async function policiesPage(ctx) {
  ctx.setTitle('Policies');
  const list = h('div');
  const refresh = async () => {
    const policies = await api(listPath('policies', ctx.vhost));
    clear(list, table('policies-table', [
      { title: 'Virtual host', value: (p) => p.vhost },
      { title: 'Name', class: 'name', value: (p) => p.name },
      { title: 'Pattern', value: (p) => h('code', {}, fmtValue(p.pattern)) },
      { title: 'Apply to', value: (p) => p['apply-to'] || '–' },
      { title: 'Definition', value: (p) => kvList(p.definition) },
      { title: 'Priority', num: true, value: (p) => fmtNum(p.priority) },
      {
        title: '',
        class: 'actions-cell',
        value: (p) => dangerButton('Delete', async () => {
          await api(`/api/policies/${enc(p.vhost)}/${enc(p.name)}`, { method: 'DELETE' });
          toast(`Policy ${p.name} deleted.`, 'ok');
          await refresh();
        }),
      },
    ], Array.isArray(policies) ? policies : [], { key: (p) => `${p.vhost}/${p.name}` }));
  };
  ctx.main.append(
    formCard('Add or update a policy', 'policy-form', [
      field('Virtual host', select('policy-vhost', ctx.vhosts.map((v) => [v, v]), ctx.vhost || ctx.vhosts[0])),
      field('Name', h('input', { id: 'policy-name', required: true })),
      field('Pattern', h('input', { id: 'policy-pattern', required: true, placeholder: '^orders\\.' })),
      field('Apply to', select('policy-apply-to', [['all', 'Exchanges and queues'], ['queues', 'Queues'], ['exchanges', 'Exchanges'], ['streams', 'Streams'], ['classic_queues', 'Classic queues']], 'all')),
      field('Priority', h('input', { id: 'policy-priority', type: 'number', value: '0' })),
      field('Definition (JSON)', h('textarea', { id: 'policy-definition', rows: 3, placeholder: '{"max-length": 1000}' })),
    ], 'Save policy', async (form) => {
      const name = value(form, 'policy-name').trim();
      await api(`/api/policies/${enc(value(form, 'policy-vhost'))}/${enc(name)}`, {
        method: 'PUT',
        body: {
          pattern: value(form, 'policy-pattern'),
          'apply-to': value(form, 'policy-apply-to'),
          priority: Number(value(form, 'policy-priority')) || 0,
          definition: parseDefinition(value(form, 'policy-definition')),
        },
      });
      toast(`Policy ${name} saved.`, 'ok');
      await refresh();
    }),
    card('Policies', list),
  );
  return { refresh };
}
