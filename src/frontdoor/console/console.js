// The Aptix console: reads the public HTTP API with the token the person entered (kept in
// this tab's sessionStorage) and shows sessions' turns, one turn in full (the inspector),
// batches and, for admin tokens, the system (charts drawn with the vendored uPlot). Text from
// the API is only ever put in the page as text, never as markup.
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
    // Through the CSSOM: the page's policy refuses style attributes.
    else if (k === "style") node.style.cssText = v;
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

async function api(method, path, json) {
  const headers = { Authorization: "Bearer " + token() };
  if (json !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: json === undefined ? undefined : JSON.stringify(json),
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

// Polls `load` every `period` ms (one second unless given) until it says to stop or the view
// changes.
function every(load, period) {
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
    if (live && again !== false) setTimeout(tick, period || 1000);
  };
  tick();
  return () => {
    live = false;
  };
}

// ---- Sessions are named within their tenant -------------------------------------------------

// A path naming `tenant`'s session (an admin's token reads another tenant's work by naming
// it; without a name, the token's own tenant).
function scoped(path, tenant) {
  return tenant ? path + (path.includes("?") ? "&" : "?") + "tenant=" + encodeURIComponent(tenant) : path;
}

function sessionHref(session, tenant) {
  return "#/turns/" + encodeURIComponent(session) + (tenant ? "/" + encodeURIComponent(tenant) : "");
}

function turnHref(session, turn, tenant) {
  return (
    "#/turn/" + encodeURIComponent(session) + "/" + encodeURIComponent(turn) +
    (tenant ? "/" + encodeURIComponent(tenant) : "")
  );
}

// ---- Turns: a session's turns -------------------------------------------------------------

function turnsView(session, tenant) {
  const view = $("view");
  const form = el(
    "form",
    {
      id: "session-form",
      onsubmit: (e) => {
        e.preventDefault();
        location.hash = sessionHref($("session").value.trim(), $("tenant").value.trim());
      },
    },
    el("label", { for: "session" }, "Session"),
    el("input", { id: "session", value: session || "", required: "" }),
    el("label", { for: "tenant" }, "Tenant"),
    el("input", { id: "tenant", value: tenant || "", placeholder: "this token's" }),
    el("button", { type: "submit" }, "Show turns")
  );
  const list = el("div", { id: "turns" });
  view.append(el("section", { class: "card" }, el("h2", {}, "Turns of a session"), form, list));
  if (!session) return () => {};
  return every(async () => {
    const s = await api("GET", scoped("/v1/sessions/" + encodeURIComponent(session), tenant));
    const rows = (s.turns || []).map((t) =>
      el(
        "tr",
        {},
        el(
          "td",
          {},
          el(
            "a",
            { href: turnHref(session, t.turnId, tenant) },
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
function follow(session, turn, tenant, box) {
  const controller = new AbortController();
  (async () => {
    try {
      const response = await fetch(scoped("/v1/sessions/" + encodeURIComponent(session) + "/events", tenant), {
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

function inspectorView(session, turn, tenant) {
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
  const unfollow = follow(session, turn, tenant, live);
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
          await api("POST", scoped(path + "/cancel", tenant));
        } catch (e) {
          showError(e.message);
        }
      },
    },
    "Cancel turn"
  );
  const stopPolling = every(async () => {
    const t = await api("GET", scoped(path + "/inspect", tenant));
    for (const card of cards) card.hidden = false;
    const settled = SETTLED.includes(t.status);
    cancel.disabled = t.status === "completed" || t.status === "failed" || t.status === "cancelled";
    head.replaceChildren(
      el("h2", {}, "Turn ", turn, " ", status(t.status)),
      el(
        "div",
        { class: "facts" },
        el("span", {}, "Session: ", el("a", { href: sessionHref(session, tenant) }, session)),
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
      t.bodiesWithheld
        ? el("p", { class: "muted", id: "withheld" }, "This tenant's prompts and answers are not kept (keepBodies: false).")
        : "",
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
            el("td", {}, c.name, c.source ? (c.source.startsWith("openai") ? " · hosted by " : " · MCP ") + c.source : "", c.outcome && c.outcome !== "answered" ? " · " + c.outcome : "", c.repeated ? " (repeated after a crash)" : "", c.replayed ? " (replayed from the ledger)" : ""),
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

function settledOf(p) {
  return ["completed", "failed", "cancelled", "expired", "awaitingClientTools"]
    .map((k) => p[k] || 0)
    .reduce((a, b) => a + b, 0);
}

function progressBar(percent, id) {
  return el("div", { class: "bar", role: "progressbar", "aria-valuenow": percent, id: id || null },
    el("div", { style: "width: " + percent + "%" }));
}

function duration(seconds) {
  if (seconds === undefined || seconds === null) return "";
  if (seconds < 90) return Math.round(seconds) + " s";
  if (seconds < 5400) return Math.round(seconds / 60) + " min";
  return (seconds / 3600).toFixed(1) + " h";
}

function batchListView() {
  const list = el("div", { id: "batch-list" });
  $("view").append(el("section", { class: "card" }, el("h2", {}, "Latest batches"), list));
  return every(async () => {
    const batches = await api("GET", "/v1/batches?limit=50");
    if (!batches.length) {
      list.replaceChildren(el("p", { class: "muted" }, "No batches yet."));
      return true;
    }
    list.replaceChildren(
      table(
        ["Batch", "Tenant", "Submitted", "Progress", "Completed", "Failed", "Cancelled", "Open", "Rate", "ETA"],
        batches.map((b) => {
          const p = b.progress;
          const total = (p.total || 0) - (p.rejected || 0);
          const done = settledOf(p);
          const percent = total ? Math.round((100 * done) / total) : 100;
          return el(
            "tr",
            { class: "batch-row", "data-batch": p.batchId },
            el("td", {}, el("a", { href: "#/batches/" + encodeURIComponent(p.batchId) }, p.batchId)),
            el("td", {}, b.tenant),
            el("td", {}, when(b.createdAt)),
            el("td", { class: "wide" }, progressBar(percent), el("span", { class: "muted" }, percent + " %")),
            el("td", { class: "num" }, p.completed || 0),
            el("td", { class: "num" }, p.failed || 0),
            el("td", { class: "num" }, p.cancelled || 0),
            el("td", { class: "num" }, total - done),
            el("td", { class: "num" }, b.settledPerSecond ? b.settledPerSecond.toFixed(1) + "/s" : ""),
            el("td", { class: "num" }, duration(b.etaSeconds))
          );
        })
      )
    );
    return true;
  }, 2000);
}

// The first lines of a batch's results (NDJSON), with links to their turns.
async function batchLines(path, most) {
  const response = await fetch(path + "/results", { headers: { Authorization: "Bearer " + token() } });
  if (!response.ok) throw new Error("HTTP " + response.status + " reading the batch's lines");
  const text = await response.text();
  const lines = text.split("\n").filter((l) => l.trim());
  return { count: lines.length, shown: lines.slice(0, most).map((l) => JSON.parse(l)) };
}

function batchesView(batch) {
  if (!batch) return batchListView();
  const view = $("view");
  const body = el("div", { id: "batch-progress" });
  const lines = el("div", { id: "batch-lines" });
  view.append(
    el("section", { class: "card" }, el("h2", {}, "Batch ", batch), el("p", {}, el("a", { href: "#/batches" }, "All batches")), body),
    el("section", { class: "card" }, el("h2", {}, "Lines"), lines)
  );
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
  let firstDone = null;
  return every(async () => {
    const p = await api("GET", path);
    const total = (p.total || 0) - (p.rejected || 0);
    const done = settledOf(p);
    if (firstDone === null) firstDone = done;
    const percent = total ? Math.round((100 * done) / total) : 100;
    const rate = (done - firstDone) / Math.max(1, (Date.now() - started) / 1000);
    const eta = rate > 0 && done < total ? duration((total - done) / rate) : "";
    cancel.disabled = done >= total;
    body.replaceChildren(
      progressBar(percent, "bar"),
      el("p", { id: "percent" }, percent + " % · " + done + " of " + total + " turns settled" + (eta ? " · about " + eta + " left" : "")),
      table(
        ["Queued", "Running", "Completed", "Failed", "Cancelled", "Rejected lines"],
        [el("tr", {}, [p.queued, p.running, p.completed, p.failed, p.cancelled, p.rejected].map((n) => el("td", { class: "num" }, n || 0)))]
      ),
      cancel
    );
    const most = 200;
    const l = await batchLines(path, most);
    lines.replaceChildren(
      l.count > most ? el("p", { class: "muted" }, "The first " + most + " of " + l.count + " lines.") : "",
      table(
        ["Line", "Custom id", "Turn", "Status"],
        l.shown.map((line) =>
          el(
            "tr",
            { class: "batch-line" },
            el("td", { class: "num" }, line.line),
            el("td", {}, line.customId || ""),
            el("td", {}, line.sessionId
              ? el("a", { href: turnHref(line.sessionId, line.turnId, p.tenant) }, line.turnId)
              : ""),
            el("td", {}, status(line.status))
          )
        )
      )
    );
    return done < total;
  }, 1500);
}

// ---- System (admin tokens) ----------------------------------------------------------------

function chart(target, title, series, unit) {
  const width = Math.max(320, target.clientWidth || 500);
  return new uPlot(
    {
      title,
      width,
      height: 220,
      scales: { x: { time: true } },
      // Points drawn, gaps spanned: a slot without results has no latency, and the first
      // minutes after a start have few points.
      series: [{}].concat(series.map(([label, stroke]) => ({ label, stroke, width: 2, spanGaps: true, points: { show: true, size: 5 } }))),
      axes: [{}, { label: unit, size: 60 }],
    },
    [[], ...series.map(() => [])],
    target
  );
}

function systemView() {
  const view = $("view");
  const charts = el("section", { class: "card charts" });
  const rateBox = el("div", { id: "chart-rate", class: "chart" });
  const latencyBox = el("div", { id: "chart-latency", class: "chart" });
  charts.append(el("h2", {}, "Last five minutes"), el("div", { class: "chart-row" }, rateBox, latencyBox));
  const workers = el("section", { class: "card", id: "workers" });
  const queues = el("section", { class: "card", id: "queues" });
  const contexts = el("section", { class: "card", id: "contexts" });
  const tenants = el("section", { class: "card", id: "tenants" });
  const dead = el("section", { class: "card", id: "dead-letters" });
  view.append(charts, el("div", { class: "two" }, workers, queues), el("div", { class: "two" }, contexts, tenants), dead);
  let rate = null;
  let latency = null;
  // Dead letters are read when the page opens, on Refresh and after a requeue — not on every
  // tick: reading goes through the queue (each job put back at its end before it is taken).
  const loadDead = async () => {
    const letters = await api("GET", "/v1/admin/dead-letters?limit=100");
    const requeue = async (ask) => {
      try {
        const r = await api("POST", "/v1/admin/dead-letters/requeue", ask);
        showError("");
        dead.dataset.requeued = r.requeued;
      } catch (e) {
        showError(e.message);
      }
      await loadDead();
    };
    dead.replaceChildren(
      el("h2", {}, "Dead letters (" + letters.length + (letters.length === 100 ? "+" : "") + ")"),
      el("div", { class: "actions" },
        el("button", { id: "refresh-dead", type: "button", class: "quiet", onclick: () => loadDead().catch((e) => showError(e.message)) }, "Refresh"),
        letters.length
          ? el("button", { id: "requeue-all", type: "button", onclick: () => requeue({ all: true }) }, "Requeue all")
          : ""),
      letters.length ? "" : el("p", { class: "muted" }, "None."),
      letters.length === 100
        ? el("p", { class: "muted" }, "The oldest 100 are shown; the queue's depth is in Queues above.")
        : "",
      letters.length
        ? table(
            ["#", "Turn", "Tenant", "Attempt", "Reason", ""],
            letters.map((d) =>
              el(
                "tr",
                { class: "dead-letter" },
                el("td", { class: "num" }, d.position + 1),
                el("td", {}, d.sessionId
                  ? el("a", { href: turnHref(d.sessionId, d.turnId, d.tenant) }, d.sessionId + " / " + d.turnId)
                  : el("span", { class: "muted" }, "unreadable job (" + d.bytes + " bytes)")),
                el("td", {}, d.tenant || ""),
                el("td", { class: "num" }, d.attempt),
                el("td", {}, d.reason),
                el("td", {}, d.sessionId
                  ? el("button", { type: "button", class: "requeue", onclick: () => requeue({ turns: [{ sessionId: d.sessionId, turnId: d.turnId }] }) }, "Requeue")
                  : "")
              )
            )
          )
        : ""
    );
  };
  loadDead().catch((e) => showError(e.message));
  const stopSystem = every(async () => {
    const s = await api("GET", "/v1/admin/system");
    const points = s.load.points;
    const xs = points.map((p) => p.at);
    if (!rate) {
      rate = chart(rateBox, "Results per second", [["completed", "#1f7a3f"], ["failed", "#b3261e"], ["all", "#2457c5"]], "per s");
      latency = chart(latencyBox, "Latency (ms, bucket upper bound)", [["p50", "#2457c5"], ["p95", "#8a5a00"], ["p99", "#b3261e"]], "ms");
    }
    const per = (k) => points.map((p) => (p[k] || 0) / 5);
    rate.setData([xs, per("completed"), per("failed"), points.map((p) => p.resultsPerSecond)]);
    const ms = (k) => points.map((p) => (p[k] === undefined ? null : p[k]));
    latency.setData([xs, ms("p50Ms"), ms("p95Ms"), ms("p99Ms")]);
    charts.dataset.points = points.filter((p) => p.resultsPerSecond > 0).length;
    workers.replaceChildren(
      el("h2", {}, "Workers (" + s.workers.length + ")"),
      table(["Worker", "Running", "Started", "Seen"],
        s.workers.map((w) => el("tr", { class: "worker" }, el("td", {}, w.worker),
          el("td", { class: "num" }, w.running + " / " + w.concurrency), el("td", {}, when(w.startedAt)),
          el("td", { class: "num" }, (w.lastSeenMs / 1000).toFixed(1) + " s ago"))))
    );
    queues.replaceChildren(
      el("h2", {}, "Queues"),
      table(["Queue", "Holds", "Messages", "Consumers"],
        s.queues.map((q) => el("tr", { class: "queue", "data-role": q.role }, el("td", {}, q.name), el("td", {}, q.role),
          el("td", { class: "num" }, q.messages), el("td", { class: "num" }, q.consumers === undefined ? "" : q.consumers))))
    );
    contexts.replaceChildren(
      el("h2", {}, "Model calls by agent context"),
      table(["Context", "In flight", "Capacity", "Capacity waits"],
        s.load.contexts.map((c) => el("tr", {}, el("td", {}, c.context), el("td", { class: "num" }, c.inFlight),
          el("td", { class: "num" }, c.capacity === undefined ? "unlimited" : c.capacity), el("td", { class: "num" }, c.capacityWaits))))
    );
    tenants.replaceChildren(
      el("h2", {}, "Tenants today"),
      table(["Tenant", "Running turns", "Tokens", "Estimated cost"],
        s.tenants.map((t) => el("tr", {}, el("td", {}, t.tenant), el("td", { class: "num" }, t.runningTurns),
          el("td", { class: "num" }, t.tokensToday), el("td", { class: "num" }, "$" + t.estimatedCostUsdToday.toFixed(4)))))
    );
    return true;
  }, 2000);
  return stopSystem;
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
  if (!signedIn) {
    $("nav-system").hidden = true;
    return;
  }
  showSystemIfAdmin();
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  for (const a of document.querySelectorAll("nav a")) a.classList.remove("here");
  if (parts[0] === "turn" && parts.length >= 3) {
    $("nav-turns").classList.add("here");
    stopView = inspectorView(parts[1], parts[2], parts[3]);
  } else if (parts[0] === "batches") {
    $("nav-batches").classList.add("here");
    stopView = batchesView(parts[1]);
  } else if (parts[0] === "system") {
    $("nav-system").classList.add("here");
    stopView = systemView();
  } else {
    $("nav-turns").classList.add("here");
    stopView = parts[0] === "turns" ? turnsView(parts[1], parts[2]) : turnsView("", "");
  }
}

// The System page is for admin tokens: its link shows when the token may read it.
let adminChecked = null;
async function showSystemIfAdmin() {
  const t = token();
  if (adminChecked === t) return;
  adminChecked = t;
  try {
    const response = await fetch("/v1/admin/system", { headers: { Authorization: "Bearer " + t } });
    $("nav-system").hidden = !response.ok;
  } catch (_) {
    $("nav-system").hidden = true;
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
