// Definitions export (download JSON) and import (upload a RabbitMQ definitions file).

import { api, enc } from './api.js';
import { card, field, h, run, select, toast } from './dom.js';

function download(name, text) {
  const url = URL.createObjectURL(new Blob([text], { type: 'application/json' }));
  const anchor = h('a', { href: url, download: name });
  document.body.append(anchor);
  anchor.click();
  anchor.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

const scopeOptions = (vhosts) => [['', 'All virtual hosts'], ...vhosts.map((v) => [v, v])];
const scopedPath = (vhost) => (vhost ? `/api/definitions/${enc(vhost)}` : '/api/definitions');

export async function page(ctx) {
  ctx.setTitle('Definitions');
  const exportScope = select('export-vhost', scopeOptions(ctx.vhosts), ctx.vhost);
  const exportButton = h('button', { type: 'button', class: 'primary', id: 'definitions-export' }, 'Download broker definitions');
  exportButton.addEventListener('click', () => run(exportButton, async () => {
    const definitions = await api(scopedPath(exportScope.value));
    const stamp = new Date().toISOString().slice(0, 10);
    download(`streamq_definitions_${stamp}.json`, `${JSON.stringify(definitions, null, 2)}\n`);
  }));
  const importScope = select('import-vhost', scopeOptions(ctx.vhosts), ctx.vhost);
  const file = h('input', { id: 'definitions-file', type: 'file', accept: '.json,application/json' });
  const importButton = h('button', { type: 'button', class: 'primary', id: 'definitions-import' }, 'Upload broker definitions');
  const status = h('p', { class: 'muted', id: 'definitions-status', role: 'status' });
  importButton.addEventListener('click', () => run(importButton, async () => {
    const chosen = file.files && file.files[0];
    if (!chosen) throw new Error('choose a definitions file first');
    const text = await chosen.text();
    JSON.parse(text); // a clear message for a file that is not JSON, before uploading it
    await api(scopedPath(importScope.value), { method: 'POST', body: text });
    status.textContent = `Imported ${chosen.name}.`;
    toast(status.textContent, 'ok');
    await ctx.reloadVhosts();
  }));
  ctx.main.append(h('div', { class: 'grid-2' },
    card('Export definitions',
      h('p', { class: 'muted' }, 'Virtual hosts, users, permissions, policies, exchanges, queues and bindings in RabbitMQ\u2019s JSON format. Messages are not included.'),
      h('div', { class: 'form' }, field('Scope', exportScope), h('div', { class: 'actions' }, exportButton))),
    card('Import definitions',
      h('p', { class: 'muted' }, 'Merges a definitions file (from streamq or RabbitMQ) into the broker; existing objects not in the file are kept.'),
      h('div', { class: 'form' }, field('Scope', importScope), field('Definitions file', file),
        h('div', { class: 'actions' }, importButton), status))));
  return { refresh: null };
}
