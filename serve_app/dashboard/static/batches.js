// Batches and files: the organization's files (upload, delete), its batches (create from
// an uploaded file, cancel, the results file), through /v1/files and /v1/batches.
"use strict";

GW.start(async () => {
  const { el, api, guarded, num } = GW;
  const filesBody = document.querySelector("#files-table tbody");
  const batchesBody = document.querySelector("#batches-table tbody");
  const fileSelect = document.getElementById("batch-file");

  function fileRow(f) {
    const del = el("button", { type: "button", class: "danger", "aria-label": `Delete ${f.filename}` }, "Delete");
    del.addEventListener("click", () => {
      if (!confirm(`Delete ${f.filename}?`)) return;
      guarded(del, async () => { await api("DELETE", `/v1/files/${f.id}`); await loadFiles(); });
    });
    return el("tr", { "data-file-id": f.id }, el("td", {}, el("code", {}, f.id)), el("td", {}, f.filename),
      el("td", {}, f.purpose), el("td", { class: "num" }, num(f.bytes)), el("td", {}, GW.when(f.created_at)),
      el("td", {}, el("a", { href: `/v1/files/${f.id}/content`, download: f.filename }, "Download"), " ", del));
  }

  async function loadFiles() {
    const files = await api("GET", "/v1/files");
    GW.fill(filesBody, files.data.map(fileRow), "No files.", 6);
    const inputs = files.data.filter((f) => f.purpose === "batch");
    fileSelect.replaceChildren(...inputs.map((f) => el("option", { value: f.id }, `${f.filename} (${f.id})`)));
  }

  function batchRow(b) {
    const counts = b.request_counts || {};
    const open = ["validating", "in_progress", "finalizing"].includes(b.status);
    const cancel = open ? el("button", { type: "button", class: "danger", "aria-label": `Cancel batch ${b.id}` }, "Cancel") : null;
    if (cancel) {
      cancel.addEventListener("click", () => guarded(cancel, async () => {
        await api("POST", `/v1/batches/${b.id}/cancel`);
        await loadBatches();
      }));
    }
    const results = [["output", b.output_file_id], ["errors", b.error_file_id]]
      .filter(([, id]) => id).map(([label, id]) => el("a", { href: `/v1/files/${id}/content` }, label));
    const errors = (b.errors && b.errors.data || []).map((e) => `${e.line ? `line ${e.line}: ` : ""}${e.message}`);
    return el("tr", { "data-batch-id": b.id }, el("td", {}, el("code", {}, b.id)), el("td", {}, b.endpoint),
      el("td", { title: errors.join("\n") || null }, b.status + (errors.length ? ` (${errors[0]})` : "")),
      el("td", { class: "num" }, `${num(counts.completed)} / ${num(counts.failed)} / ${num(counts.total)}`),
      el("td", {}, GW.when(b.created_at)), el("td", {}, ...results.flatMap((a) => [a, " "])), el("td", {}, cancel));
  }

  async function loadBatches() {
    const batches = await api("GET", "/v1/batches?limit=100");
    GW.fill(batchesBody, batches.data.map(batchRow), "No batches.", 7);
  }

  const fileForm = document.getElementById("file-form");
  fileForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData();
    data.append("purpose", "batch");
    data.append("file", document.getElementById("file-input").files[0]);
    guarded(event.submitter, async () => {
      const f = await api("POST", "/v1/files", data);
      GW.showInfo(`Uploaded ${f.filename} as ${f.id}.`);
      fileForm.reset();
      await loadFiles();
    });
  });

  document.getElementById("batch-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const body = {
      input_file_id: fileSelect.value,
      endpoint: document.getElementById("batch-endpoint").value,
      completion_window: "24h",
    };
    guarded(event.submitter, async () => {
      const b = await api("POST", "/v1/batches", body);
      GW.showInfo(`Batch ${b.id} is ${b.status}.`);
      await loadBatches();
    });
  });

  await Promise.all([loadFiles(), loadBatches()]);
});
