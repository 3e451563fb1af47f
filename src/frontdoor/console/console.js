// The Aptix console: reads the public HTTP API with the token the person entered (kept in
// this tab's sessionStorage) and shows sessions' turns, one turn in full (the inspector) and
// batches. Text from the API is only ever put in the page as text, never as markup.
"use strict";

const TOKEN_KEY = "aptix-console-token";
const SETTLED = ["completed", "failed", "cancelled", "awaiting_client_tools"];
let stopView = () => {};

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

function showError(message) {
  const box = $("error");
  box.textContent = message || "";
  box.hidden = !message;
}

async function api(method, path) {
  const response = await fetch(path, {
    method,
    headers: { Authorization: "Bearer " + token() },
  });
  let body = null;
  try {
    body = await response.json();
  } catch (_) {
    body = null;
  }
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    route();
    throw new Error("the token was refused");
  }
  if (!body || !body.successful) {
    const first = body && body.errors && body.errors[0];
    throw new Error(first ? first.errorCode + ": " + first.message : "HTTP " + response.status);
  }
  return body.result;
}

function status(s) {
  return el("span", { class: "status " + s, "data-status": s }, s.replaceAll("_", " "));
}

function table(headings, rows) {
  return el(
    "table",
    {},
    el("thead", {}, el("tr", {}, headings.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows)
  );
}

function when(at) {
  return at ? new Date(at).toLocaleString() : "";
}

// Polls `load` every second until it says to stop or the view changes.
function every(load) {
  let live = true;
  const tick = async () => {
    if (!live) return;
    let again = true;
    try {
      again = await load();
      showError("");
    } catch (e) {
      showError(e.message);
    }
    if (live && again !== false) setTimeout(tick, 1000);
  };
  tick();
  return () => {
    live = false;
  };
}

// ---- Turns: a session's turns -------------------------------------------------------------

function turnsView(session) {
  const view = $("view");
  const form = el(
    "form",
    {
      id: "session-form",
      onsubmit: (e) => {
        e.preventDefault();
        location.hash = "#/turns/" + encodeURIComponent($("session").value.trim());
      },
    },
    el("label", { for: "session" }, "Session"),
    el("input", { id: "session", value: session || "", required: "" }),
    el("button", { type: "submit" }, "Show turns")
  );
  const list = el("div", { id: "turns" });
  view.append(el("section", { class: "card" }, el("h2", {}, "Turns of a session"), form, list));
  if (!session) return () => {};
  return every(async () => {
    const s = await api("GET", "/v1/sessions/" + encodeURIComponent(session));
    const rows = (s.turns || []).map((t) =>
      el(
        "tr",
        {},
        el(
          "td",
          {},
          el(
            "a",
            { href: "#/turn/" + encodeURIComponent(session) + "/" + encodeURIComponent(t.turnId) },
            t.turnId
          )
        ),
        el("td", {}, status(t.status))
      )
    );
    list.replaceChildren(
      el("p", { class: "muted" }, "Mode: " + (s.modeKey || "") + " · " + rows.length + " turn(s)"),
      table(["Turn", "Status"], rows)
    );
  });
}

// ---- The turn inspector -------------------------------------------------------------------

// Follows the session's event stream (fetch, so the token goes in a header) and shows the
// turn's text as it is written.
function follow(session, turn, box) {
  const controller = new AbortController();
  (async () => {
    try {
      const response = await fetch("/v1/sessions/" + encodeURIComponent(session) + "/events", {
        headers: { Authorization: "Bearer " + token() },
        signal: controller.signal,
      });
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const frame = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const kind = (frame.match(/^event: ?(.*)$/m) || [])[1];
          const data = (frame.match(/^data: ?(.*)$/m) || [])[1];
          if (!data) continue;
          const event = JSON.parse(data);
          if (event.turnId !== turn) continue;
          if (kind === "delta") box.textContent += event.text;
          if (kind === "progress" && /replaced/.test(event.message)) box.textContent = "";
        }
      }
    } catch (_) {
      // Stopped, or the stream broke: the inspector's polling still shows the result.
    }
  })();
  return () => controller.abort();
}

function inspectorView(session, turn) {
  const view = $("view");
  const head = el("section", { class: "card", id: "inspector" });
  const live = el("pre", { id: "live" });
  const liveCard = el("section", { class: "card" }, el("h2", {}, "Live output"), live);
  const history = el("section", { class: "card", id: "history" });
  const calls = el("section", { class: "card", id: "model-calls" });
  const tools = el("section", { class: "card", id: "tool-calls" });
  const result = el("section", { class: "card", id: "result" });
  const cards = [head, liveCard, history, calls, tools, result];
  // Shown once the turn could be read (not for a turn this token may not see).
  for (const card of cards) card.hidden = true;
  view.append(...cards);
  const unfollow = follow(session, turn, live);
  const path =
    "/v1/sessions/" + encodeURIComponent(session) + "/turns/" + encodeURIComponent(turn);
  const cancel = el(
    "button",
    {
      id: "cancel",
      class: "danger",
      type: "button",
      onclick: async () => {
        cancel.disabled = true;
        try {
          await api("POST", path + "/cancel");
        } catch (e) {
          showError(e.message);
        }
      },
    },
    "Cancel turn"
  );
  const stopPolling = every(async () => {
    const t = await api("GET", path + "/inspect");
    for (const card of cards) card.hidden = false;
    const settled = SETTLED.includes(t.status);
    cancel.disabled = t.status === "completed" || t.status === "failed" || t.status === "cancelled";
    head.replaceChildren(
      el("h2", {}, "Turn ", turn, " ", status(t.status)),
      el(
        "div",
        { class: "facts" },
        el("span", {}, "Session: ", el("a", { href: "#/turns/" + encodeURIComponent(session) }, session)),
        el("span", {}, "Runs: " + t.attempts),
        el("span", {}, "Submitted: " + when(t.submittedAt)),
        t.completedAt ? el("span", {}, "Finished: " + when(t.completedAt)) : null,
        t.serviceTier ? el("span", {}, "Tier: " + t.serviceTier) : null
      ),
      cancel
    );
    history.replaceChildren(
      el("h2", {}, "History"),
      table(
        ["When", "Event", "Run", "Detail"],
        t.history.map((h) =>
          el("tr", {}, el("td", {}, when(h.at)), el("td", {}, h.event.replaceAll("_", " ")),
            el("td", { class: "num" }, h.attempt), el("td", {}, h.detail || ""))
        )
      )
    );
    const cost = (u) => (u.estimatedCostUsd ? "$" + u.estimatedCostUsd.toFixed(6) : "");
    calls.replaceChildren(
      el("h2", {}, "Model calls (" + t.modelCalls.length + ")"),
      table(
        ["Run", "Model", "Context", "Latency", "Input", "Cached", "Output", "Reasoning", "Cost", "Answer"],
        t.modelCalls.map((c) =>
          el(
            "tr",
            { class: "model-call" },
            el("td", { class: "num" }, c.attempt),
            el("td", {}, c.model, c.background ? " (background" + (c.reattached ? ", re-attached" : "") + ")" : ""),
            el("td", {}, c.agentContext, c.serviceTier ? " · tier " + c.serviceTier : ""),
            el("td", { class: "num" }, c.latencyMs + " ms"),
            el("td", { class: "num" }, c.usage.promptTokens),
            el("td", { class: "num" }, c.usage.cachedTokens || 0),
            el("td", { class: "num" }, c.usage.completionTokens),
            el("td", { class: "num" }, c.usage.reasoningTokens || 0),
            el("td", { class: "num" }, cost(c.usage)),
            el("td", {}, c.text ? el("details", {}, el("summary", {}, "text"), el("pre", {}, c.text)) : el("span", { class: "muted" }, "tool calls"))
          )
        )
      ),
      el(
        "details",
        {},
        el("summary", {}, "Requests sent (" + t.requests.length + ")"),
        t.requests.map((r) => el("pre", {}, JSON.stringify(r, null, 2)))
      )
    );
    tools.replaceChildren(
      el("h2", {}, "Server tool calls (" + t.toolCalls.length + ")"),
      table(
        ["Run", "Tool", "Arguments", "Output", "Time"],
        t.toolCalls.map((c) =>
          el(
            "tr",
            { class: "tool-call" },
            el("td", { class: "num" }, c.attempt),
            el("td", {}, c.name, c.replayed ? " (replayed from the ledger)" : ""),
            el("td", {}, el("pre", {}, c.arguments)),
            el("td", {}, c.output ? el("details", {}, el("summary", {}, "output"), el("pre", {}, c.output)) : ""),
            el("td", { class: "num" }, c.executionMs + " ms")
          )
        )
      )
    );
    const r = t.result;
    const answer = r && r.successful && r.result && r.result.primaryOutputText;
    result.replaceChildren(
      el("h2", {}, "Result"),
      !r
        ? el("p", { class: "muted" }, "Not yet.")
        : r.successful
          ? el("pre", { id: "answer" }, answer || JSON.stringify(r.result, null, 2))
          : el("pre", { id: "answer" }, r.errors.map((e) => e.errorCode + ": " + e.message).join("\n"))
    );
    if (answer && t.status === "completed") live.textContent = answer;
    return !settled;
  });
  return () => {
    stopPolling();
    unfollow();
  };
}

// ---- Batches ------------------------------------------------------------------------------

function batchesView(batch) {
  const view = $("view");
  const form = el(
    "form",
    {
      id: "batch-form",
      onsubmit: (e) => {
        e.preventDefault();
        location.hash = "#/batches/" + encodeURIComponent($("batch").value.trim());
      },
    },
    el("label", { for: "batch" }, "Batch"),
    el("input", { id: "batch", value: batch || "", required: "" }),
    el("button", { type: "submit" }, "Show batch")
  );
  const body = el("div", { id: "batch-progress" });
  view.append(el("section", { class: "card" }, el("h2", {}, "A batch"), form, body));
  if (!batch) return () => {};
  const path = "/v1/batches/" + encodeURIComponent(batch);
  const cancel = el(
    "button",
    {
      id: "cancel-batch",
      class: "danger",
      type: "button",
      onclick: async () => {
        cancel.disabled = true;
        try {
          await api("POST", path + "/cancel");
        } catch (e) {
          showError(e.message);
        }
      },
    },
    "Cancel batch"
  );
  const started = Date.now();
  return every(async () => {
    const p = await api("GET", path);
    const total = (p.total || 0) - (p.rejected || 0);
    const done = ["completed", "failed", "cancelled", "expired", "awaitingClientTools"]
      .map((k) => p[k] || 0)
      .reduce((a, b) => a + b, 0);
    const percent = total ? Math.round((100 * done) / total) : 100;
    const rate = done / Math.max(1, (Date.now() - started) / 1000);
    const eta = rate > 0 && done < total ? Math.round((total - done) / rate) + " s" : "";
    cancel.disabled = done >= total;
    body.replaceChildren(
      el("div", { class: "bar", role: "progressbar", "aria-valuenow": percent, id: "bar" },
        el("div", { style: "width: " + percent + "%" })),
      el("p", { id: "percent" }, percent + " % · " + done + " of " + total + " turns settled" + (eta ? " · about " + eta + " left" : "")),
      table(
        ["Queued", "Running", "Completed", "Failed", "Cancelled", "Rejected lines"],
        [el("tr", {}, [p.queued, p.running, p.completed, p.failed, p.cancelled, p.rejected].map((n) => el("td", { class: "num" }, n || 0)))]
      ),
      cancel
    );
    return done < total;
  });
}

// ---- Routing ------------------------------------------------------------------------------

function route() {
  stopView();
  stopView = () => {};
  showError("");
  $("view").replaceChildren();
  const signedIn = Boolean(token());
  $("sign-in").hidden = signedIn;
  $("sign-out").hidden = !signedIn;
  $("who").textContent = signedIn ? "token set for this tab" : "";
  if (!signedIn) return;
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  for (const a of document.querySelectorAll("nav a")) a.classList.remove("here");
  if (parts[0] === "turn" && parts.length >= 3) {
    $("nav-turns").classList.add("here");
    stopView = inspectorView(parts[1], parts[2]);
  } else if (parts[0] === "batches") {
    $("nav-batches").classList.add("here");
    stopView = batchesView(parts[1]);
  } else {
    $("nav-turns").classList.add("here");
    stopView = turnsView(parts[0] === "turns" ? parts[1] : "");
  }
}

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", () => {
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    route();
  });
  $("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    route();
  });
  route();
});
