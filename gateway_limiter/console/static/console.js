// The console page: plain JavaScript, no framework, nothing fetched from elsewhere.
// Every value from the table goes into the page with textContent, never innerHTML, so a
// URL holding "<script>" shows as text. Writes send the token the operator typed, kept
// in sessionStorage (never a cookie), in an Authorization header: a request another site
// forges carries no such header, so there is nothing for CSRF to ride on.
"use strict";

const PAGE_ROWS = 100;   // rows drawn at a time: 10,000 rows never become 10,000 <tr>s
const LIVE_MS = 1000;    // live numbers are at most this old
const TOKEN_KEY = "gwl-console-token";
const ACTOR_KEY = "gwl-console-actor";

const state = { rows: [], shown: [], page: 0, sort: "configId", desc: false, filter: "" };

function $(selector) { return document.querySelector(selector); }

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function say(text, ok) {
  const m = $("#message");
  m.textContent = text;
  m.className = ok ? "ok" : "error";
}

async function api(method, path, body) {
  const headers = { "Accept": "application/json" };
  if (method !== "GET") {
    headers["Authorization"] = "Bearer " + (sessionStorage.getItem(TOKEN_KEY) || "");
    headers["Content-Type"] = "application/json";
    const actor = sessionStorage.getItem(ACTOR_KEY);
    if (actor) headers["X-Actor"] = actor;
  }
  const response = await fetch(path, {
    method, headers, credentials: "omit", cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) {
    const field = data.field ? " [" + data.field + "]" : "";
    throw new Error(response.status + field + ": " + (data.error || "failed"));
  }
  return data;
}

// --- rules ------------------------------------------------------------------------------

function matches(row, needle) {
  if (!needle) return true;
  return String(row.configId) === needle ||
    [row.interfaceUrl, row.channelType, row.interfaceNo, row.callerKey]
      .some((v) => typeof v === "string" && v.toLowerCase().includes(needle));
}

function compare(a, b) {
  const x = a[state.sort], y = b[state.sort];
  if (x === y) return a.configId - b.configId;
  if (x === null || x === undefined) return 1;
  if (y === null || y === undefined) return -1;
  return (x < y ? -1 : 1) * (state.desc ? -1 : 1);
}

function refilter() {
  const needle = state.filter.trim().toLowerCase();
  state.shown = state.rows.filter((r) => matches(r, needle));
  state.shown.sort(compare);
  const pages = Math.max(1, Math.ceil(state.shown.length / PAGE_ROWS));
  state.page = Math.min(state.page, pages - 1);
  drawRules();
}

function cell(tr, value, cls) { tr.appendChild(el("td", value === null ? "" : value, cls)); }

function drawRules() {
  const body = document.createElement("tbody");
  const first = state.page * PAGE_ROWS;
  for (const row of state.shown.slice(first, first + PAGE_ROWS)) {
    const tr = el("tr", undefined, row.skipped ? "skipped" : "");
    tr.dataset.configId = row.configId;
    cell(tr, row.configId, "num");
    const url = el("td", row.interfaceUrl, "url");
    url.title = row.interfaceUrl === null ? "" : String(row.interfaceUrl);
    tr.appendChild(url);
    const readOnly = document.body.dataset.readOnly === "true";
    const rate = el("td", readOnly ? row.rateLimit : undefined, "num");
    const input = el("input", undefined, "rate");
    if (!readOnly) {  // a read-only console shows values, not inputs
      input.value = row.rateLimit === null ? "" : String(row.rateLimit);
      input.setAttribute("aria-label", "rateLimit of configId " + row.configId);
      input.inputMode = "numeric";
      rate.appendChild(input);
    }
    tr.appendChild(rate);
    cell(tr, row.periodSeconds, "num");
    cell(tr, row.cache, "num");
    cell(tr, row.status, "num");
    cell(tr, row.shadow, "num");
    cell(tr, row.algorithm);
    cell(tr, row.perCaller, "num");
    cell(tr, row.callerKey);
    cell(tr, row.maxConcurrent, "num");
    cell(tr, row.leaseMs, "num");
    cell(tr, row.skipped ? "skipped: " + row.skipped : (row.status === 1 ? "in force" : "disabled"),
      row.skipped ? "skip" : "");
    const actions = el("td");
    const save = el("button", "save", "write save");
    save.type = "button";
    save.addEventListener("click", () => saveRate(row.configId, input.value));
    const flip = el("button", row.status === 1 ? "disable" : "enable", "write flip");
    flip.type = "button";
    flip.addEventListener("click", () => patch(row.configId, { status: row.status === 1 ? 0 : 1 }));
    const more = el("button", "edit…", "write more");
    more.type = "button";
    more.title = "change any column";
    more.addEventListener("click", () => editColumns(row));
    const drop = el("button", "delete", "write drop");
    drop.type = "button";
    drop.addEventListener("click", () => removeRow(row.configId, row.interfaceUrl));
    if (!readOnly) actions.append(save, flip, more, drop);
    tr.appendChild(actions);
    body.appendChild(tr);
  }
  $("#rules tbody").replaceWith(body);
  const pages = Math.max(1, Math.ceil(state.shown.length / PAGE_ROWS));
  $("#page-info").textContent = "page " + (state.page + 1) + " of " + pages;
  $("#rules-count").textContent =
    state.shown.length + " of " + state.rows.length + " rows";
}

async function loadRules() {
  const data = await api("GET", "/api/rules");
  state.rows = data.rows;
  refilter();
  document.body.dataset.rulesLoaded = String(state.rows.length);
}

// What the reload will warn about the rows a write made (a leaseMs it ignores), as
// "; warning: ..." after the write's message; "" when there is nothing to say.
function warned(answer) {
  return (answer.warnings || []).map((w) => "; warning: " + w).join("");
}

// The answer to a PATCH as the message says it: each column changed, before -> after.
async function patch(configId, fields) {
  try {
    const done = await api("PATCH", "/api/rules/" + configId, fields);
    const changed = Object.keys(fields).map((k) =>
      k + " " + JSON.stringify(done.before[k]) + " -> " + JSON.stringify(done.after[k]));
    say("configId " + configId + ": " + changed.join(", ") + warned(done), true);
    await Promise.all([loadRules(), loadAudit()]);
    return true;
  } catch (e) { say(String(e.message), false); return false; }
}

// The columns "edit…" offers, each its own input of its own kind: text stays text (a
// number-like interfaceNo such as "1001" is sent as the text it is), numbers are numbers,
// an empty field is NULL. Only the fields the operator changed are sent.
const EDIT_FIELDS = [
  ["interfaceUrl", "text"], ["channelType", "text"], ["interfaceNo", "text"],
  ["callerKey", "text"], ["rateLimit", "number"], ["periodSeconds", "number"],
  ["cache", "number"], ["status", "choice"], ["shadow", "choice"], ["perCaller", "choice"],
  ["algorithm", "choice"], ["maxPermits", "number"], ["warmupPeriod", "number"],
  ["maxConcurrent", "number"], ["leaseMs", "number"], ["priority", "text"], ["reserve", "text"],
];
const CHOICES = {
  status: ["0", "1"], shadow: ["0", "1"], perCaller: ["0", "1"],
  algorithm: ["token_bucket", "sliding_window", "fixed_window", "warm_up"],
};
let editing = null;

function shownValue(value) { return value === null || value === undefined ? "" : String(value); }

function editInput(name, kind, value) {
  const shown = shownValue(value);
  let input;
  if (kind === "choice") {
    input = el("select");
    const options = CHOICES[name].slice();
    if (!options.includes(shown)) options.unshift(shown);  // what the row holds, however odd
    for (const option of options) {
      const o = el("option", option === "" ? "(null)" : option);
      o.value = option;
      input.appendChild(o);
    }
  } else {
    input = el("input");
    input.type = "text";
    if (kind === "number") input.inputMode = "decimal";
  }
  input.name = name;
  input.value = shown;
  input.dataset.kind = kind;
  input.dataset.shown = shown;
  return input;
}

// The value an edited input stands for; an Error naming the field when it is not one.
function editValue(input) {
  const text = input.value;
  if (text === "") return null;
  if (input.dataset.kind === "text") return text;
  if (input.dataset.kind === "choice" && !/^[0-9]+$/.test(text)) return text;
  const number = Number(text.trim());
  if (text.trim() === "" || !Number.isFinite(number)) {
    throw new Error(input.name + ": " + JSON.stringify(text) + " is not a number");
  }
  return number;
}

function editColumns(row) {
  editing = row;
  $("#edit-title").textContent = "configId " + row.configId;
  $("#edit-message").textContent = "";
  const fields = document.createElement("div");
  fields.id = "edit-fields";
  for (const [name, kind] of EDIT_FIELDS) {
    const label = el("label", name);
    label.appendChild(editInput(name, kind, row[name]));
    fields.appendChild(label);
  }
  $("#edit-fields").replaceWith(fields);
  $("#edit-dialog").showModal();
}

async function saveEdit(event) {
  event.preventDefault();
  if (!editing) return;
  const fields = {};
  try {
    for (const input of $("#edit-fields").querySelectorAll("input, select")) {
      if (input.value !== input.dataset.shown) fields[input.name] = editValue(input);
    }
  } catch (e) { $("#edit-message").textContent = e.message; return; }
  if (Object.keys(fields).length === 0) { $("#edit-dialog").close(); say("nothing changed", true); return; }
  if (await patch(editing.configId, fields)) {
    $("#edit-dialog").close();
    editing = null;
  } else {
    $("#edit-message").textContent = $("#message").textContent;
  }
}

function saveRate(configId, text) {
  const value = text.trim();
  if (!/^[0-9]+$/.test(value)) { say("rateLimit: " + JSON.stringify(value) + " is not a whole number", false); return; }
  patch(configId, { rateLimit: Number(value) });
}

async function removeRow(configId, url) {
  if (!window.confirm("Delete configId " + configId + " (" + url + ")?")) return;
  try {
    await api("DELETE", "/api/rules/" + configId);
    say("deleted configId " + configId, true);
    await Promise.all([loadRules(), loadAudit()]);
  } catch (e) { say(String(e.message), false); }
}

async function addRow(event) {
  event.preventDefault();
  const form = event.target;
  const body = { interfaceUrl: form.interfaceUrl.value, algorithm: form.algorithm.value,
    status: form.status.checked ? 1 : 0 };
  const numbers = { rateLimit: form.rateLimit.value, periodSeconds: form.periodSeconds.value,
    cache: form.cache.value };
  for (const [name, text] of Object.entries(numbers)) {
    if (text.trim() !== "") body[name] = Number(text.trim());
  }
  try {
    const row = await api("POST", "/api/rules", body);
    say("created configId " + row.configId + warned(row), true);
    form.reset();
    await Promise.all([loadRules(), loadAudit()]);
  } catch (e) { say(String(e.message), false); }
}

// --- switch, live, fleet, audit -----------------------------------------------------------

function drawSwitch(s) {
  if (s.source === "etcd" || s.source === "apollo") {
    // a configuration centre: what it holds now, or why it cannot be read
    const state = s.effective === null ? "unknown" : (s.effective ? "on" : "off");
    const held = s.error ? s.error : (s.value === null ? "no key: the switch setting applies"
      : "value " + JSON.stringify(s.value));
    $("#switch-state").textContent = state + " (" + s.source + " " + s.where + ": " + held + ")";
    return;
  }
  $("#switch-state").textContent = (s.effective ? "on" : "off") + " (" +
    (s.source === "database" ? "database row" : "settings default") + ")";
}

async function setSwitch(value) {
  try {
    drawSwitch(await api("PUT", "/api/switch", { enabled: value }));
    say("switch set", true);
    await loadAudit();
  } catch (e) { say(String(e.message), false); }
}

function rate(v) { return v === undefined || v === null ? "" : Number(v).toFixed(1); }

// A span of milliseconds as people read it: 350 ms, 12.5 s, 4 min 05 s, 23 h 59 min, 2 d 03 h.
function span(ms) {
  if (ms === undefined || ms === null) return "";
  if (ms < 1000) return Math.round(ms) + " ms";
  const s = ms / 1000;
  if (s < 60) return (Math.round(s * 10) / 10) + " s";
  const whole = Math.floor(s), two = (n) => String(n).padStart(2, "0");
  if (whole >= 86400) return Math.floor(whole / 86400) + " d " + two(Math.floor(whole % 86400 / 3600)) + " h";
  if (whole >= 3600) return Math.floor(whole / 3600) + " h " + two(Math.floor(whole % 3600 / 60)) + " min";
  return Math.floor(whole / 60) + " min " + two(whole % 60) + " s";
}

// A rate in the row's own units: "5/s", "3 / 86400 s" (whole permits stay whole).
function perPeriod(amount, periodSeconds) {
  const shown = Number.isInteger(amount) ? String(amount) : amount.toFixed(2);
  return periodSeconds === 1 ? shown + "/s" : shown + " / " + periodSeconds + " s";
}

// A bucket's stored permits ("full": no state stored yet); a window's count of its limit;
// nothing where the state is not read (per caller, a closed interface, a failed read).
function storedOrUsed(b, windowed) {
  if (b.error) return "?";
  if (b.rate === 0) return "closed";
  if (b.perCaller) return "";
  if (windowed) return b.used === null || b.used === undefined ? "" : b.used + " / " + b.rate + " used";
  return b.stored === null ? "full" : b.stored;
}

// Calendar quotas: each one's burn-down, the permits used against the even pace line
// (none used at the period's start, the whole quota at its renewal), with the readings
// this page has seen since it opened (per quota and period).
const SVG = "http://www.w3.org/2000/svg";
const BURN_W = 360, BURN_H = 120;
const burnSeen = new Map();

function svg(tag, attributes) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attributes)) node.setAttribute(k, String(v));
  return node;
}

function when(seconds, zone) {
  return new Date(seconds * 1000).toLocaleString("sv-SE", { timeZone: zone }).slice(0, 16) + " " + zone;
}

function burnDown(b, at) {
  const q = b.quota;
  const key = b.configId + " " + q.startsAt;
  const length = q.renewsAt - q.startsAt;
  const seen = burnSeen.get(key) || [];
  if (!seen.length || seen[seen.length - 1][0] < at) seen.push([at, q.used]);
  burnSeen.set(key, seen.slice(-500));
  const x = (t) => Math.max(0, Math.min(1, (t - q.startsAt) / length)) * BURN_W;
  const y = (used) => BURN_H - Math.min(1, used / q.limit) * BURN_H;
  const pace = q.limit * Math.max(0, Math.min(1, (at - q.startsAt) / length));
  const box = el("figure", null, "burn-down");
  box.dataset.url = b.url;
  box.dataset.configId = String(b.configId);
  box.dataset.used = String(q.used);
  box.dataset.limit = String(q.limit);
  box.dataset.pace = pace.toFixed(3);
  const chart = svg("svg", { width: BURN_W, height: BURN_H, viewBox: "0 0 " + BURN_W + " " + BURN_H,
    role: "img", "aria-label": "burn-down of " + b.url });
  chart.appendChild(svg("rect", { x: 0, y: 0, width: BURN_W, height: BURN_H, fill: "#fafafa", stroke: "#ccc" }));
  chart.appendChild(svg("line", { class: "pace", x1: 0, y1: BURN_H, x2: BURN_W, y2: 0,
    stroke: "#888", "stroke-dasharray": "4 3" }));
  chart.appendChild(svg("polyline", { class: "used", fill: "none", stroke: "#1b6e20", "stroke-width": 2,
    points: seen.map(([t, u]) => x(t).toFixed(1) + "," + y(u).toFixed(1)).join(" ") }));
  chart.appendChild(svg("circle", { class: "now", cx: x(at).toFixed(1), cy: y(q.used).toFixed(1), r: 3,
    fill: q.used > pace ? "#b3261e" : "#1b6e20" }));
  box.appendChild(chart);
  const ahead = q.used > pace ? "ahead of the even pace" : "within the even pace";
  box.appendChild(el("figcaption", b.url + " (configId " + b.configId + "): used " + q.used + " of "
    + q.limit + " this " + q.period + (q.pacing ? " (paced)" : "") + ", " + ahead + " ("
    + Math.round(pace) + " by now); renews " + when(q.renewsAt, q.timeZone)));
  return box;
}

async function loadLive() {
  const data = await api("GET", "/api/status");
  drawSwitch(data.switch);
  const tallies = (data.fleet && data.fleet.tallies) || {};
  const body = document.createElement("tbody");
  const quotas = el("div");
  quotas.id = "quotas";
  for (const b of data.buckets) {
    const t = tallies[b.url] || {};
    const tr = el("tr");
    tr.dataset.url = b.url;
    // a channel cap shows its channel, a named caller's row its caller
    const who = b.channelType ? " (channel " + b.channelType + ")"
      : b.callerKey ? " (caller " + b.callerKey + ")" : "";
    cell(tr, b.url + who, "url");
    cell(tr, b.configId, "num");
    cell(tr, b.quota ? b.rate + " / " + b.quota.period
      + (b.quota.pacing ? " paced, burst " + b.quota.pacingBurst : "")
      : b.rate + " / " + b.periodSeconds + " s " + b.algorithm);
    // priority classes: the row's class and its reserve, where it has them
    const classes = (b.priority ? "calls " + b.priority : "")
      + (b.priority && b.reserve ? ", " : "") + (b.reserve ? "reserve " + b.reserve : "");
    if (classes) tr.lastChild.appendChild(el("div", classes, "classes"));
    // After pushback the fleet runs at factor x the row's rate (the lowest any member saw).
    // The limit's own reading wins where there is one (it also knows a hold). Both in the
    // row's units, compared with its rateLimit: a long period is no pushback.
    const factor = t.factor === undefined ? 1 : t.factor;
    const effective = b.effectiveRate === null || b.effectiveRate === undefined
      ? b.rate * factor : b.effectiveRate;
    const held = b.heldMs > 0 ? " (held " + (b.heldMs / 1000).toFixed(1) + " s)" : "";
    const slowed = effective < b.rate * (1 - 1e-9) ? " (pushback)" : "";
    cell(tr, perPeriod(effective, b.periodSeconds) + slowed + held, "num effective");
    cell(tr, rate(t.admitted), "num admitted");
    cell(tr, rate(t.waited), "num waited");
    cell(tr, rate(t.refused), "num refused");
    const windowed = b.algorithm === "fixed_window" || b.algorithm === "sliding_window";
    // a calendar quota: spent when no permit can go now (used up, or paced between permits)
    cell(tr, b.quota ? b.quota.used + " / " + b.quota.limit + " used"
      + (b.condition === "spent" ? " (spent)" : "") : storedOrUsed(b, windowed),
      "num stored");
    cell(tr, windowed ? "" : b.debtMs, "num");
    cell(tr, span(b.nextFreeMs), "num next-free");
    cell(tr, b.quota ? "renews " + when(b.quota.renewsAt, b.quota.timeZone) : span(b.resetMs),
      "num resets");
    if (b.quota) quotas.appendChild(burnDown(b, data.at));
    cell(tr, b.inFlight === null || b.inFlight === undefined ? ""
      : b.inFlight + " / " + b.maxConcurrent, "num in-flight");
    body.appendChild(tr);
  }
  $("#live tbody").replaceWith(body);
  $("#quotas").replaceWith(quotas);
  $("#quotas-section").hidden = !quotas.childElementCount;
  const fleet = document.createElement("tbody");
  const members = (data.fleet && data.fleet.members) || [];
  for (const m of members) {
    const tr = el("tr");
    cell(tr, m.host); cell(tr, m.pid, "num"); cell(tr, m.version); cell(tr, m.seenAgoS, "num");
    fleet.appendChild(tr);
  }
  $("#fleet tbody").replaceWith(fleet);
  $("#fleet-size").textContent = data.fleet && data.fleet.shared
    ? members.length + " live" : "(in-process state: a fleet of one)";
  $("#live-age").textContent = "as of " + new Date(data.at * 1000).toLocaleTimeString();
  document.body.dataset.liveAt = String(data.at);
}

function describeChange(entry) {
  const before = entry.beforeRow || {}, after = entry.afterRow || {};
  if (entry.action === "insert" || entry.action === "delete") {
    const row = entry.action === "insert" ? after : before;
    return (row.interfaceUrl || "") + " rateLimit " + row.rateLimit;
  }
  const keys = new Set([...Object.keys(before), ...Object.keys(after)]);
  return [...keys].filter((k) => JSON.stringify(before[k]) !== JSON.stringify(after[k]))
    .map((k) => k + " " + JSON.stringify(before[k]) + " -> " + JSON.stringify(after[k])).join(", ");
}

async function loadAudit() {
  const data = await api("GET", "/api/audit?limit=50");
  const body = document.createElement("tbody");
  for (const e of data.entries) {
    const tr = el("tr");
    cell(tr, e.changedAt); cell(tr, e.actor); cell(tr, e.source); cell(tr, e.configId, "num");
    cell(tr, e.action); cell(tr, describeChange(e));
    body.appendChild(tr);
  }
  $("#audit tbody").replaceWith(body);
}

// --- wiring -------------------------------------------------------------------------------

function keepField(selector, key) {
  const input = $(selector);
  if (!input) return;
  input.value = sessionStorage.getItem(key) || "";
  input.addEventListener("input", () => sessionStorage.setItem(key, input.value));
}

function start() {
  keepField("#token", TOKEN_KEY);
  keepField("#actor", ACTOR_KEY);
  $("#token-form").addEventListener("submit", (e) => e.preventDefault());
  let pending = 0;
  $("#filter").addEventListener("input", (e) => {
    state.filter = e.target.value;
    state.page = 0;
    window.cancelAnimationFrame(pending);
    pending = window.requestAnimationFrame(refilter);  // one redraw per frame, however fast one types
  });
  $("#prev").addEventListener("click", () => { state.page = Math.max(0, state.page - 1); drawRules(); });
  $("#next").addEventListener("click", () => {
    const pages = Math.max(1, Math.ceil(state.shown.length / PAGE_ROWS));
    state.page = Math.min(pages - 1, state.page + 1);
    drawRules();
  });
  for (const th of document.querySelectorAll("#rules th[data-sort]")) {
    th.addEventListener("click", () => {
      const key = th.dataset.sort;
      state.desc = state.sort === key ? !state.desc : false;
      state.sort = key;
      refilter();
    });
  }
  for (const b of document.querySelectorAll("button[data-switch]")) {
    b.addEventListener("click", () => setSwitch(JSON.parse(b.dataset.switch)));
  }
  $("#add-form").addEventListener("submit", addRow);
  $("#edit-form").addEventListener("submit", saveEdit);
  $("#edit-cancel").addEventListener("click", () => { editing = null; $("#edit-dialog").close(); });
  const fail = (e) => say(String(e.message), false);
  loadRules().catch(fail);
  loadAudit().catch(fail);
  const live = () => loadLive().catch(fail).finally(() => window.setTimeout(live, LIVE_MS));
  live();
  window.setInterval(() => loadAudit().catch(fail), 5000);
}

document.addEventListener("DOMContentLoaded", start);
