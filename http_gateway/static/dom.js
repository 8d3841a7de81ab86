// DOM helpers and formatting shared by the pages. No innerHTML anywhere: text from the
// broker (queue names, payloads) is always set as text.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

export function setAttrs(el, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else if (key === 'class') el.className = value;
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key === 'value') el.value = value;
    else el.setAttribute(key, value === true ? '' : String(value));
  }
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

// A dotted path into an object, or `fallback` when any step is missing.
export function get(obj, path, fallback = undefined) {
  let value = obj;
  for (const key of path.split('.')) {
    if (value === null || value === undefined || typeof value !== 'object') return fallback;
    value = value[key];
  }
  return value === undefined || value === null ? fallback : value;
}

const DASH = '–';

export function fmtNum(value) {
  if (typeof value !== 'number' || !Number.isFinite(value)) return DASH;
  return value.toLocaleString('en-US');
}

export function fmtRate(value) {
  if (typeof value !== 'number' || !Number.isFinite(value)) return DASH;
  const digits = Math.abs(value) >= 100 ? 0 : Math.abs(value) >= 10 ? 1 : 2;
  return `${value.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: 0 })}/s`;
}

export function fmtBytes(value) {
  if (typeof value !== 'number' || !Number.isFinite(value)) return DASH;
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let n = value;
  let unit = 0;
  while (Math.abs(n) >= 1024 && unit < units.length - 1) {
    n /= 1024;
    unit += 1;
  }
  return `${n.toLocaleString('en-US', { maximumFractionDigits: unit ? 1 : 0 })} ${units[unit]}`;
}

export function fmtByteRate(value) {
  return typeof value === 'number' && Number.isFinite(value) ? `${fmtBytes(value)}/s` : DASH;
}

export function fmtBool(value) {
  if (value === true) return 'yes';
  if (value === false) return 'no';
  return DASH;
}

// A moment: the time of day when it is today, else date and time.
export function fmtTime(ms) {
  if (typeof ms !== 'number') return DASH;
  const when = new Date(ms);
  const time = when.toLocaleTimeString('en-GB', { hour12: false });
  if (when.toDateString() === new Date().toDateString()) return time;
  return `${when.toLocaleDateString('en-CA')} ${time}`;
}

export function fmtValue(value) {
  if (value === undefined || value === null || value === '') return DASH;
  if (typeof value === 'boolean') return fmtBool(value);
  if (typeof value === 'number') return fmtNum(value);
  if (typeof value === 'object') return JSON.stringify(value);
  return String(value);
}

// Tags come as a list (RabbitMQ 3.13+) or a comma-separated string (older versions).
export function tagList(tags) {
  if (Array.isArray(tags)) return tags.map(String);
  if (typeof tags === 'string') return tags.split(',').map((t) => t.trim()).filter(Boolean);
  return [];
}

export function badge(text, kind = '') {
  return h('span', { class: `badge ${kind}`.trim() }, text);
}

// A table: columns are {title, value(row) -> Node|text, class?, num?}.
export function table(id, columns, rows, { empty = 'Nothing here yet.', key } = {}) {
  const head = h('tr', {}, columns.map((c) => h('th', { class: c.num ? 'num' : c.class }, c.title)));
  const body = h('tbody');
  for (const row of rows) {
    const tr = h('tr', key ? { dataset: { key: key(row) } } : {});
    for (const c of columns) {
      const cell = h('td', { class: c.num ? 'num' : c.class, dataset: c.field ? { field: c.field } : undefined });
      append(cell, [c.value(row)]);
      tr.append(cell);
    }
    body.append(tr);
  }
  if (rows.length === 0) {
    body.append(h('tr', { class: 'empty' }, h('td', { colspan: columns.length }, empty)));
  }
  return h('div', { class: 'table-wrap' }, h('table', { id, class: 'grid' }, h('thead', {}, head), body));
}

// An object's keys and values as a compact list (arguments, policy definitions).
export function kvList(obj) {
  const entries = Object.entries(obj || {});
  if (!entries.length) return '–';
  return h('ul', { class: 'kv' }, entries.map(([k, v]) => h('li', {}, h('span', { class: 'kv-key' }, k), ' ',
    h('code', {}, typeof v === 'object' && v !== null ? JSON.stringify(v) : String(v)))));
}

// A key/value table for one object's details; object values are shown as key/value lists.
export function details(pairs) {
  return h('table', { class: 'details' },
    h('tbody', {}, pairs.map(([k, v]) => h('tr', {}, h('th', {}, k), h('td', {}, detailValue(v))))));
}

function detailValue(v) {
  if (v instanceof Node) return v;
  if (v !== null && typeof v === 'object' && !Array.isArray(v)) return kvList(v);
  return fmtValue(v);
}

export function card(title, ...children) {
  return h('section', { class: 'card' }, title ? h('h2', {}, title) : null, children);
}

export function toast(message, kind = 'info') {
  const box = document.getElementById('toasts');
  const note = h('div', { class: `toast ${kind}`, role: kind === 'error' ? 'alert' : 'status' }, message);
  box.append(note);
  setTimeout(() => note.remove(), kind === 'error' ? 8000 : 4000);
}

// A button that needs a second click within a few seconds (no blocking confirm() dialogs).
export function dangerButton(label, action, { confirmLabel = 'Click again to confirm', id } = {}) {
  let armed = null;
  const button = h('button', { type: 'button', class: 'danger', id }, label);
  button.addEventListener('click', async () => {
    if (armed === null) {
      button.textContent = confirmLabel;
      button.classList.add('armed');
      armed = setTimeout(() => {
        armed = null;
        button.textContent = label;
        button.classList.remove('armed');
      }, 4000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    button.disabled = true;
    try {
      await action();
    } finally {
      button.disabled = false;
      button.textContent = label;
      button.classList.remove('armed');
    }
  });
  return button;
}

// Form fields.
export function field(label, input, hint) {
  return h('label', { class: 'field' }, h('span', { class: 'field-label' }, label), input,
    hint ? h('span', { class: 'hint' }, hint) : null);
}

export function select(id, options, selected) {
  return h('select', { id, name: id },
    options.map(([value, text]) => h('option', { value, selected: value === selected }, text)));
}

export function checkbox(id, label, checked) {
  return h('label', { class: 'check' }, h('input', { id, type: 'checkbox', checked }), label);
}

// "key=value" lines into an object; numbers and booleans are typed as RabbitMQ's UI does.
export function parseArgs(text) {
  const out = {};
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line) continue;
    const at = line.indexOf('=');
    if (at <= 0) throw new Error(`"${line}" is not key=value`);
    const key = line.slice(0, at).trim();
    const value = line.slice(at + 1).trim();
    if (/^-?\d+(\.\d+)?$/.test(value)) out[key] = Number(value);
    else if (value === 'true' || value === 'false') out[key] = value === 'true';
    else out[key] = value;
  }
  return out;
}

// Run a form action: disable the submit button, report errors as a toast.
export async function run(button, action) {
  if (button) button.disabled = true;
  try {
    return await action();
  } catch (exc) {
    if (exc && exc.status !== 401) toast(exc.message || String(exc), 'error');
    return undefined;
  } finally {
    if (button) button.disabled = false;
  }
}

export function link(href, text) {
  return h('a', { href }, text);
}
