// The turns list and a turn's transcript: relative times, and a running turn followed live over
// its event stream (/v1/turns/{id}/events). The transcript's body is server-rendered and escaped
// (/ui/turns/{id}/body) and reloaded when the turn moves; the model's text as it is written is put
// in with textContent only.
"use strict";

function ago(epoch) {
  const s = Math.max(0, Math.round(Date.now() / 1000 - epoch));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} days ago`;
}

function showTimes(root) {
  root.querySelectorAll("time.ago").forEach((t) => {
    const e = Number(t.dataset.epoch);
    if (!e) return;
    t.textContent = ago(e);
    t.title = new Date(e * 1000).toLocaleString(undefined, { timeZoneName: "short" });
    t.dateTime = new Date(e * 1000).toISOString();
  });
}

showTimes(document);

const transcript = document.getElementById("transcript");
if (transcript) {
  const turn = transcript.dataset.turn;
  const body = document.getElementById("body");
  const streaming = document.getElementById("streaming");
  const live = document.getElementById("live");
  let loading = null, again = false;

  async function reload() {
    if (loading) { again = true; return; }
    loading = (async () => {
      const resp = await fetch(`/ui/turns/${encodeURIComponent(turn)}/body`);
      if (!resp.ok) return;
      const tpl = document.createElement("template");
      tpl.innerHTML = await resp.text();  // server-rendered, every value escaped
      body.replaceChildren(tpl.content);
      showTimes(body);
    })();
    try { await loading; } finally {
      loading = null;
      if (again) { again = false; reload(); }
    }
  }

  const summary = body.querySelector(".summary");
  if (summary && summary.dataset.done) {
    live.textContent = "ended";
  } else {
    const events = new EventSource(`/v1/turns/${encodeURIComponent(turn)}/events`);
    let text = "";
    events.addEventListener("open", () => { live.textContent = "live"; live.classList.add("on"); });
    events.addEventListener("model_delta", (ev) => {
      const d = JSON.parse(ev.data);
      if (d.type !== "text") return;
      text += d.delta;
      streaming.querySelector(".text").textContent = text;
      streaming.hidden = false;
    });
    const moved = () => { text = ""; streaming.hidden = true; reload(); };
    for (const kind of ["model_reply", "model_stream_broken", "call_planned", "call_started", "call_completed", "approval_requested", "approval_decided", "cancel_requested"]) {
      events.addEventListener(kind, moved);
    }
    events.addEventListener("turn_finished", async () => {
      events.close();
      await reload();
      text = "";
      streaming.hidden = true;
      live.textContent = "ended";
      live.classList.remove("on");
    });
    events.onerror = () => { if (live.textContent !== "ended") { live.textContent = "reconnecting"; live.classList.remove("on"); } };
  }
}
