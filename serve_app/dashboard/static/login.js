// Sign-in: POST /api/session, then back to the page that sent the visitor here.
"use strict";

(() => {
  // Only a console path is followed after sign-in (never another site).
  function nextPage() {
    const next = new URLSearchParams(location.search).get("next") || "";
    return /^\/dashboard(\/[a-z-]*)?$/.test(next) ? next : "/dashboard/keys";
  }

  // A refused OpenID Connect sign-in comes back here with a code (never free text,
  // which anyone could put in a link): each code has its fixed sentence.
  const OIDC_ERRORS = {
    invalid_state: "The sign-in took too long or was started in another tab or browser; try again.",
    provider_refused: "The identity provider did not complete the sign-in; try again.",
    provider_unavailable: "The identity provider cannot be reached; try again later.",
    invalid_id_token: "The identity provider's answer could not be verified; ask an administrator.",
    email_not_allowed: "Your account's email address is not verified or not allowed here.",
    unknown_user: "You have no account on this gateway yet; ask an organization admin to add you.",
    no_organization: "Your account belongs to no organization yet; ask an admin to add you.",
    rate_limit_exceeded: "Too many sign-in attempts; wait a minute and try again.",
  };
  const oidcError = new URLSearchParams(location.search).get("oidc_error");
  if (oidcError) {
    GW.showError(OIDC_ERRORS[oidcError] || "The sign-in was refused; try again.");
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
