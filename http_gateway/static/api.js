// The management API client: credentials in sessionStorage, `Authorization: Basic` on
// every request, RabbitMQ-style error bodies turned into ApiError.

const AUTH_KEY = 'streamq.auth';
const TIMEOUT_MS = 15000;

export class ApiError extends Error {
  constructor(status, reason) {
    super(reason);
    this.status = status;
    this.reason = reason;
  }
}

function base64Utf8(text) {
  let binary = '';
  for (const byte of new TextEncoder().encode(text)) binary += String.fromCharCode(byte);
  return btoa(binary);
}

export function setCredentials(username, password) {
  sessionStorage.setItem(AUTH_KEY, base64Utf8(`${username}:${password}`));
}

export function clearCredentials() {
  sessionStorage.removeItem(AUTH_KEY);
}

export function hasCredentials() {
  return sessionStorage.getItem(AUTH_KEY) !== null;
}

// A path segment: vhost "/" is "%2F", the default exchange is "amq.default".
export function enc(segment) {
  return encodeURIComponent(segment);
}

export function exchangePath(vhost, name) {
  return `/api/exchanges/${enc(vhost)}/${enc(name === '' ? 'amq.default' : name)}`;
}

export function queuePath(vhost, name) {
  return `/api/queues/${enc(vhost)}/${enc(name)}`;
}

let onUnauthorized = () => {};

export function setUnauthorizedHandler(handler) {
  onUnauthorized = handler;
}

async function errorOf(response) {
  let reason = response.statusText || `HTTP ${response.status}`;
  try {
    const body = await response.json();
    if (body && typeof body.reason === 'string') reason = body.reason;
    else if (body && typeof body.error === 'string') reason = body.error;
  } catch {
    // Not JSON: keep the status text.
  }
  return new ApiError(response.status, reason);
}

// fetch with our credentials. `credentials: 'omit'` keeps the browser from showing its own
// basic-auth dialog on a 401: the header we set is still sent.
export async function api(path, { method = 'GET', body, headers = {}, raw = false } = {}) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), TIMEOUT_MS);
  const init = {
    method,
    credentials: 'omit',
    cache: 'no-store',
    signal: controller.signal,
    headers: { Accept: 'application/json', ...headers },
  };
  const token = sessionStorage.getItem(AUTH_KEY);
  if (token !== null) init.headers.Authorization = `Basic ${token}`;
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = typeof body === 'string' ? body : JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (exc) {
    throw new ApiError(0, exc.name === 'AbortError' ? 'the broker did not answer in time'
      : 'cannot reach the broker');
  } finally {
    clearTimeout(timer);
  }
  if (!response.ok) {
    const error = await errorOf(response);
    if (response.status === 401) onUnauthorized(error);
    throw error;
  }
  if (raw) return response;
  if (response.status === 204) return null;
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

// A list endpoint, all vhosts or one.
export function listPath(kind, vhost) {
  return vhost ? `/api/${kind}/${enc(vhost)}` : `/api/${kind}`;
}
