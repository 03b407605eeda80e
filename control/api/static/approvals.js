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

// --- decisions ----------------------------------------------------------------------------
async function decide(card, action, body) {
  const err = card.querySelector(".error");
  const by = (document.getElementById("by") || {}).value || undefined;
  if (by) localStorage.setItem("approvals.by", by);
  card.querySelectorAll("button").forEach((b) => (b.disabled = true));
  const url = `/v1/turns/${encodeURIComponent(card.dataset.turn)}/approvals/${encodeURIComponent(card.dataset.call)}/${action}`;
  const resp = await fetch(url, { method: "POST", headers: HEADERS, body: JSON.stringify({ ...body, by }) });
  if (!resp.ok) {
    const message = await apiError(resp);
    card.querySelectorAll("button").forEach((b) => (b.disabled = false));
    showDiff(card);
    err.textContent = message;
    return;
  }
  card.dataset.dirty = "";
  card.classList.add("decided");
  refresh();
}

function wire(card) {
  if (card.dataset.wired) return;
  card.dataset.wired = "1";
  card.querySelectorAll("time[data-deadline]").forEach((t) => {
    t.textContent = new Date(Number(t.dataset.deadline) * 1000).toLocaleString();
  });
  const area = card.querySelector(".params");
  area.addEventListener("input", () => showDiff(card));
  card.querySelector(".approve").addEventListener("click", () => decide(card, "approve", {}));
  card.querySelector(".approve-edited").addEventListener("click", () => {
    let params;
    try { params = JSON.parse(area.value); } catch (e) { return showDiff(card); }
    decide(card, "approve", { params });
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
      if (!fresh.has(old.dataset.key)) old.remove();  // decided, expired, or its turn ended
    }
    for (const [key, card] of fresh) {
      const old = cards.querySelector(`.card[data-key="${CSS.escape(key)}"]`);
      if (old && old.dataset.dirty) continue;  // someone is editing it: keep their edits
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
