// The UI's entry point: login, navigation (hash routes), the vhost filter and the
// refresh timer. Each page module exports functions that build a page into `ctx.main`
// and return `{refresh}`, called on every tick while the page is shown.

import {
  api, ApiError, clearCredentials, hasCredentials, setCredentials, setUnauthorizedHandler,
} from './api.js';
import { clear, h, tagList, toast } from './dom.js';
import * as overview from './overview.js';
import * as queues from './queues.js';
import * as exchanges from './exchanges.js';
import * as connections from './connections.js';
import * as admin from './admin.js';
import * as definitions from './definitions.js';
import * as links from './links.js';

// Pages and the tags that may use them (null: every management user), as RabbitMQ's UI.
const ADMIN = ['administrator'];
const NAV = [
  ['overview', 'Overview', null],
  ['queues', 'Queues & streams', null],
  ['exchanges', 'Exchanges', null],
  ['connections', 'Connections', null],
  ['channels', 'Channels', null],
  ['users', 'Users', ADMIN],
  ['vhosts', 'Virtual hosts', ADMIN],
  ['policies', 'Policies', ['administrator', 'policymaker']],
  ['shovels', 'Shovels', null],
  ['federation', 'Federation', null],
  ['definitions', 'Definitions', ADMIN],
];

const PAGES = {
  overview: overview.page,
  queues: queues.listPage,
  queue: queues.detailPage,
  exchanges: exchanges.listPage,
  exchange: exchanges.detailPage,
  connections: connections.connectionsPage,
  channels: connections.channelsPage,
  users: admin.usersPage,
  vhosts: admin.vhostsPage,
  policies: admin.policiesPage,
  shovels: links.shovelsPage,
  federation: links.federationPage,
  definitions: definitions.page,
};

const $ = (id) => document.getElementById(id);
const state = { whoami: null, vhosts: [], current: null, timer: null, busy: false };

function showLogin(reason) {
  state.whoami = null;
  stopTimer();
  $('shell').hidden = true;
  $('login').hidden = false;
  const error = $('login-error');
  error.hidden = !reason;
  error.textContent = reason || '';
  $('login-password').value = '';
  ($('login-username').value ? $('login-password') : $('login-username')).focus();
}

setUnauthorizedHandler((error) => {
  clearCredentials();
  showLogin(error.reason);
});

async function login(event) {
  event.preventDefault();
  const button = $('login-submit');
  button.disabled = true;
  setCredentials($('login-username').value, $('login-password').value);
  try {
    await start();
  } catch (exc) {
    if (!(exc instanceof ApiError && exc.status === 401)) {
      clearCredentials();
      showLogin(exc.message || String(exc));
    }
  } finally {
    button.disabled = false;
  }
}

async function start() {
  state.whoami = await api('/api/whoami');
  $('login').hidden = true;
  $('shell').hidden = false;
  const tags = tagList(state.whoami.tags);
  clear($('whoami'), h('strong', {}, state.whoami.name || '?'), tags.length ? ` · ${tags.join(', ')}` : '');
  await Promise.all([loadVhosts(), loadVersion()]);
  await route();
}

async function loadVhosts() {
  try {
    const list = await api('/api/vhosts');
    state.vhosts = list.map((v) => v.name).filter((n) => typeof n === 'string');
  } catch (exc) {
    if (exc.status === 401) throw exc;
    state.vhosts = ['/'];
  }
  const filter = $('vhost-filter');
  const chosen = sessionStorage.getItem('streamq.vhost') || '';
  clear(filter, h('option', { value: '' }, 'All'),
    state.vhosts.map((name) => h('option', { value: name, selected: name === chosen }, name)));
  filter.value = state.vhosts.includes(chosen) ? chosen : '';
}

async function loadVersion() {
  try {
    const info = await api('/api/overview');
    const version = info.product_version || info.rabbitmq_version || info.management_version;
    $('version').textContent = [info.product_name || 'streamq', version].filter(Boolean).join(' ');
  } catch (exc) {
    if (exc.status === 401) throw exc;
  }
}

function parseHash() {
  const parts = location.hash.replace(/^#\/?/, '').split('/').filter((p) => p !== '');
  const [name = 'overview', ...params] = parts.map((p) => decodeURIComponent(p));
  return { name: PAGES[name] ? name : 'overview', params };
}

function renderNav(active) {
  const section = active === 'queue' ? 'queues' : active === 'exchange' ? 'exchanges' : active;
  const tags = tagList(state.whoami.tags);
  const allowed = NAV.filter(([, , needs]) => needs === null || needs.some((t) => tags.includes(t)));
  clear($('nav'), allowed.map(([name, title]) => h('li', {},
    h('a', { href: `#/${name}`, class: name === section ? 'active' : '', id: `nav-${name}` }, title))));
}

async function route() {
  if (!state.whoami) return;
  const { name, params } = parseHash();
  renderNav(name);
  const main = $('main');
  main.replaceChildren();
  const ctx = {
    main,
    params,
    vhost: $('vhost-filter').value,
    vhosts: state.vhosts,
    whoami: state.whoami,
    setTitle: (title) => {
      $('page-title').textContent = title;
      document.title = `${title} · streamq`;
    },
    reloadVhosts: loadVhosts,
  };
  const current = { refresh: null };
  state.current = current;
  try {
    const mounted = await PAGES[name](ctx);
    if (state.current !== current) return;
    current.refresh = mounted && mounted.refresh ? mounted.refresh : null;
    await tick();
  } catch (exc) {
    if (exc.status !== 401) toast(exc.message || String(exc), 'error');
  }
  restartTimer();
}

async function tick() {
  const current = state.current;
  if (!current || !current.refresh || state.busy) return;
  // A destructive button waiting for its second click must not be redrawn under the pointer.
  if (document.querySelector('button.armed')) return;
  state.busy = true;
  try {
    await current.refresh();
  } catch (exc) {
    if (exc.status !== 401) toast(exc.message || String(exc), 'error');
  } finally {
    state.busy = false;
  }
}

function stopTimer() {
  if (state.timer !== null) clearInterval(state.timer);
  state.timer = null;
}

function restartTimer() {
  stopTimer();
  const seconds = Number($('refresh-interval').value);
  sessionStorage.setItem('streamq.refresh', String(seconds));
  if (seconds > 0 && state.whoami) state.timer = setInterval(tick, seconds * 1000);
}

function init() {
  $('login-form').addEventListener('submit', login);
  $('logout').addEventListener('click', () => {
    clearCredentials();
    showLogin('');
  });
  $('refresh').addEventListener('click', tick);
  $('refresh-interval').value = sessionStorage.getItem('streamq.refresh') || '5';
  $('refresh-interval').addEventListener('change', restartTimer);
  $('vhost-filter').addEventListener('change', () => {
    sessionStorage.setItem('streamq.vhost', $('vhost-filter').value);
    route();
  });
  window.addEventListener('hashchange', route);
  if (!hasCredentials()) {
    showLogin('');
    return;
  }
  start().catch((exc) => {
    if (exc.status !== 401) showLogin(exc.message || String(exc));
  });
}

init();
