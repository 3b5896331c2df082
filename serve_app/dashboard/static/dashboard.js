// The console's shared script: the session, API calls with the CSRF header, the header
// bar, and small DOM and formatting helpers. Every page script calls GW.start(init).
"use strict";

const GW = (() => {
  let session = null;

  class ApiError extends Error {
    constructor(status, message, code) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  // The API's own message ("error.message") is what a person reads, never a trace.
  async function errorFrom(resp) {
    let message = `${resp.status} ${resp.statusText}`;
    let code = null;
    try {
      const body = await resp.json();
      if (body && body.error) {
        message = body.error.message || message;
        code = body.error.code || null;
      }
    } catch (_) { /* not JSON: keep the status line */ }
    return new ApiError(resp.status, message, code);
  }

  function headers(method, json) {
    const h = {};
    if (json) h["Content-Type"] = "application/json";
    if (method !== "GET" && session) h["X-CSRF-Token"] = session.csrf_token;
    return h;
  }

  // fetch with the session cookie and, on a write, the CSRF token; a lost session
  // (401) goes back to the sign-in page.
  async function raw(method, path, body, signal) {
    const isForm = body instanceof FormData;
    const json = body !== undefined && !isForm;
    const resp = await fetch(path, {
      method,
      credentials: "same-origin",
      headers: headers(method, json),
      body: json ? JSON.stringify(body) : body,
      signal,
    });
    if (resp.status === 401 && session) {
      location.assign(`/dashboard/login?next=${encodeURIComponent(location.pathname)}`);
    }
    if (!resp.ok) throw await errorFrom(resp);
    return resp;
  }

  async function api(method, path, body) {
    const resp = await raw(method, path, body);
    if (resp.status === 204) return null;
    const type = resp.headers.get("content-type") || "";
    return type.includes("json") ? resp.json() : resp.text();
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else if (k === "text") node.textContent = v;
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function alertBox() { return document.getElementById("alert"); }

  function showError(err) {
    const box = alertBox();
    box.className = "alert error";
    box.textContent = err instanceof Error ? err.message : String(err);
    box.hidden = false;
    box.focus();
  }

  function showInfo(text) {
    const box = alertBox();
    box.className = "alert info";
    box.textContent = text;
    box.hidden = false;
  }

  function clearAlert() { alertBox().hidden = true; }

  // Runs an action, showing the API's message if it fails; the button is disabled
  // meanwhile so a double click is not two requests.
  async function guarded(button, action) {
    clearAlert();
    if (button) button.disabled = true;
    try {
      return await action();
    } catch (err) {
      showError(err);
      return undefined;
    } finally {
      if (button) button.disabled = false;
    }
  }

  function fill(tbody, rows, emptyText, columns) {
    tbody.replaceChildren();
    if (!rows.length) {
      tbody.append(el("tr", {}, el("td", { colspan: columns, class: "empty" }, emptyText)));
      return;
    }
    for (const row of rows) tbody.append(row);
  }

  const numberFormat = new Intl.NumberFormat();
  function num(n) { return n === null || n === undefined ? "—" : numberFormat.format(n); }
  function money(n, currency) {
    if (n === null || n === undefined) return "—";
    return `${Number(n).toFixed(4)}${currency ? " " + currency.toUpperCase() : ""}`;
  }
  function when(epoch) {
    if (!epoch) return "—";
    const d = typeof epoch === "number" ? new Date(epoch * 1000) : new Date(epoch);
    return d.toISOString().replace("T", " ").slice(0, 16) + " UTC";
  }

  function renderOrgs() {
    const select = document.getElementById("org-select");
    if (!select || !session) return;
    select.replaceChildren(...session.orgs.map((o) =>
      el("option", { value: o.id, selected: o.id === session.org.id }, `${o.name} (${o.role})`)));
    select.disabled = session.orgs.length < 2;
    select.addEventListener("change", () => guarded(select, async () => {
      await api("POST", "/api/session/org", { org_id: select.value });
      location.reload();
    }));
  }

  function wireSignOut() {
    const button = document.getElementById("sign-out");
    if (!button) return;
    button.addEventListener("click", () => guarded(button, async () => {
      await api("DELETE", "/api/session");
      session = null;
      location.assign("/dashboard/login");
    }));
  }

  // Platform admins get a link to Ray's dashboard (and where its token is).
  async function rayLink() {
    if (!session || session.org.role !== "admin") return;
    try {
      const resp = await fetch("/api/admin/ray-dashboard", { credentials: "same-origin" });
      if (!resp.ok) return;
      const info = await resp.json();
      const a = document.getElementById("ray-link-a");
      a.href = info.url;
      if (info.token_hint) a.title = info.token_hint;
      document.getElementById("ray-link").hidden = false;
    } catch (_) { /* not a platform admin, or no Ray here */ }
  }

  async function start(init) {
    try {
      session = await api("GET", "/api/session");
    } catch (err) {
      location.assign(`/dashboard/login?next=${encodeURIComponent(location.pathname)}`);
      return;
    }
    renderOrgs();
    wireSignOut();
    rayLink();
    try {
      await init(session);
    } catch (err) {
      showError(err);
    }
  }

  return {
    api, raw, el, fill, guarded, showError, showInfo, clearAlert, num, money, when, start,
    get session() { return session; },
    isAdmin() { return !!session && session.org.role === "admin"; },
  };
})();
