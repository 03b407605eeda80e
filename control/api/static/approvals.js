// The approvals page: sign-in, decisions through the JSON API, a line diff of edited arguments,
// and live reloads of the cards from the approvals change feed (server-sent events).
"use strict";

const HEADERS = { "Content-Type": "application/json", "X-Requested-With": "approvals-page" };

async function apiError(resp) {
  try { return (await resp.json()).error.message; } catch (e) { return `HTTP ${resp.status}`; }
}

// --- sign-in --------------------------------------------------------------------------
const loginForm = document.getElementById("login");
if (loginForm) {
  loginForm.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const token = document.getElementById("token").value.trim();
    const resp = await fetch("/ui/session", { method: "POST", headers: HEADERS, body: JSON.stringify({ token }) });
    if (resp.ok) { window.location = "/ui/approvals"; return; }
    document.getElementById("login-error").textContent = await apiError(resp);
  });
}

// --- line diff (longest common subsequence of lines) ------------------------------------
function lineDiff(before, after) {
  const a = before.split("\n"), b = after.split("\n");
  const n = a.length, m = b.length;
  const lcs = Array.from({ length: n + 1 }, () => new Array(m + 1).fill(0));
  for (let i = n - 1; i >= 0; i--)
    for (let j = m - 1; j >= 0; j--)
      lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
  const out = [];
  let i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] === b[j]) { out.push([" ", a[i]]); i++; j++; }
    else if (i < n && (j === m || lcs[i + 1][j] >= lcs[i][j + 1])) { out.push(["-", a[i]]); i++; }
    else { out.push(["+", b[j]]); j++; }
  }
  return out;
}

function showDiff(card) {
  const area = card.querySelector(".params"), box = card.querySelector(".diff");
  const err = card.querySelector(".error"), edited = card.querySelector(".approve-edited");
  const original = area.dataset.original;
  card.dataset.dirty = area.value !== original ? "1" : "";
  if (area.value === original) { box.hidden = true; edited.disabled = true; err.textContent = ""; return; }
  try { JSON.parse(area.value); err.textContent = ""; edited.disabled = false; }
  catch (e) { err.textContent = "not JSON: " + e.message; edited.disabled = true; }
  box.replaceChildren(...lineDiff(original, area.value).map(([op, text]) => {
    const line = document.createElement("span");
    line.className = op === "+" ? "add" : op === "-" ? "del" : "same";
    line.textContent = `${op} ${text}`;
    return line;
  }));
  box.hidden = false;
}

// --- times ---------------------------------------------------------------------------------
function ago(epoch) {
  const s = Math.max(0, Math.round(Date.now() / 1000 - epoch));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} days ago`;
}
const withZone = (epoch) => new Date(epoch * 1000).toLocaleString(undefined, { timeZoneName: "short" });
const clock = (epoch) => new Date(epoch * 1000).toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit" });

function showTimes(root) {
  root.querySelectorAll("time.ago").forEach((t) => {
    const e = Number(t.dataset.epoch);
    if (!e) return;
    t.textContent = ago(e);
    t.title = withZone(e);
    t.dateTime = new Date(e * 1000).toISOString();
  });
  root.querySelectorAll("time.deadline").forEach((t) => {
    const e = Number(t.dataset.epoch);
    t.textContent = withZone(e);
    t.dateTime = new Date(e * 1000).toISOString();
  });
}

// --- decisions ----------------------------------------------------------------------------
async function followProgress(card) {
  const line = card.querySelector(".progress");
  line.hidden = false;
  const link = document.createElement("a");
  link.href = `/ui/turns/${encodeURIComponent(card.dataset.turn)}`;
  link.textContent = "transcript";
  for (;;) {
    const resp = await fetch(`/v1/turns/${encodeURIComponent(card.dataset.turn)}`);
    if (!resp.ok) return;
    const t = await resp.json();
    line.replaceChildren(`turn ${t.status}, step ${t.step}, ${t.model_calls} model call(s) · `, link);
    if (t.done || !card.isConnected) return;
    await new Promise((r) => setTimeout(r, 1500));
  }
}

function recordDecision(card, rec) {
  const others = Number(card.dataset.othersPending || 0);
  const you = (document.getElementById("by") || {}).value || "you";
  const when = clock(rec.decided_at || Date.now() / 1000);
  let text;
  if (rec.status === "rejected") text = `rejected by ${you}, ${when}: the model reads the reason`;
  else if (others > 0) text = `approved by ${you}, ${when}; runs when the other ${others === 1 ? "call is" : `${others} calls are`} decided`;
  else text = `approved by ${you}, ${when}; runs now`;
  const record = card.querySelector(".decision");
  record.textContent = text;
  record.hidden = false;
  card.querySelector(".actions").hidden = true;
  card.querySelector(".confirm").hidden = true;
  card.querySelector(".params").readOnly = true;
  card.classList.add("decided", rec.status === "rejected" ? "was-rejected" : "was-approved");
  followProgress(card);
}

async function decide(card, action, body) {
  const err = card.querySelector(".error");
  const by = (document.getElementById("by") || {}).value || undefined;
  if (by) localStorage.setItem("approvals.by", by);
  card.querySelectorAll("button").forEach((b) => (b.disabled = true));
  card.classList.add("deciding");  // kept by refresh() while the answer is on its way
  const url = `/v1/turns/${encodeURIComponent(card.dataset.turn)}/approvals/${encodeURIComponent(card.dataset.call)}/${action}`;
  const resp = await fetch(url, { method: "POST", headers: HEADERS, body: JSON.stringify({ ...body, by }) });
  if (!resp.ok) {
    const message = await apiError(resp);
    card.classList.remove("deciding");
    card.querySelectorAll("button").forEach((b) => (b.disabled = false));
    showDiff(card);
    err.textContent = message;
    return;
  }
  card.dataset.dirty = "";
  recordDecision(card, await resp.json());
  // the other cards of this reply: one pending call fewer
  cards.querySelectorAll(`.card[data-turn="${CSS.escape(card.dataset.turn)}"]:not(.decided)`).forEach((c) => {
    c.dataset.othersPending = String(Math.max(0, Number(c.dataset.othersPending || 0) - 1));
  });
  refresh();
}

function approveAsked(card, body) {
  if (!card.dataset.destructive) return decide(card, "approve", body);
  const box = card.querySelector(".confirm");
  box.hidden = false;
  box.querySelector(".confirm-yes").onclick = () => { box.hidden = true; decide(card, "approve", body); };
  box.querySelector(".confirm-no").onclick = () => { box.hidden = true; };
  box.querySelector(".confirm-no").focus();
}

function wire(card) {
  if (card.dataset.wired) return;
  card.dataset.wired = "1";
  showTimes(card);
  const area = card.querySelector(".params");
  area.addEventListener("input", () => showDiff(card));
  card.querySelector(".approve").addEventListener("click", () => approveAsked(card, {}));
  card.querySelector(".approve-edited").addEventListener("click", () => {
    let params;
    try { params = JSON.parse(area.value); } catch (e) { return showDiff(card); }
    approveAsked(card, { params });
  });
  card.querySelector(".reject").addEventListener("click", () => {
    const reason = card.querySelector(".reason").value.trim();
    if (!reason) { card.querySelector(".error").textContent = "a rejection needs a reason (the model reads it)"; return; }
    decide(card, "reject", { reason });
  });
}

// --- live list -----------------------------------------------------------------------------
const cards = document.getElementById("cards");
let refreshing = null, again = false;

async function refresh() {
  if (refreshing) { again = true; return; }
  refreshing = (async () => {
    const resp = await fetch("/ui/approvals/list", { headers: { "X-Requested-With": "approvals-page" } });
    if (resp.status === 401) { window.location = "/ui/login"; return; }
    if (!resp.ok) return;
    const tpl = document.createElement("template");
    tpl.innerHTML = await resp.text();
    const fresh = new Map([...tpl.content.querySelectorAll(".card")].map((c) => [c.dataset.key, c]));
    for (const old of cards.querySelectorAll(".card")) {
      if (!fresh.has(old.dataset.key) && !old.matches(".decided, .deciding")) old.remove();  // expired, or its turn ended
    }
    for (const [key, card] of fresh) {
      const old = cards.querySelector(`.card[data-key="${CSS.escape(key)}"]`);
      if (old && (old.dataset.dirty || old.matches(".decided, .deciding"))) continue;  // being edited, or decided here
      if (old) old.replaceWith(card); else cards.append(card);
      wire(card);
    }
    const empty = document.getElementById("empty");
    if (fresh.size && empty) empty.remove();
    if (!fresh.size && !empty) cards.insertAdjacentHTML("afterbegin", '<p class="empty" id="empty">No calls wait for approval.</p>');
  })();
  try { await refreshing; } finally {
    refreshing = null;
    if (again) { again = false; refresh(); }
  }
}

if (cards) {
  cards.querySelectorAll(".card").forEach(wire);
  const by = document.getElementById("by");
  by.value = localStorage.getItem("approvals.by") || "";
  const live = document.getElementById("live");
  const feed = new EventSource("/v1/approvals/events");
  feed.addEventListener("ready", () => { live.textContent = "live"; live.classList.add("on"); refresh(); });
  feed.addEventListener("changed", () => refresh());
  feed.onerror = () => { live.textContent = "reconnecting"; live.classList.remove("on"); };
}
