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

