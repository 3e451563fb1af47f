// The console's home page: the latest turns across sessions and batches (GET /v1/turns),
// filtered, paged, and refreshed while it is open (the newest page only: an older page stays
// as read, so a line does not move under the reader's pointer).
"use strict";

const STATUSES = ["queued", "running", "awaiting_client_tools", "completed", "failed", "cancelled"];
const SINCE = [
  ["", "any time"],
  ["1h", "last hour"],
  ["24h", "last 24 hours"],
  ["7d", "last 7 days"],
];
const SINCE_MS = { "1h": 3600e3, "24h": 86400e3, "7d": 7 * 86400e3 };

// The filters a runs page shows, from the part of its address after "?".
function runsFilters(query) {
  const p = new URLSearchParams(query || "");
  const f = {};
  for (const k of ["status", "since", "tenant", "agentContext", "batch", "q", "after"]) {
    if (p.get(k)) f[k] = p.get(k);
  }
  return f;
}

function runsHref(filters) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(filters)) if (v) p.set(k, v);
  const q = p.toString();
  return "#/runs" + (q ? "?" + q : "");
}

// The API's query for these filters: the relative "since" becomes a time.
function runsQuery(f) {
  const p = new URLSearchParams({ limit: "50" });
  for (const k of ["status", "tenant", "agentContext", "batch", "q", "after"]) if (f[k]) p.set(k, f[k]);
  if (SINCE_MS[f.since]) p.set("since", new Date(Date.now() - SINCE_MS[f.since]).toISOString());
  return "/v1/turns?" + p.toString();
}

function labelled(id, label, field) {
  return el("label", { for: id, class: "field" }, el("span", {}, label), field);
}

function runsForm(f) {
  const select = (id, options, value) =>
    el("select", { id }, options.map(([v, text]) => {
      const o = el("option", { value: v }, text);
      if (v === (value || "")) o.selected = true;
      return o;
    }));
  const input = (id, value, placeholder) =>
    el("input", { id, value: value || "", placeholder: placeholder || "", class: "short" });
  return el(
    "form",
    {
      id: "runs-filters",
      role: "search",
      "aria-label": "Filter turns",
      onsubmit: (e) => {
        e.preventDefault();
        location.hash = runsHref({
          status: $("f-status").value,
          since: $("f-since").value,
          tenant: $("f-tenant").value.trim(),
          agentContext: $("f-context").value.trim(),
          batch: $("f-batch").value.trim(),
          q: $("f-q").value.trim(),
        });
      },
    },
    labelled("f-q", "Session or turn id", input("f-q", f.q, "text in an id")),
    labelled("f-status", "Status", select("f-status", [["", "any"]].concat(STATUSES.map((s) => [s, s.replaceAll("_", " ")])), f.status)),
    labelled("f-since", "Accepted", select("f-since", SINCE, f.since)),
    labelled("f-context", "Agent context", input("f-context", f.agentContext)),
    labelled("f-batch", "Batch", input("f-batch", f.batch)),
    labelled("f-tenant", "Tenant", input("f-tenant", f.tenant, "every one I may see")),
    el("button", { type: "submit" }, "Show"),
    el("a", { href: "#/runs", class: "quiet-link" }, "Clear")
  );
}

function runRow(t) {
  const tokens = t.usage && t.usage.totalTokens;
  const cost = t.usage && t.usage.estimatedCostUsd;
  return el(
    "tr",
    { class: "run", "data-turn": t.turnId, "data-session": t.sessionId },
    el("td", {}, el("a", { href: turnHref(t.sessionId, t.turnId, t.tenant), "aria-label": "Turn " + t.turnId + " of session " + t.sessionId },
      el("span", { class: "muted" }, t.sessionId + " / "), t.turnId),
      t.batchId ? el("div", { class: "muted small" }, "batch ", el("a", { href: "#/batches/" + encodeURIComponent(t.batchId) }, t.batchId)) : ""),
    el("td", {}, t.tenant),
    el("td", {}, status(t.status), t.attempts > 1 ? el("span", { class: "muted small" }, " run " + t.attempts) : ""),
    el("td", { title: when(t.submittedAt) }, ago(t.submittedAt)),
    el("td", { class: "num" }, t.durationMs === undefined ? "" : millis(t.durationMs)),
    el("td", {}, t.agentContext || ""),
    el("td", { class: "num" }, count(t.modelCalls) + (t.toolCalls ? " + " + count(t.toolCalls) + " tools" : "")),
    el("td", { class: "num" }, tokens ? count(tokens) : ""),
    el("td", { class: "num" }, cost ? usd(cost) : ""),
    el("td", { class: "error-text" }, t.error || "")
  );
}

function runsView(query) {
  const f = runsFilters(query);
  const list = el("div", { id: "runs", "aria-live": "polite" });
  const stamp = el("span", { class: "muted small", id: "runs-read" });
  $("view").append(
    el("section", { class: "card" },
      el("div", { class: "card-head" }, el("h2", {}, "Turns"), stamp),
      runsForm(f),
      list)
  );
  const newest = !f.after;
  return every(async () => {
    const page = await api("GET", runsQuery(f));
    stamp.textContent = (newest ? "live · read " : "read ") + new Date().toLocaleTimeString();
    const more = page.next
      ? el("a", { id: "runs-older", href: runsHref(Object.assign({}, f, { after: page.next })) }, "Older turns →")
      : "";
    const back = newest ? "" : el("a", { id: "runs-newest", href: runsHref(Object.assign({}, f, { after: "" })) }, "← Newest");
    list.replaceChildren(
      page.turns.length
        ? table(["Turn", "Tenant", "Status", "Accepted", "Took", "Agent context", "Model calls", "Tokens", "Cost", "Error"],
            page.turns.map(runRow), "Turns, newest first")
        : el("p", { class: "muted", id: "runs-empty" },
            page.next
              ? "None of the latest " + count(page.scanned) + " turns match; look further back with Older turns."
              : Object.keys(f).length ? "No turns match these filters." : "No turns yet: submit one (POST /v1/turns, aptix run, a batch) and it shows here."),
      el("p", { class: "pager" }, back, back && more ? " · " : "", more)
    );
    return newest;
  }, 2000);
}
