// The only way the UI talks to the gateway: the admin API, with the session cookie the browser holds.
// Writes carry the session's CSRF token (from login or whoami) in x-csrf-token, as the API demands.

let csrfToken = null;

export function setCsrfToken(token) {
  csrfToken = token || null;
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** Call the admin API; resolves to the decoded JSON (or text), rejects with ApiError. */
export async function api(method, path, body) {
  const headers = { accept: "application/json" };
  const init = { method, headers, credentials: "same-origin", cache: "no-store" };
  if (method !== "GET" && csrfToken) headers["x-csrf-token"] = csrfToken;
  if (body !== undefined) {
    headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, `the admin API did not answer (${err.message})`);
  }
  const text = await response.text();
  let data = text;
  if ((response.headers.get("content-type") || "").startsWith("application/json")) {
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = text;
    }
  }
  if (!response.ok) {
    const message = data && data.error && data.error.message ? data.error.message : `HTTP ${response.status}`;
    throw new ApiError(response.status, message);
  }
  return data;
}

/** Like api(), but a 404 (a route this gateway does not have yet) resolves to `missing`. */
export async function apiOptional(method, path, body, missing = null) {
  try {
    return await api(method, path, body);
  } catch (err) {
    if (err instanceof ApiError && err.status === 404 && err.message.startsWith("no admin route")) {
      return missing;
    }
    throw err;
  }
}
