// Usage and spend: quotas, a bar chart per day (inline SVG), a table per model (or key,
// or user) and the CSV export of the same range, all from /api/billing.
"use strict";

GW.start(async () => {
  const { el, api, num } = GW;
  const SVG = "http://www.w3.org/2000/svg";
  const startInput = document.getElementById("usage-start");
  const endInput = document.getElementById("usage-end");
  const metric = document.getElementById("usage-metric");
  const group = document.getElementById("usage-group");
  let days = [];

  function isoDay(d) { return d.toISOString().slice(0, 10); }
  const today = new Date();
  endInput.value = isoDay(today);
  startInput.value = isoDay(new Date(today.getTime() - 29 * 86400000));

  function query(groupBy) {
    const q = new URLSearchParams({ start: startInput.value, end: endInput.value });
    if (groupBy) q.set("group_by", groupBy);
    return q.toString();
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    for (const c of children) node.append(c);
    return node;
  }

  // Every day of the range gets a bar (0 for a day without usage).
  function series(rows, key) {
    const byDay = new Map(rows.map((r) => [r.group, r[key]]));
    const out = [];
    for (let d = new Date(`${startInput.value}T00:00:00Z`); isoDay(d) <= endInput.value;
      d = new Date(d.getTime() + 86400000)) {
      out.push([isoDay(d), Number(byDay.get(isoDay(d)) || 0)]);
    }
    return out;
  }

  function drawChart() {
    const key = metric.value;
    const points = series(days, key);
    const width = 640, height = 200, left = 56, bottom = 24, top = 10;
    const max = Math.max(1e-9, ...points.map((p) => p[1]));
    const step = (width - left) / Math.max(1, points.length);
    const label = key === "cost_usd" ? (v) => `$${v.toFixed(4)}` : (v) => num(Math.round(v));
    const total = points.reduce((s, p) => s + p[1], 0);
    const chart = svg("svg", {
      viewBox: `0 0 ${width} ${height}`, role: "img", class: "bars",
      "aria-label": `${metric.selectedOptions[0].text} per day, ${points.length} days, total ${label(total)}`,
    });
    chart.append(svg("line", { x1: left, y1: height - bottom, x2: width, y2: height - bottom, class: "axis" }));
    chart.append(svg("text", { x: left - 6, y: top + 8, "text-anchor": "end", class: "tick" }, label(max)));
    chart.append(svg("text", { x: left - 6, y: height - bottom, "text-anchor": "end", class: "tick" }, "0"));
    points.forEach(([day, value], i) => {
      const h = ((height - bottom - top) * value) / max;
      const bar = svg("rect", {
        x: left + i * step + step * 0.15, y: height - bottom - h,
        width: Math.max(1, step * 0.7), height: Math.max(0, h), class: "bar",
      }, svg("title", {}, `${day}: ${label(value)}`));
      chart.append(bar);
      const last = points.length - 1;
      if (i === last || (i % 7 === 0 && last - i >= 4)) {  // labels that never overlap
        chart.append(svg("text", { x: left + i * step + step / 2, y: height - 6, "text-anchor": "middle", class: "tick" }, day.slice(5)));
      }
    });
    document.getElementById("usage-chart").replaceChildren(chart);
  }

  function cells(row, tag) {
    return [
      el(tag, tag === "th" ? { scope: "row" } : {}, row.group),
      el("td", { class: "num" }, num(row.requests)),
      el("td", { class: "num" }, num(row.prompt_tokens)),
      el("td", { class: "num" }, num(row.completion_tokens)),
      el("td", { class: "num" }, num(row.total_tokens)),
      el("td", { class: "num" }, Number(row.cost_usd).toFixed(6)),
    ];
  }

  async function loadTable() {
    const by = group.value;
    const name = group.selectedOptions[0].text;
    document.getElementById("group-name").textContent = name.toLowerCase();
    document.getElementById("usage-group-col").textContent = name;
    const answer = await api("GET", `/api/billing/usage?${query(by)}`);
    const tbody = document.querySelector("#usage-table tbody");
    GW.fill(tbody, answer.data.map((r) => el("tr", { "data-group": r.group }, cells(r, "th"))),
      "No usage in this range.", 6);
    const foot = document.querySelector("#usage-table tfoot");
    foot.replaceChildren(el("tr", { class: "total" }, cells({ ...answer.total, group: "Total" }, "th")));
  }

  async function loadQuotas() {
    const q = await api("GET", "/api/billing/quotas");
    const d = q.daily_tokens || {};
    const facts = [
      ["Daily tokens used", num(d.used)],
      ["Daily token limit", d.limit === null ? "none" : num(d.limit)],
      ["Left today", d.remaining === null ? "unlimited" : num(d.remaining)],
      ["Requests per minute", q.rpm === null ? "none" : num(q.rpm)],
      ["Tokens per minute", q.tpm === null ? "none" : num(q.tpm)],
    ];
    document.getElementById("quotas").replaceChildren(
      ...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  }

  async function loadAll() {
    document.getElementById("usage-csv").href = `/api/billing/usage.csv?${query(group.value)}`;
    const perDay = await api("GET", `/api/billing/usage?${query("day")}`);
    days = perDay.data;
    drawChart();
    await Promise.all([loadTable(), loadQuotas()]);
  }

  document.getElementById("usage-range").addEventListener("submit", (event) => {
    event.preventDefault();
    GW.guarded(event.submitter, loadAll);
  });
  metric.addEventListener("change", drawChart);
  group.addEventListener("change", () => GW.guarded(null, async () => {
    document.getElementById("usage-csv").href = `/api/billing/usage.csv?${query(group.value)}`;
    await loadTable();
  }));
  await loadAll();
});
