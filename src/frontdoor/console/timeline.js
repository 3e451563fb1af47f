// A turn as a timeline (the inspector's middle): every step of its record in order — runs
// starting and ending, each model call (answered or not, with why; the one streaming now;
// the wait for its agent context's capacity), each server tool call, waits for the client's
// tools — with its start after the turn was accepted, how long it
// took, and a bar on one scale for all of them.
"use strict";

// Whole milliseconds from RFC 3339 time `from` to `to`, truncated as the server truncates a
// call's `startMs` (Date.parse alone drops the digits after the millisecond, which could put
// an event a millisecond after a call that followed it).
function msBetween(from, to) {
  const parts = (stamp) => {
    const m = /\.(\d+)/.exec(stamp);
    return [Date.parse(stamp.replace(/\.\d+/, "")), m ? Number("0." + m[1]) * 1000 : 0];
  };
  const [a, af] = parts(from);
  const [b, bf] = parts(to);
  return Math.max(0, Math.floor(b - a + (bf - af)));
}

// The question a turn asks its client about an MCP call that needs a person's approval.
const APPROVAL_TOOL = "aptix_approve_server_tool";

// JSON text parsed, or null.
function parsed(text) {
  try {
    return JSON.parse(text);
  } catch (_) {
    return null;
  }
}

// A person's answer to an approval question, as a step: which call, approved or why not.
function approvalStep(c) {
  const asked = parsed(c.arguments) || {};
  const verdict = parsed(c.output) || {};
  const approved = verdict.approved === true;
  return { kind: "approval", start: c.startMs, duration: c.executionMs, attempt: c.attempt,
    label: "approval · " + (asked.tool || "?") + (asked.source ? " · MCP " + asked.source : ""),
    detail: approved ? "approved by the client's person; the call runs next"
      : "denied" + (verdict.reason ? ": " + verdict.reason : c.outcome === "tool_error" ? ": " + (c.output || "") : ""),
    args: asked.arguments === undefined ? undefined : JSON.stringify(asked.arguments) };
}

// The steps of inspection `t`, in order of their start (ms after acceptance); `inflight` is
// the model call streaming now, as the live text named it (shown until the record lists it).
function timelineSteps(t, inflight) {
  const t0 = Date.parse(t.submittedAt);
  const at = (stamp) => msBetween(t.submittedAt, stamp);
  const steps = [];
  const history = t.history || [];
  history.forEach((h, i) => {
    steps.push({ kind: "event", start: at(h.at), attempt: h.attempt, label: h.event.replaceAll("_", " "), detail: h.detail || "" });
    if (h.event !== "awaiting_client_tools") return;
    // A wait for the client's tools lasts until the next run starts (or until now).
    const next = history.slice(i + 1).find((n) => n.event === "run_started");
    const open = !next && t.status === "awaiting_client_tools";
    if (!next && !open) return;
    const end = next ? at(next.at) : Date.now() - t0;
    steps.push({ kind: "wait", start: at(h.at), duration: end - at(h.at), open, attempt: h.attempt,
      label: "waiting for the client's tools", detail: open ? "still waiting" : "answered; the next run goes on with the results" });
  });
  const cost = (u) => (u && u.estimatedCostUsd ? " · " + usd(u.estimatedCostUsd) : "");
  for (const c of t.modelCalls || []) {
    if (c.startMs === undefined) continue;
    if (c.capacityWaitMs) {
      steps.push({ kind: "capacity", start: c.startMs, duration: c.capacityWaitMs, attempt: c.attempt,
        label: "waiting for capacity · " + c.agentContext,
        detail: "the agent context's limit on calls at once or per minute held the call back" });
    }
    const tokens = c.usage ? count(c.usage.promptTokens) + " in / " + count(c.usage.completionTokens) + " out" : "";
    steps.push({
      kind: c.error ? "model failed" : "model", start: c.startMs, duration: c.latencyMs, attempt: c.attempt,
      label: "model call · " + c.model + " · " + c.agentContext + (c.background ? " (background" + (c.reattached ? ", re-attached" : "") + ")" : ""),
      detail: c.error || tokens + cost(c.usage) + (c.serviceTier ? " · tier " + c.serviceTier : ""),
      text: c.text,
    });
  }
  for (const c of t.toolCalls || []) {
    if (c.startMs === undefined) continue;
    const client = c.source === "client";
    if (client && c.name === APPROVAL_TOOL) {
      steps.push(approvalStep(c));
      continue;
    }
    const where = c.source && !client ? (c.source.startsWith("openai") ? " · hosted by " : " · MCP ") + c.source : "";
    const notes = [c.outcome && c.outcome !== "answered" ? c.outcome : "", c.repeated ? "repeated after a crash" : "",
      c.replayed ? "replayed from the ledger" : ""].filter(Boolean).join(" · ");
    steps.push({ kind: "tool", start: c.startMs, duration: c.executionMs, attempt: c.attempt,
      label: (client ? "client tool · " : "tool · ") + c.name + where,
      detail: client ? "run by the client, its answer sent with the tool results" + (notes ? " · " + notes : "") : notes,
      args: c.arguments, output: c.output });
  }
  if (t.status === "running") {
    // A run's start is written with its first write, so the run in progress may have no
    // event yet: it began after the latest one (or when its streaming call began).
    const run = t.attempts;
    const started = history.find((h) => h.event === "run_started" && h.attempt === run);
    const listed = (c) => (t.modelCalls || []).some((m) => m.attempt === c.attempt && m.startMs === c.startMs);
    const streaming = inflight && inflight.attempt === run && !listed(inflight) ? inflight : null;
    const latest = history.length ? at(history[history.length - 1].at) : 0;
    const runStart = started ? at(started.at) : streaming && streaming.startMs !== undefined ? streaming.startMs : latest;
    steps.push({ kind: "running", start: runStart, duration: Math.max(0, Date.now() - t0 - runStart), open: true,
      attempt: run, label: "run " + run + " in progress",
      detail: streaming ? "" : "a model call shows here while its text streams (streaming turns), else once it ends" });
    if (streaming) {
      const start = streaming.startMs === undefined ? runStart : streaming.startMs;
      steps.push({ kind: "model in flight", start, duration: Math.max(0, Date.now() - t0 - start), open: true,
        attempt: run, label: "model call · " + streaming.model + " · " + streaming.agentContext,
        detail: "in flight: its answer streams (" + count(streaming.chars) + " characters seen here so far)" });
    }
  }
  // Stable: of one start, events first (a run starts before its first call), then a tool
  // call before a model call (the tools of an answer run before the call that reads them).
  const order = { event: 0, wait: 1, running: 1, approval: 1.5, tool: 2, capacity: 2.5, model: 3, "model failed": 3, "model in flight": 3 };
  return steps
    .map((s, i) => ({ s, i }))
    .sort((a, b) => a.s.start - b.s.start || order[a.s.kind] - order[b.s.kind] || a.i - b.i)
    .map((x) => x.s);
}

// JSON text shown pretty-printed when it is JSON.
function pretty(text) {
  const value = parsed(text);
  return value === null ? text : JSON.stringify(value, null, 2);
}

function timelineCard(card, t, inflight) {
  const steps = timelineSteps(t, inflight);
  const span = Math.max(1, ...steps.map((s) => s.start + (s.duration || 0)));
  const rows = steps.map((s) => {
    const bar = el("div", { class: "span " + s.kind.replaceAll(" ", "-") + (s.open ? " open" : "") });
    bar.style.left = (100 * s.start) / span + "%";
    bar.style.width = s.duration ? Math.max(0.5, (100 * s.duration) / span) + "%" : "2px";
    const more = [];
    if (s.text) more.push(el("details", {}, el("summary", {}, "answer"), el("pre", {}, s.text)));
    if (s.args) more.push(el("details", {}, el("summary", {}, "arguments"), el("pre", {}, pretty(s.args))));
    if (s.output) more.push(el("details", {}, el("summary", {}, "output"), el("pre", {}, pretty(s.output))));
    const kindClass = { model: "model-call", "model failed": "model-call failed-call", "model in flight": "model-call in-flight",
      tool: "tool-call" }[s.kind] || s.kind;
    return el(
      "tr",
      { class: "step " + kindClass, "data-kind": s.kind },
      el("td", { class: "num" }, "+" + millis(s.start)),
      el("td", { class: "num" }, s.duration === undefined ? "" : millis(s.duration) + (s.open ? "…" : "")),
      el("td", { class: "num" }, s.attempt || ""),
      el("td", {}, el("strong", {}, s.label), s.detail ? el("div", { class: s.kind === "model failed" ? "error-text" : "muted small" }, s.detail) : "", more),
      el("td", { class: "lane", "aria-hidden": "true" }, bar)
    );
  });
  card.replaceChildren(
    el("h2", {}, "Timeline (" + steps.length + " steps, " + millis(span) + ")"),
    table(["Start", "Took", "Run", "Step", ""], rows, "The turn's steps in order")
  );
}
