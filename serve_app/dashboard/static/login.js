// Sign-in: POST /api/session, then back to the page that sent the visitor here.
"use strict";

(() => {
  // Only a console path is followed after sign-in (never another site).
  function nextPage() {
    const next = new URLSearchParams(location.search).get("next") || "";
    return /^\/dashboard(\/[a-z-]*)?$/.test(next) ? next : "/dashboard/keys";
  }

  fetch("/api/session", { credentials: "same-origin" }).then((resp) => {
    if (resp.ok) location.assign(nextPage());
  });

  const form = document.getElementById("login-form");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const button = form.querySelector("button");
    GW.guarded(button, async () => {
      await GW.api("POST", "/api/session", {
        username: document.getElementById("login-username").value,
        password: document.getElementById("login-password").value,
      });
      location.assign(nextPage());
    });
  });
})();
