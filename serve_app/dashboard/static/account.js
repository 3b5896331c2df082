// Your account: change your password (POST /api/session/password); platform admins also
// read where the Ray dashboard and its token are (GET /api/admin/ray-dashboard).
"use strict";

GW.start(async () => {
  const form = document.getElementById("password-form");
  const current = document.getElementById("current-password");
  const fresh = document.getElementById("new-password");
  const repeat = document.getElementById("repeat-password");

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (fresh.value !== repeat.value) {
      GW.showError("The two new passwords differ.");
      repeat.focus();
      return;
    }
    GW.guarded(form.querySelector("button"), async () => {
      await GW.api("POST", "/api/session/password", {
        current_password: current.value,
        new_password: fresh.value,
      });
      form.reset();
      GW.showInfo("Password changed. Your other sessions have ended.");
    });
  });

  if (!GW.isAdmin()) return;
  const resp = await fetch("/api/admin/ray-dashboard", { credentials: "same-origin" });
  if (!resp.ok) return; // an admin of an ordinary organization: not a platform admin
  const info = await resp.json();
  const link = document.getElementById("ray-url");
  link.href = info.url;
  link.textContent = info.url;
  document.getElementById("ray-token").textContent = info.token_hint;
  document.getElementById("ray-section").hidden = false;
});
