// The console's overview of the token's own tenant: today's usage by agent context against
// its quotas, its running and queued turns, and its latest batches. Every tenant's token has
// it (an admin's shows the admin's own tenant; the System page shows every tenant).
"use strict";

// A quota as a bar: how much of `limit` is used (no bar without a limit).
function quota(label, used, limit, show) {
  if (!limit) return el("p", { class: "muted" }, label + ": " + show(used) + " (no limit)");
  const percent = Math.min(100, Math.floor((100 * used) / limit));
  const bar = el("div", { class: "bar", role: "progressbar", "aria-label": label, "aria-valuenow": percent,
    "aria-valuemin": 0, "aria-valuemax": 100 }, el("div", {}));
  bar.firstChild.style.width = percent + "%";
  if (percent >= 90) bar.firstChild.classList.add("seg-failed");
  return el("div", { class: "quota" }, el("p", {}, label + ": " + show(used) + " of " + show(limit) + " (" + percent + " %)"), bar);
}

function overviewView() {
  const usage = el("section", { class: "card", id: "tenant-usage" });
  const running = el("section", { class: "card", id: "tenant-running" });
  const batches = el("section", { class: "card", id: "tenant-batches" });
  $("view").append(usage, el("div", { class: "two" }, running, batches));
  return every(async () => {
    // The usage names the token's tenant; the lists are asked for that tenant by name (an
    // admin's token would otherwise list every tenant's).
    const u = await api("GET", "/v1/tenant/usage");
    const mine = "&tenant=" + encodeURIComponent(u.tenant);
    const [open, latest] = await Promise.all([
      api("GET", "/v1/turns?status=running,queued,awaiting_client_tools&limit=20" + mine),
      api("GET", "/v1/batches?limit=10" + mine),
    ]);
    const contexts = Object.entries(u.byAgentContext || {});
    usage.replaceChildren(
      el("div", { class: "card-head" }, el("h2", {}, "Tenant " + u.tenant + " today"), el("span", { class: "muted small" }, u.day + " (UTC) · resets " + when(u.resetsAt))),
      quota("Tokens", u.tokensUsed, u.tokensPerDay, count),
      quota("Estimated cost", u.estimatedCostUsd || 0, u.costPerDayUsd, (d) => usd(d || 0)),
      u.maxRunningTurns ? quota("Running turns", u.runningTurns || 0, u.maxRunningTurns, count) : "",
      contexts.length
        ? table(["Agent context", "Calls", "Input", "Cached", "Output", "Cost"],
            contexts.map(([name, c]) => el("tr", { class: "context-usage" }, el("td", {}, name), el("td", { class: "num" }, count(c.calls)),
              el("td", { class: "num" }, count(c.inputTokens)), el("td", { class: "num" }, count(c.cachedInputTokens)),
              el("td", { class: "num" }, count(c.outputTokens)), el("td", { class: "num" }, c.estimatedCostUsd ? usd(c.estimatedCostUsd) : ""))),
            "Today's model calls by agent context")
        : el("p", { class: "muted" }, "No model calls today.")
    );
    running.replaceChildren(
      el("h2", {}, "Open turns (" + count(open.turns.length) + (open.next ? "+" : "") + ")"),
      open.turns.length
        ? table(["Turn", "Status", "Accepted"], open.turns.map((t) =>
            el("tr", { class: "run" }, el("td", {}, el("a", { href: turnHref(t.sessionId, t.turnId) }, t.sessionId + " / " + t.turnId)),
              el("td", {}, status(t.status)), el("td", { title: when(t.submittedAt) }, ago(t.submittedAt)))), "Open turns")
        : el("p", { class: "muted" }, "None running, queued or waiting for tools."),
      el("p", {}, el("a", { href: runsHref({}) }, "All turns →"))
    );
    batches.replaceChildren(
      el("h2", {}, "Latest batches"),
      latest.length
        ? table(["Batch", "Progress"], latest.map((b) => {
            const t = tally(b.progress);
            return el("tr", { class: "batch-row" }, el("td", {}, el("a", { href: "#/batches/" + encodeURIComponent(b.progress.batchId) }, b.progress.batchId)),
              el("td", { class: "wide" }, segmentedBar(t), el("span", { class: "muted" }, t.percent + " %")));
          }), "Latest batches")
        : el("p", { class: "muted" }, "No batches yet.")
    );
    return true;
  }, 3000);
}
