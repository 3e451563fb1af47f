// The console's batch pages: the latest batches, and one batch with its lines.
"use strict";

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

