// Adapters (docs/reference/adapters.md): upload a LoRA archive for a base model, list the
// organization's and the catalog's adapters, delete the organization's.
"use strict";

GW.start(async () => {
  const { el, api, guarded, num } = GW;
  const tbody = document.querySelector("#adapters-table tbody");

  function row(a) {
    const del = a.source === "organization"
      ? el("button", { type: "button", class: "danger", "aria-label": `Delete adapter ${a.name}` }, "Delete")
      : null;
    if (del) {
      del.addEventListener("click", () => {
        if (!confirm(`Delete the adapter ${a.name}? Calls naming ${a.model} fail from now on.`)) return;
        guarded(del, async () => {
          await api("DELETE", `/api/adapters/${encodeURIComponent(a.name)}`);
          GW.showInfo(`Adapter ${a.name} deleted.`);
          await load();
        });
      });
    }
    return el("tr", { "data-adapter": a.name }, el("td", {}, a.name), el("td", {}, el("code", {}, a.model)),
      el("td", {}, a.base_model), el("td", {}, a.source), el("td", { class: "num" }, num(a.rank)),
      el("td", { class: "num" }, num(a.bytes)), el("td", {}, GW.when(a.created_at)), el("td", {}, del));
  }

  async function load() {
    const list = await api("GET", "/api/adapters");
    GW.fill(tbody, list.data.map(row), "No adapters.", 8);
  }

  async function loadBases() {
    const models = await api("GET", "/v1/models");
    const chat = models.data.filter((m) => !m.parent && m.pricing_mode !== "external"
      && m.architecture.output_modalities.includes("text") && !m.id.startsWith("ded/"));
    document.getElementById("adapter-base").replaceChildren(
      ...chat.map((m) => el("option", { value: m.id }, m.id)));
  }

  const form = document.getElementById("adapter-form");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData();
    data.append("file", document.getElementById("adapter-file").files[0]);
    data.append("name", document.getElementById("adapter-name").value.trim());
    data.append("base_model", document.getElementById("adapter-base").value);
    guarded(event.submitter, async () => {
      const a = await api("POST", "/api/adapters", data);
      GW.showInfo(`Adapter ${a.name} uploaded: call it as ${a.model}.`);
      form.reset();
      await load();
    });
  });

  await Promise.all([load(), loadBases()]);
});
