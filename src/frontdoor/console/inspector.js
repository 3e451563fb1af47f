// The console's turn pages: a session's turns, and one turn in full (the inspector).
"use strict";

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
// turn's text as it is written; `onCall` hears of each model call whose text starts to stream
// (its first text names it) and of the text that follows.
function follow(session, turn, tenant, box, onCall) {
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
          if (kind === "delta") {
            box.textContent += event.text;
            onCall(event.call, event.text.length);
          }
          if (kind === "progress" && /replaced/.test(event.message)) box.textContent = "";
        }
      }
    } catch (_) {
      // Stopped, or the stream broke: the inspector's polling still shows the result.
    }
  })();
  return () => controller.abort();
}

// The turn's header: what was asked, whose, where it ran, how it went (`inflight`: the
// model call streaming now, if any).
function turnHead(t, session, tenant, cancel, inflight) {
  const answered = t.modelCalls.filter((c) => !c.error);
  const sum = (k) => answered.reduce((n, c) => n + ((c.usage && c.usage[k]) || 0), 0);
  const took = t.completedAt
    ? millis(Date.parse(t.completedAt) - Date.parse(t.submittedAt))
    : millis(Date.now() - Date.parse(t.submittedAt)) + " so far";
  const streaming = inflight && t.status === "running" ? [inflight.agentContext] : [];
  const contexts = [...new Set(t.modelCalls.map((c) => c.agentContext).concat(streaming))].join(", ");
  const input = t.input || {};
  const files = input.artifacts || [];
  return [
    el("h2", {}, "Turn ", t.turnId, " ", status(t.status)),
    input.instruction
      ? el("blockquote", { id: "instruction" }, input.instruction)
      : el("p", { class: "muted" }, t.bodiesWithheld ? "This tenant's instructions are not kept." : "No instruction kept."),
    files.length
      ? el("p", { class: "muted small", id: "artifacts" }, "Files: " + files.join(", ") +
          (input.artifactCount > files.length ? " and " + count(input.artifactCount - files.length) + " more" : ""))
      : "",
    el(
      "dl",
      { class: "facts" },
      el("div", {}, el("dt", {}, "Tenant"), el("dd", {}, t.tenant)),
      el("div", {}, el("dt", {}, "Session"), el("dd", {}, el("a", { href: sessionHref(session, tenant) }, session))),
      el("div", {}, el("dt", {}, "Agent context"), el("dd", {}, contexts || "not called yet")),
      el("div", {}, el("dt", {}, "Runs"), el("dd", {}, count(t.attempts))),
      el("div", {}, el("dt", {}, "Accepted"), el("dd", { title: t.submittedAt }, when(t.submittedAt))),
      el("div", {}, el("dt", {}, "Took"), el("dd", { id: "took" }, took)),
      el("div", {}, el("dt", {}, "Tokens"), el("dd", { id: "tokens" }, count(sum("promptTokens")) + " in / " + count(sum("completionTokens")) + " out")),
      el("div", {}, el("dt", {}, "Cost"), el("dd", {}, sum("estimatedCostUsd") ? usd(sum("estimatedCostUsd")) : "no prices")),
      t.serviceTier ? el("div", {}, el("dt", {}, "Tier"), el("dd", {}, t.serviceTier)) : ""
    ),
    cancel,
  ];
}

// The calls a turn waiting for its client asks it to run.
function pendingCard(card, t) {
  const r = t.result;
  const calls = t.status === "awaiting_client_tools" && r && r.successful && r.result && r.result.toolCalls;
  card.hidden = !calls;
  if (!calls) return;
  card.replaceChildren(
    el("h2", {}, "Waiting for the client's tools (" + calls.length + ")"),
    table(["Call", "Tool", "Arguments"],
      calls.map((c) => el("tr", { class: "pending-call" }, el("td", {}, c.toolCallId), el("td", {}, c.name),
        el("td", {}, el("pre", {}, pretty(c.argumentsJson))))), "Client tool calls pending")
  );
}

function inspectorView(session, turn, tenant) {
  const view = $("view");
  const head = el("section", { class: "card", id: "inspector" });
  const live = el("pre", { id: "live", "aria-live": "polite" });
  const liveCard = el("section", { class: "card" }, el("h2", {}, "Live output"), live);
  const timeline = el("section", { class: "card", id: "timeline" });
  const pending = el("section", { class: "card", id: "pending" });
  const requests = el("section", { class: "card", id: "requests" });
  const result = el("section", { class: "card", id: "result" });
  const cards = [head, liveCard, timeline, requests, result];
  // Shown once the turn could be read (not for a turn this token may not see).
  for (const card of cards.concat([pending])) card.hidden = true;
  view.append(head, liveCard, pending, timeline, requests, result);
  // The model call streaming now, as its first text named it (until the record lists it).
  let inflight = null;
  let latest = null;
  const unfollow = follow(session, turn, tenant, live, (call, chars) => {
    if (call && !(inflight && inflight.attempt === call.attempt && inflight.startMs === call.startMs)) {
      // A new call (the same one is named again every second for late watchers).
      inflight = Object.assign({}, call, { chars });
      if (latest) timelineCard(timeline, latest, inflight);
    } else if (inflight) {
      inflight.chars += chars;
    }
  });
  const path =
    "/v1/sessions/" + encodeURIComponent(session) + "/turns/" + encodeURIComponent(turn);
  const cancel = el(
    "button",
    {
      id: "cancel",
      class: "danger",
      type: "button",
      onclick: async () => {
        if (!confirm("Cancel turn " + turn + "? Its run stops at its next safe point.")) return;
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
    const over = FINAL.includes(t.status);
    cancel.disabled = over;
    head.replaceChildren(...turnHead(t, session, tenant, cancel, inflight));
    latest = t;
    timelineCard(timeline, t, inflight);
    pendingCard(pending, t);
    requests.replaceChildren(
      el("h2", {}, "Requests sent (" + t.requests.length + ")"),
      t.bodiesWithheld
        ? el("p", { class: "muted", id: "withheld" }, "This tenant's prompts and answers are not kept (keepBodies: false).")
        : t.requests.length ? "" : el("p", { class: "muted" }, "None yet."),
      ...t.requests.map((r, i) => el("details", { class: "request" }, el("summary", {}, "Request " + (i + 1)), el("pre", {}, JSON.stringify(r, null, 2))))
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
    return !over;
  });
  return () => {
    stopPolling();
    unfollow();
  };
}
