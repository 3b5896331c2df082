// Playground: a chat with any model the organization may use (/v1/models), streamed from
// /v1/chat/completions with the session (server-sent events read from the fetch body).
"use strict";

GW.start(async () => {
  const { el, guarded } = GW;
  const form = document.getElementById("play-form");
  const transcript = document.getElementById("play-transcript");
  const input = document.getElementById("play-input");
  const stop = document.getElementById("play-stop");
  const usage = document.getElementById("play-usage");
  let history = [];
  let controller = null;

  const models = await GW.api("GET", "/v1/models");
  const chat = models.data.filter((m) => m.architecture.output_modalities.includes("text")
    && !(m.pooling));
  const modelSelect = document.getElementById("play-model");
  modelSelect.replaceChildren(...chat.map((m) => el("option", { value: m.id }, m.id)));
  // Max tokens follows the model's own bound, so the first send is not refused for it.
  const maxInput = document.getElementById("play-max");
  function fitMaxTokens() {
    const card = chat.find((m) => m.id === modelSelect.value);
    const bound = card && card.max_output_tokens;
    maxInput.max = bound || "";
    maxInput.value = String(Math.min(256, bound || 256));
  }
  modelSelect.addEventListener("change", fitMaxTokens);
  fitMaxTokens();

  function bubble(role, text) {
    const body = el("div", { class: "text" }, text);
    transcript.append(el("div", { class: `msg ${role}` }, el("span", { class: "role" }, role), body));
    return body;
  }

  // Reads "data: ..." frames until [DONE]; each chunk's delta is appended as it comes.
  async function readStream(resp, out) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let text = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of frame.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") return text;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          if (chunk.usage) {
            usage.textContent = `${chunk.usage.prompt_tokens} prompt + ${chunk.usage.completion_tokens} completion tokens`;
          }
          const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
          if (delta && delta.content) {
            text += delta.content;
            out.textContent = text;
          }
        }
      }
    }
    return text;
  }

  async function send() {
    const content = input.value.trim();
    if (!content) return;
    const system = document.getElementById("play-system").value.trim();
    history.push({ role: "user", content });
    bubble("user", content);
    input.value = "";
    const out = bubble("assistant", "");
    const body = {
      model: document.getElementById("play-model").value,
      messages: system ? [{ role: "system", content: system }, ...history] : history,
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: Number(document.getElementById("play-max").value),
      temperature: Number(document.getElementById("play-temp").value),
    };
    controller = new AbortController();
    stop.disabled = false;
    usage.textContent = "";
    try {
      const resp = await GW.raw("POST", "/v1/chat/completions", body, controller.signal);
      const text = await readStream(resp, out);
      history.push({ role: "assistant", content: text });
    } catch (err) {
      history.pop();
      out.parentElement.remove();
      if (err.name !== "AbortError") throw err;
    } finally {
      stop.disabled = true;
      controller = null;
    }
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    guarded(document.getElementById("play-send"), send);
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  stop.addEventListener("click", () => controller && controller.abort());
  document.getElementById("play-clear").addEventListener("click", () => {
    history = [];
    transcript.replaceChildren();
    usage.textContent = "";
    input.focus();
  });
});
