// The console's System page (admin tokens): charts, workers, queues, contexts, tenants and
// dead letters.
"use strict";

// ---- System (admin tokens) ----------------------------------------------------------------

function chart(target, title, series, unit) {
  const width = Math.max(320, target.clientWidth || 500);
  return new uPlot(
    {
      title,
      width,
      height: 220,
      scales: { x: { time: true } },
      // The legend names the series (values at the cursor would read "--" without one).
      legend: { live: false },
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
  // Dead letters are read when the page opens, on Refresh, after an action, and when the
  // dead-letter queue's depth (read every tick with the queues) no longer matches what was
  // read — not on every tick: reading goes through the queue (each job put back at its end
  // before it is taken). The card says when it was read.
  let deadRead = null;
  let outcome = "";
  const act = async (what, ask, question) => {
    if (!confirm(question)) return;
    try {
      const r = await api("POST", "/v1/admin/dead-letters/" + what, ask);
      showError("");
      if (what === "requeue") {
        dead.dataset.requeued = r.requeued;
        outcome = "Requeued " + count(r.requeued) + (r.requeued === 1 ? " job" : " jobs") + "." +
          (r.alreadySettled
            ? " " + count(r.alreadySettled) + " of their turns had settled already: the worker sends their status again and does not run them again."
            : r.requeued ? " Their turns run again." : "");
      } else {
        dead.dataset.discarded = r.discarded;
        outcome = "Discarded " + count(r.discarded) + (r.discarded === 1 ? " job" : " jobs") + " for good; their turns stay as they were.";
      }
    } catch (e) {
      showError(e.message);
    }
    await loadDead();
  };
  const loadDead = async () => {
    const letters = await api("GET", "/v1/admin/dead-letters?limit=100");
    deadRead = letters.length;
    const ref = (d) => ({ turns: [{ sessionId: d.sessionId, turnId: d.turnId }] });
    dead.replaceChildren(
      el("div", { class: "card-head" },
        el("h2", {}, "Dead letters (" + count(letters.length) + (letters.length === 100 ? "+" : "") + ")"),
        el("span", { class: "muted small", id: "dead-read" }, "read " + new Date().toLocaleTimeString())),
      el("p", { id: "dead-outcome", role: "status", class: outcome ? "outcome" : "" }, outcome),
      el("div", { class: "actions" },
        el("button", { id: "refresh-dead", type: "button", class: "quiet", onclick: () => loadDead().catch((e) => showError(e.message)) }, "Refresh"),
        letters.length
          ? el("button", { id: "requeue-all", type: "button", onclick: () => act("requeue", { all: true },
              "Requeue all " + count(letters.length) + " dead letters? Turns that have not settled run again; settled ones only have their status sent again.") }, "Requeue all")
          : "",
        letters.length
          ? el("button", { id: "discard-all", type: "button", class: "danger", onclick: () => act("discard", { all: true },
              "Discard all " + count(letters.length) + " dead letters for good?") }, "Discard all")
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
                { class: "dead-letter", "data-session": d.sessionId || "" },
                el("td", { class: "num" }, d.position + 1),
                el("td", {}, d.sessionId
                  ? el("a", { href: turnHref(d.sessionId, d.turnId, d.tenant) }, d.sessionId + " / " + d.turnId)
                  : el("span", { class: "muted" }, "unreadable job (" + count(d.bytes) + " bytes)")),
                el("td", {}, d.tenant || ""),
                el("td", { class: "num" }, d.attempt),
                el("td", {}, d.reason),
                el("td", { class: "row-actions" }, d.sessionId
                  ? [el("button", { type: "button", class: "requeue", onclick: () => act("requeue", ref(d),
                        "Requeue the job of turn " + d.turnId + " (session " + d.sessionId + ")?") }, "Requeue"),
                     el("button", { type: "button", class: "discard danger", onclick: () => act("discard", ref(d),
                        "Discard the job of turn " + d.turnId + " (session " + d.sessionId + ") for good?") }, "Discard")]
                  : "")
              )
            ),
            "Dead letters, oldest first"
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
    // The dead letters read no longer match the queue's depth: read them again.
    const deadQueue = s.queues.find((q) => q.role === "dead");
    if (deadQueue && deadRead !== null && deadRead < 100 && deadQueue.messages !== deadRead) {
      deadRead = null;
      loadDead().catch((e) => showError(e.message));
    }
    queues.replaceChildren(
      el("h2", {}, "Queues"),
      table(["Queue", "Holds", "Messages", "Consumers"],
        s.queues.map((q) => el("tr", { class: "queue", "data-role": q.role }, el("td", {}, q.name), el("td", {}, q.role),
          el("td", { class: "num" }, count(q.messages)), el("td", { class: "num" }, q.consumers === undefined ? "" : q.consumers))))
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
          el("td", { class: "num" }, count(t.tokensToday)), el("td", { class: "num" }, "$" + t.estimatedCostUsdToday.toFixed(4)))))
    );
    return true;
  }, 2000);
  return stopSystem;
}

