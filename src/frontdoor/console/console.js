// The Aptix console: reads the public HTTP API with the token the person entered (kept in
// this tab's sessionStorage) and shows the latest turns (runs.js, the home page), a session's
// turns and one turn in full (inspector.js), batches (batches.js) and, for admin tokens, the
// system (system.js; charts drawn with the vendored uPlot). This file holds what they share:
// building elements, calling the API, formats, and the routing. Text from the API is only
// ever put in the page as text, never as markup.
"use strict";

const TOKEN_KEY = "aptix-console-token";
// Statuses nothing moves a turn on from (one waiting for its client's tools still moves).
const FINAL = ["completed", "failed", "cancelled"];
let stopView = () => {};

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    // An attribute given as null, undefined or false is left out (`hidden: false`, `id: null`).
    if (v === null || v === undefined || v === false) continue;
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
  return send(method, path, json === undefined ? undefined : JSON.stringify(json), "application/json");
}

// Sends `body` (text, of media type `type`) and answers the InvokeResult's result, or throws
// its first error as "CODE: message".
async function send(method, path, body, type) {
  const headers = { Authorization: "Bearer " + token() };
  if (body !== undefined) headers["Content-Type"] = type;
  const response = await fetch(path, { method, headers, body });
  let answer = null;
  try {
    answer = await response.json();
  } catch (_) {
    answer = null;
  }
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    route();
    throw new Error("the token was refused");
  }
  if (!answer || !answer.successful) {
    const first = answer && answer.errors && answer.errors[0];
    throw new Error(first ? first.errorCode + ": " + first.message : "HTTP " + response.status);
  }
  return answer.result;
}

function status(s) {
  return el("span", { class: "status " + s, "data-status": s }, s.replaceAll("_", " "));
}

// A table; `label` names it for assistive technology. A column whose cells are numbers (the
// first row's say) has its heading set right, over them.
function table(headings, rows, label) {
  const first = rows && rows[0];
  const numeric = first && first.children ? [...first.children].map((td) => td.classList.contains("num")) : [];
  return el(
    "table",
    label ? { "aria-label": label } : {},
    el("thead", {}, el("tr", {}, headings.map((h, i) => el("th", numeric[i] ? { class: "num", scope: "col" } : { scope: "col" }, h)))),
    el("tbody", {}, rows)
  );
}

function when(at) {
  return at ? new Date(at).toLocaleString() : "";
}

// Numbers as a reader expects them: 12,345 tokens, 7.3 s, $0.0123, "3 min ago".
const NUMBER = new Intl.NumberFormat("en-US");
function count(n) {
  return n === undefined || n === null ? "" : NUMBER.format(n);
}

function millis(ms) {
  if (ms === undefined || ms === null) return "";
  if (ms < 1000) return Math.round(ms) + " ms";
  if (ms < 60e3) return (ms / 1000).toFixed(ms < 10e3 ? 2 : 1) + " s";
  if (ms < 3600e3) return (ms / 60e3).toFixed(1) + " min";
  return (ms / 3600e3).toFixed(1) + " h";
}

function usd(dollars) {
  return "$" + (dollars >= 1 ? dollars.toFixed(2) : dollars.toPrecision(3));
}

function ago(at) {
  if (!at) return "";
  const ms = Date.now() - new Date(at).getTime();
  if (ms < 5e3) return "just now";
  return millis(ms).replace(/\.\d+ (s|min|h)$/, " $1") + " ago";
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
  if (parts[0] === "" || parts[0].startsWith("runs")) {
    $("nav-runs").classList.add("here");
    const raw = location.hash.replace(/^#\/?/, "");
    stopView = runsView(raw.includes("?") ? raw.slice(raw.indexOf("?") + 1) : "");
  } else if (parts[0] === "turn" && parts.length >= 3) {
    $("nav-turns").classList.add("here");
    stopView = inspectorView(parts[1], parts[2], parts[3]);
  } else if (parts[0] === "batches") {
    $("nav-batches").classList.add("here");
    const [batch, query] = (parts[1] || "").split("?");
    stopView = batchesView(batch, query);
  } else if (parts[0] === "overview") {
    $("nav-overview").classList.add("here");
    stopView = overviewView();
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

