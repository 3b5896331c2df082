// Members and flags (admins): the organization's account flags, its members and their
// roles, adding and removing members; all through /api/orgs/current.
"use strict";

GW.start(async () => {
  const { el, api, guarded } = GW;
  const flagsForm = document.getElementById("flags-form");
  const tbody = document.querySelector("#members-table tbody");
  const FLAGS = ["web_search_enabled", "web_fetch_enabled", "code_interpreter_enabled",
    "external_providers_enabled"];

  function memberRow(m) {
    const role = el("select", { "aria-label": `Role of ${m.name}` },
      ...["member", "admin"].map((r) => el("option", { value: r, selected: r === m.role }, r)));
    const save = el("button", {
      type: "button", class: "secondary", "aria-label": `Save role of ${m.name}`,
      onclick: (e) => guarded(e.currentTarget, async () => {
        await api("PATCH", `/api/orgs/current/members/${encodeURIComponent(m.user_id)}`, { role: role.value });
        GW.showInfo(`${m.name} is now ${role.value}.`);
        await load();
      }),
    }, "Save role");
    const remove = el("button", {
      type: "button", class: "danger", "aria-label": `Remove ${m.name}`,
      onclick: (e) => {
        if (!confirm(`Remove ${m.name}? Their sessions end and their keys are revoked.`)) return;
        guarded(e.currentTarget, async () => {
          await api("DELETE", `/api/orgs/current/members/${encodeURIComponent(m.user_id)}`);
          GW.showInfo(`${m.name} removed.`);
          await load();
        });
      },
    }, "Remove");
    return el("tr", { "data-user-id": m.user_id }, el("td", {}, m.name), el("td", {}, role),
      el("td", {}, el("div", { class: "actions" }, save, remove)));
  }

  async function load() {
    const org = await api("GET", "/api/orgs/current");
    for (const flag of FLAGS) flagsForm.elements[flag].checked = !!org.flags[flag];
    GW.fill(tbody, org.members.map(memberRow), "No members.", 3);
  }

  flagsForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const body = Object.fromEntries(FLAGS.map((f) => [f, flagsForm.elements[f].checked]));
    guarded(event.submitter, async () => {
      await api("PATCH", "/api/orgs/current", body);
      GW.showInfo("Flags saved.");
      await load();
    });
  });

  const memberForm = document.getElementById("member-form");
  memberForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const body = {
      username: document.getElementById("member-username").value.trim(),
      role: document.getElementById("member-role").value,
    };
    const password = document.getElementById("member-password").value;
    if (password) body.password = password;
    guarded(event.submitter, async () => {
      await api("POST", "/api/orgs/current/members", body);
      GW.showInfo(`${body.username} added as ${body.role}.`);
      memberForm.reset();
      await load();
    });
  });

  await load();
});
