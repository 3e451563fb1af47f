// The console's batch pages: the latest batches, and one batch with its lines — a bar in
// segments whose counts add up to the lines submitted, and the lines a page at a time.
"use strict";

// A batch's lines by where they are, in the bar's order. Done: nothing moves them on (a line
// waiting for its client's tools is not done).
const SEGMENTS = [
  ["completed", "completed", true],
  ["failed", "failed", true],
  ["cancelled", "cancelled", true],
  ["expired", "expired", true],
  ["rejected", "rejected", true],
  ["awaitingClientTools", "waiting for client tools", false],
  ["running", "running", false],
  ["queued", "queued", false],
];

// The batch's counts by segment, and what they come to. Lines the front door has not yet
// accepted (a batch still being submitted) are counted as "submitting", so the counts always
// add up to the lines submitted.
function tally(p) {
  const counts = SEGMENTS.map(([key, label, done]) => ({ key, label, done, n: p[key] || 0 }));
  const known = counts.reduce((a, c) => a + c.n, 0);
  if ((p.total || 0) > known) counts.push({ key: "submitting", label: "being submitted", done: false, n: p.total - known });
  const total = Math.max(p.total || 0, known);
  const done = counts.filter((c) => c.done).reduce((a, c) => a + c.n, 0);
  return { counts, total, done, percent: total ? Math.floor((100 * done) / total) : 100 };
}

function segmentedBar(t, id) {
  const bar = el("div", { class: "bar segmented", role: "progressbar", "aria-valuenow": t.percent,
    "aria-valuemin": 0, "aria-valuemax": 100, "aria-label": t.done + " of " + t.total + " lines done", id: id || null });
  for (const c of t.counts) {
    if (!c.n) continue;
    const part = el("div", { class: "seg seg-" + c.key, title: count(c.n) + " " + c.label });
    part.style.width = (100 * c.n) / Math.max(1, t.total) + "%";
    bar.append(part);
  }
  return bar;
}

function legend(t) {
  return el("ul", { class: "legend", "aria-label": "Lines by status" },
    t.counts.filter((c) => c.n).map((c) =>
      el("li", { "data-segment": c.key }, el("span", { class: "swatch seg-" + c.key }), count(c.n) + " " + c.label)));
}

function duration(seconds) {
  if (seconds === undefined || seconds === null) return "";
  return millis(seconds * 1000);
}

function batchListView() {
  const list = el("div", { id: "batch-list" });
  $("view").append(el("section", { class: "card" }, el("h2", {}, "Latest batches"), list));
  return every(async () => {
    const batches = await api("GET", "/v1/batches?limit=50");
    if (!batches.length) {
      list.replaceChildren(el("p", { class: "muted" }, "No batches yet: submit one (POST /v1/batches, aptix batch) and it shows here."));
      return true;
    }
    list.replaceChildren(
      table(
        ["Batch", "Tenant", "Submitted", "Progress", "Lines", "Failed", "Open", "Rate", "ETA"],
        batches.map((b) => {
          const t = tally(b.progress);
          const failed = (b.progress.failed || 0) + (b.progress.rejected || 0);
          return el(
            "tr",
            { class: "batch-row", "data-batch": b.progress.batchId },
            el("td", {}, el("a", { href: "#/batches/" + encodeURIComponent(b.progress.batchId) }, b.progress.batchId)),
            el("td", {}, b.tenant),
            el("td", {}, when(b.createdAt)),
            el("td", { class: "wide" }, segmentedBar(t), el("span", { class: "muted" }, t.percent + " %")),
            el("td", { class: "num" }, count(t.total)),
            el("td", { class: "num" }, count(failed)),
            el("td", { class: "num" }, count(t.total - t.done)),
            el("td", { class: "num" }, b.settledPerSecond ? b.settledPerSecond.toFixed(1) + "/s" : ""),
            el("td", { class: "num" }, duration(b.etaSeconds))
          );
        }),
        "Latest batches"
      )
    );
    return true;
  }, 2000);
}

const LINES_PER_PAGE = 50;

// One page of a batch's result lines (NDJSON), read by itself.
async function batchLines(path, from) {
  const response = await fetch(path + "/results?from=" + from + "&limit=" + LINES_PER_PAGE, {
    headers: { Authorization: "Bearer " + token() },
  });
  if (!response.ok) throw new Error("HTTP " + response.status + " reading the batch's lines");
  const text = await response.text();
  return text.split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l));
}

function lineError(line) {
  const r = line.result;
  if (!r || r.successful) return "";
  return (r.errors || []).map((e) => e.errorCode + ": " + e.message).join("; ");
}

// "Retry failed lines": the server keeps no line's request once it ran, so the operator picks
// the file the batch was made from; its failed and rejected lines go again as a new batch,
// which opens. A batch is retried once: after that the box links to its retry.
function retryBox(batch, path) {
  const outcome = el("p", { role: "status", id: "retry-outcome" });
  const file = el("input", { type: "file", id: "retry-file", accept: ".ndjson,.jsonl,.json,application/x-ndjson" });
  const sendButton = el("button", { type: "button", id: "retry-send" }, "Send the failed lines again");
  const form = el("div", { class: "retry-form", hidden: true },
    el("label", { for: "retry-file" }, "The file batch " + batch + " was made from (its failed and rejected lines are read from it, by line number and custom id)"),
    file, sendButton);
  const open = el("button", { type: "button", id: "retry-open" }, "Retry failed lines");
  open.onclick = () => {
    form.hidden = false;
    file.focus();
  };
  sendButton.onclick = async () => {
    const chosen = file.files && file.files[0];
    if (!chosen) {
      outcome.textContent = "Choose the batch's file first.";
      return;
    }
    sendButton.disabled = true;
    try {
      const r = await send("POST", path + "/retry", await chosen.text(), "application/x-ndjson");
      outcome.replaceChildren("Sent " + count(r.accepted) + " of " + count(r.total) + " failed lines again as batch ",
        el("a", { href: "#/batches/" + encodeURIComponent(r.batchId) }, r.batchId),
        r.errors.length ? " (" + count(r.errors.length) + " still refused)" : "", ".");
      location.hash = "#/batches/" + encodeURIComponent(r.batchId);
    } catch (e) {
      outcome.textContent = "Not sent: " + e.message;
      sendButton.disabled = false;
    }
  };
  // The button goes with the page's other actions; the form and the outcome below them.
  // `update` shows what the batch's progress allows: a link to its retry, or the button while
  // some line failed.
  return {
    button: open,
    panel: el("div", { id: "retry-box" }, form, outcome),
    update(p) {
      if (p.retriedAs) {
        open.hidden = true;
        form.hidden = true;
        const link = el("a", { href: "#/batches/" + encodeURIComponent(p.retriedAs), id: "retried-as" }, p.retriedAs);
        if (!outcome.textContent) outcome.replaceChildren("Its failed lines were sent again as batch ", link, ".");
        return;
      }
      open.hidden = !((p.failed || 0) + (p.rejected || 0));
      // A batch is retried once, so not while a line may still fail.
      open.disabled = (p.queued || 0) + (p.running || 0) > 0;
      open.title = open.disabled ? "Lines are still queued or running: retry once they have settled" : "";
    },
  };
}

function batchesView(batch, query) {
  if (!batch) return batchListView();
  const from = Math.max(0, Number(new URLSearchParams(query || "").get("from")) || 0);
  const view = $("view");
  const body = el("div", { id: "batch-progress" });
  const lines = el("div", { id: "batch-lines" });
  const pager = el("p", { class: "pager" });
  const linesHeading = el("h2", {}, "Lines");
  const path = "/v1/batches/" + encodeURIComponent(batch);
  const retry = retryBox(batch, path);
  const origin = el("p", { id: "retry-of", hidden: true });
  const cancel = el(
    "button",
    {
      id: "cancel-batch",
      class: "danger",
      type: "button",
      onclick: async () => {
        if (!confirm("Cancel every turn of batch " + batch + " that has not finished?")) return;
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
  view.append(
    el("section", { class: "card" }, el("h2", {}, "Batch ", batch),
      el("p", {}, el("a", { href: "#/batches" }, "All batches"), " · ",
        el("a", { href: runsHref({ batch, status: "failed" }), id: "failed-lines" }, "Its failed turns")),
      origin, body, el("div", { class: "actions" }, cancel, retry.button), retry.panel),
    el("section", { class: "card" }, linesHeading, lines, pager)
  );

  const started = Date.now();
  let firstDone = null;
  return every(async () => {
    const p = await api("GET", path);
    const t = tally(p);
    if (firstDone === null) firstDone = t.done;
    const rate = (t.done - firstDone) / Math.max(1, (Date.now() - started) / 1000);
    const eta = rate > 0 && t.done < t.total ? duration((t.total - t.done) / rate) : "";
    cancel.disabled = t.done >= t.total;
    retry.update(p);
    origin.hidden = !p.retryOf;
    origin.replaceChildren(p.retryOf
      ? el("span", {}, "Sends again the failed lines of batch ", el("a", { href: "#/batches/" + encodeURIComponent(p.retryOf) }, p.retryOf))
      : "");
    const last = Math.min(t.total, from + LINES_PER_PAGE);
    linesHeading.textContent = last > from ? "Lines " + count(from + 1) + "–" + count(last) + " of " + count(t.total) : "Lines";
    body.replaceChildren(
      segmentedBar(t, "bar"),
      legend(t),
      el("p", { id: "percent" }, t.percent + " % · " + count(t.done) + " of " + count(t.total) + " lines done" + (eta ? " · about " + eta + " left" : ""))
    );
    const shown = await batchLines(path, from);
    lines.replaceChildren(
      shown.length
        ? table(
            ["Line", "Custom id", "Turn", "Status", "Error"],
            shown.map((line) =>
              el(
                "tr",
                { class: "batch-line", "data-status": line.status },
                el("td", { class: "num" }, line.line),
                el("td", {}, line.customId || ""),
                el("td", {}, line.sessionId
                  ? el("a", { href: turnHref(line.sessionId, line.turnId, p.tenant) }, line.turnId)
                  : ""),
                el("td", {}, status(line.status)),
                el("td", { class: "error-text" }, lineError(line))
              )
            ),
            "The batch's lines"
          )
        : el("p", { class: "muted" }, "No lines on this page.")
    );
    const at = (n) => "#/batches/" + encodeURIComponent(batch) + (n ? "?from=" + n : "");
    pager.replaceChildren(
      from > 0 ? el("a", { href: at(Math.max(0, from - LINES_PER_PAGE)), id: "lines-before" }, "← Lines before") : "",
      from > 0 && from + LINES_PER_PAGE < t.total ? " · " : "",
      from + LINES_PER_PAGE < t.total ? el("a", { href: at(from + LINES_PER_PAGE), id: "lines-after" }, "Lines after →") : ""
    );
    return t.done < t.total;
  }, 1500);
}
