// Keys: create (name, scopes, expiry; the secret shown once), list, revoke.
"use strict";

GW.start(async () => {
  const { el, api, guarded } = GW;
  const tbody = document.querySelector("#keys-table tbody");

  function status(key) {
    if (key.revoked_at) return "revoked";
    if (key.expires_at && key.expires_at * 1000 < Date.now()) return "expired";
    return "active";
  }

  function row(key) {
    const state = status(key);
    const label = key.name || key.prefix;
    const revoke = state === "active"
      ? el("button", {
        type: "button", class: "danger", "aria-label": `Revoke key ${label}`,
        onclick: (e) => revokeKey(e.currentTarget, key),
      }, "Revoke")
      : null;
    return el("tr", { "data-key-id": key.id },
      el("td", {}, key.name || el("span", { class: "hint" }, "(no name)")),
      el("td", {}, el("code", {}, key.prefix)),
      el("td", {}, (key.scopes || []).join(", ")), el("td", {}, key.user_name || key.user_id),
      el("td", {}, GW.when(key.created_at)), el("td", {}, GW.when(key.expires_at)),
      el("td", {}, GW.when(key.last_used_at)), el("td", { class: `status ${state}` }, state),
      el("td", {}, revoke));
  }

  async function load() {
    const list = await api("GET", "/api/keys");
    GW.fill(tbody, list.data.map(row), "No keys yet.", 9);
  }

  async function revokeKey(button, key) {
    if (!confirm(`Revoke the key "${key.name || key.prefix}"? Calls with it fail at once.`)) return;
    await guarded(button, async () => {
      await api("DELETE", `/api/keys/${encodeURIComponent(key.id)}`);
      GW.showInfo(`Key "${key.name || key.prefix}" revoked.`);
      await load();
    });
  }

  const form = document.getElementById("key-form");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const scopes = [...form.querySelectorAll("input[name=scope]:checked")].map((i) => i.value);
    const expiry = document.getElementById("key-expiry").value;
    const body = {
      name: document.getElementById("key-name").value.trim(),
      scopes,
      expires_at: expiry ? Math.floor(Date.parse(`${expiry}T23:59:59Z`) / 1000) : null,
    };
    guarded(form.querySelector("button[type=submit]"), async () => {
      const created = await api("POST", "/api/keys", body);
      document.getElementById("key-secret-value").textContent = created.key;
      const box = document.getElementById("key-secret");
      box.hidden = false;
      document.getElementById("key-copy").focus();
      form.reset();
      await load();
    });
  });

  document.getElementById("key-copy").addEventListener("click", async () => {
    const secret = document.getElementById("key-secret-value").textContent;
    try {
      await navigator.clipboard.writeText(secret);
      GW.showInfo("Key copied to the clipboard.");
    } catch (_) {
      GW.showInfo("Select the key and copy it: this browser did not allow the clipboard.");
    }
  });

  await load();
});
