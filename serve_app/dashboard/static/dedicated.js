// Dedicated endpoints (docs/reference/dedicated.md): the rate card, create, and per
// endpoint its status and billing, scale (PATCH), pause/resume, a mode change shown as
// its preview first, and delete.
"use strict";

GW.start(async () => {
  const { el, api, guarded, num } = GW;
  const list = document.getElementById("ded-list");
  let currency = "eur";

  async function loadRates() {
    const card = await api("GET", "/api/dedicated/rates");
    currency = card.currency || currency;
    document.getElementById("rates-summary").textContent =
      `Per card-minute on ${card.applies_to_gpu_type || "the default card"}: reserved ` +
      `${GW.money(card.reserved, currency)}, spot ${GW.money(card.spot, currency)}. ` +
      `Your organization may run up to ${card.max_replicas_cap} replicas per endpoint.`;
    const rows = Object.entries(card.hourly_by_gpu_type || {}).map(([gpu, r]) => el("tr", {},
      el("th", { scope: "row" }, gpu), el("td", { class: "num" }, GW.money(r.reserved, currency)),
      el("td", { class: "num" }, GW.money(r.spot, currency))));
    GW.fill(document.querySelector("#rates-table tbody"), rows, "No priced GPU types.", 3);
  }

  // Own-fleet chat, embedding and scoring models; the API says which are eligible.
  async function loadModels() {
    const models = await api("GET", "/v1/models");
    const select = document.getElementById("ded-model");
    const own = models.data.filter((m) => !m.parent && m.pricing_mode !== "external"
      && !m.id.startsWith("ded/"));
    select.replaceChildren(...own.map((m) => el("option", { value: m.id }, m.id)));
  }

  function field(label, input) {
    const id = `f-${Math.random().toString(36).slice(2, 9)}`;
    input.id = id;
    return [el("label", { for: id }, label), input];
  }

  function facts(ep) {
    const live = ep.live ? `${ep.live.replicas_ready} ready of ${ep.live.replicas_total}` : "none deployed";
    const minutes = ep.month_minutes || {};
    const items = [
      ["Status", ep.status], ["Model", ep.model_id], ["Mode", ep.mode],
      ["Replicas", `${ep.min_replicas}–${ep.max_replicas}` + (ep.mode === "hybrid" ? `, floor ${ep.reserved_floor}` : "")],
      ["Live", live], ["Cards per replica", num(ep.cards_per_replica)],
      ["This month", `${num(minutes.reserved || 0)} reserved + ${num(minutes.spot || 0)} spot replica-minutes, ${GW.money(ep.month_cost, currency)}`],
      ["Created", GW.when(ep.created_at)],
    ];
    return el("dl", { class: "facts" }, ...items.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  }

  function scaleForm(ep) {
    const min = el("input", { type: "number", min: 0, max: 32, value: ep.min_replicas });
    const max = el("input", { type: "number", min: 1, max: 32, value: ep.max_replicas });
    const form = el("form", { class: "grid" }, ...field("Min replicas", min), ...field("Max replicas", max),
      el("div", {}, el("button", { type: "submit" }, "Scale")));
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      guarded(e.submitter, async () => {
        await api("PATCH", `/api/dedicated/${ep.endpoint_id}`,
          { min_replicas: Number(min.value), max_replicas: Number(max.value) });
        GW.showInfo(`${ep.alias} rescaled.`);
        await loadEndpoints();
      });
    });
    return form;
  }

  function previewText(p) {
    const r = p.reload || {};
    const lines = [
      `${p.from.mode} → ${p.to.mode}` + (p.to.mode === "hybrid" ? ` (floor ${p.to.reserved_floor})` : ""),
      `Replicas reloaded: ${num(r.replicas_reloaded)} (${num(r.replicas_reserved)} reserved, ${num(r.replicas_spot)} spot)`,
      `Estimated boot: ${num(r.estimated_boot_seconds)} s (${r.estimate_source}), cost ${GW.money(r.estimated_cost, r.currency)}`,
      `Calls may fail and be retried for about ${num(p.unavailable_window_seconds)} s`,
      `Rate per card-minute: ${GW.money(p.rate_per_card_minute_before, r.currency)} → ${GW.money(p.rate_per_card_minute_after, r.currency)}`,
    ];
    if (!p.allowed) lines.push(`Not possible now: ${p.blocked_reason}`);
    return lines;
  }

  function modeForm(ep) {
    const mode = el("select", {}, ...["spot", "reserved", "hybrid"].map((m) =>
      el("option", { value: m, selected: m === ep.mode }, m)));
    const floor = el("input", { type: "number", min: 1, max: 32, value: Math.max(1, ep.reserved_floor || 1) });
    const out = el("div", { class: "preview", role: "status" });
    const confirmButton = el("button", { type: "button", class: "danger", hidden: true }, "Confirm redeploy");
    const target = () => (mode.value === "hybrid"
      ? { mode: mode.value, reserved_floor: Number(floor.value) } : { mode: mode.value });
    const form = el("form", { class: "grid" }, ...field("New mode", mode), ...field("Reserved floor (hybrid)", floor),
      el("div", {}, el("button", { type: "submit", class: "secondary" }, "Preview change")), out,
      el("div", {}, confirmButton));
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      guarded(e.submitter, async () => {
        const p = await api("POST", `/api/dedicated/${ep.endpoint_id}/mode/preview`, target());
        out.replaceChildren(el("ul", {}, ...previewText(p).map((t) => el("li", {}, t))));
        confirmButton.hidden = !p.allowed;
      });
    });
    confirmButton.addEventListener("click", () => guarded(confirmButton, async () => {
      await api("PUT", `/api/dedicated/${ep.endpoint_id}/mode`, { ...target(), confirm_redeploy: true });
      GW.showInfo(`${ep.alias} is redeploying in ${mode.value} mode.`);
      await loadEndpoints();
    }));
    return form;
  }

  function actions(ep) {
    const paused = ep.status === "paused";
    const verb = paused ? "resume" : "pause";
    const toggle = el("button", { type: "button", class: "secondary" }, paused ? "Resume" : "Pause");
    toggle.addEventListener("click", () => guarded(toggle, async () => {
      await api("POST", `/api/dedicated/${ep.endpoint_id}/${verb}`);
      await loadEndpoints();
    }));
    const del = el("button", { type: "button", class: "danger", "aria-label": `Delete ${ep.alias}` }, "Delete");
    del.addEventListener("click", () => {
      if (!confirm(`Delete ${ep.alias}? Its replicas are released and the alias is never reused.`)) return;
      guarded(del, async () => {
        await api("DELETE", `/api/dedicated/${ep.endpoint_id}`);
        GW.showInfo(`${ep.alias} deleted.`);
        await loadEndpoints();
      });
    });
    return el("div", { class: "row" }, toggle, del);
  }

  function endpointCard(ep) {
    return el("article", { class: "card", "data-endpoint-id": ep.endpoint_id },
      el("h3", {}, el("code", {}, ep.alias)), facts(ep),
      el("details", {}, el("summary", {}, "Scale"), scaleForm(ep)),
      el("details", {}, el("summary", {}, "Change mode"), modeForm(ep)),
      actions(ep));
  }

  async function loadEndpoints() {
    const endpoints = await api("GET", "/api/dedicated");
    document.getElementById("ded-empty").hidden = endpoints.length > 0;
    list.replaceChildren(...endpoints.map(endpointCard));
  }

  const form = document.getElementById("ded-form");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const mode = document.getElementById("ded-mode").value;
    const body = {
      model_id: document.getElementById("ded-model").value,
      alias_slug: document.getElementById("ded-slug").value.trim(),
      mode,
      min_replicas: Number(document.getElementById("ded-min").value),
      max_replicas: Number(document.getElementById("ded-max").value),
    };
    if (mode === "hybrid") body.reserved_floor = Number(document.getElementById("ded-floor").value);
    guarded(event.submitter, async () => {
      const ep = await api("POST", "/api/dedicated", body);
      GW.showInfo(`${ep.alias} is ${ep.status}.`);
      form.reset();
      await loadEndpoints();
    });
  });

  await Promise.all([loadRates(), loadModels(), loadEndpoints()]);
});
