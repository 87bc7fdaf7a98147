// The ops dashboard: every second, the event's books (admin stats), the edge's answer
// counters, the core's metrics and the event's waiting room (settings and figures, shown
// when the room is or was on); the last two minutes drawn on canvases. No libraries.
"use strict";

const $ = (id) => document.getElementById(id);
const WINDOW = 120; // samples kept (one a second)
const COLORS = ["#60a5fa", "#f472b6", "#facc15", "#4ade80", "#fb923c", "#a78bfa", "#22d3ee", "#f87171"];
let poller = null;
let history = [];
let previous = null;

function token() { return sessionStorage.getItem("admin-token") || ""; }

async function admin(path, text = false) {
  const r = await fetch(path, { headers: { Authorization: "Bearer " + token() }, cache: "no-store" });
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  return text ? r.text() : r.json();
}

function metric(text, name) {
  const line = text.split("\n").find((l) => l.startsWith(name + " "));
  return line ? Number(line.split(" ")[1]) : 0;
}

function state(text, cls = "") {
  $("state").textContent = text;
  $("state").className = "state " + cls;
}

async function loadEvents() {
  const list = await admin("/admin/events");
  const events = (list.events || list).slice().sort((a, b) => b.id - a.id);
  const sel = $("event");
  const keep = sel.value;
  sel.innerHTML = events.map((e) => `<option value="${e.id}">#${e.id} ${e.title.replace(/</g, "&lt;")} (${e.status})</option>`).join("");
  const wanted = new URLSearchParams(location.search).get("event") || keep;
  if (wanted && events.some((e) => String(e.id) === wanted)) sel.value = wanted;
}

/** `name{label="x"} n` lines of a labelled counter: { x: n }. */
function labelled(text, name) {
  const out = {};
  for (const line of text.split("\n")) {
    const m = line.match(new RegExp("^" + name + '\\{[a-z]+="([^"]*)"\\} ([0-9.e+]+)$'));
    if (m) out[m[1]] = Number(m[2]);
  }
  return out;
}

async function sample(eventId) {
  const [stats, edge, metrics, room] = await Promise.all([
    admin(`/admin/events/${eventId}/stats`),
    fetch("/edge/stats", { cache: "no-store" }).then((r) => r.json()),
    admin("/metrics", true),
    // The room's panel is extra: a core without it leaves the rest of the dashboard be.
    admin(`/admin/events/${eventId}/waiting-room`).catch(() => null),
  ]);
  const now = Date.now();
  // Rejections by reason: the edge's own ("edge 429 RATE_LIMITED"), then the core's.
  const answers = {};
  for (const [k, v] of Object.entries(edge.rejected || {})) answers["edge " + k] = v;
  for (const [k, v] of Object.entries(labelled(metrics, "stampede_purchase_answers_total"))) answers["core " + k] = v;
  const s = { t: now, stats, answers, room, created: metric(metrics, "stampede_orders_created_total") };
  const rates = { admitted: 0, rejected: 0, byReason: {}, persisted: 0 };
  if (previous) {
    const dt = Math.max(0.2, (now - previous.t) / 1000);
    for (const [k, v] of Object.entries(answers)) {
      const d = Math.max(0, v - (previous.answers[k] || 0)) / dt;
      if (k === "core QUEUED") rates.admitted += d;
      else {
        rates.rejected += d;
        rates.byReason[k] = (rates.byReason[k] || 0) + d;
      }
    }
    rates.persisted = Math.max(0, s.created - previous.created) / dt;
  }
  previous = s;
  s.rates = rates;
  history.push(s);
  if (history.length > WINDOW) history.shift();
  render(s);
}

function fmt(n, digits = 0) {
  return n == null ? "–" : Number(n).toLocaleString(undefined, { maximumFractionDigits: digits });
}

function render(s) {
  const cats = s.stats.categories || [];
  const stock = cats.reduce((a, c) => a + (c.redis_available || 0), 0);
  const orders = cats.reduce((a, c) => a + c.unpaid + c.paid, 0);
  const gap = cats.reduce((a, c) => a + Math.abs(c.gap || 0), 0);
  $("t-stock").textContent = fmt(stock);
  $("t-admit").textContent = fmt(s.rates.admitted);
  $("t-reject").textContent = fmt(s.rates.rejected);
  $("t-queue").textContent = fmt(s.stats.queued_reservations);
  $("t-orders").textContent = fmt(orders);
  $("t-persist").textContent = fmt(s.rates.persisted);
  $("t-lag").textContent = fmt(s.stats.sync_lag_s, 1) + " s";
  $("t-gap").textContent = fmt(gap);
  $("t-gap").className = gap ? "bad" : "";
  $("t-refunds").textContent = fmt(s.stats.refunds_pending);
  $("t-pipeline").textContent = s.stats.pipeline;
  $("books").innerHTML = "<tr><th>category</th><th>total</th><th>Redis</th><th>queued</th><th>unpaid</th><th>paid</th><th>gap</th><th>MySQL remain</th><th>unsynced</th><th>remain gap</th></tr>" +
    cats.map((c) => `<tr><td>${c.name.replace(/</g, "&lt;")}</td><td>${fmt(c.total)}</td><td>${fmt(c.redis_available)}</td><td>${fmt(c.queued)}</td><td>${fmt(c.unpaid)}</td><td>${fmt(c.paid)}</td><td>${fmt(c.gap)}</td><td>${fmt(c.db_remain)}</td><td>${fmt(c.unsynced)}</td><td>${fmt(c.remain_gap)}</td></tr>`).join("");

  const names = cats.map((c) => c.name);
  chart("c-stock", names.map((n, i) => ({ name: n, values: history.map((h) => (h.stats.categories[i] || {}).redis_available || 0) })));
  const reasons = new Set();
  history.forEach((h) => Object.keys(h.rates.byReason).forEach((r) => reasons.add(r)));
  chart("c-answers", [{ name: "admitted", values: history.map((h) => h.rates.admitted) }]
    .concat([...reasons].map((r) => ({ name: r, values: history.map((h) => h.rates.byReason[r] || 0) }))));
  chart("c-queue", [{ name: "reservations", values: history.map((h) => h.stats.queued_reservations) }]);
  chart("c-persist", [{ name: "orders/s", values: history.map((h) => h.rates.persisted) }]);
  chart("c-lag", [
    { name: "lag s", values: history.map((h) => h.stats.sync_lag_s) },
    { name: "unsynced", values: history.map((h) => h.stats.unsynced_stock_log) },
  ]);
  chart("c-gap", names.map((n, i) => ({ name: n, values: history.map((h) => (h.stats.categories[i] || {}).gap || 0) })));
  renderRoom(s.room);
}

/** Whether the event has (or had) a waiting room: on, the hidden path, or figures. */
function roomShown(room) {
  if (!room || !room.waiting_room) return false;
  const w = room.waiting_room, f = room.figures || {};
  return w.enabled || w.require_pass_at_open || f.joined > 0 || f.passes_used > 0 || f.drawn;
}

function renderRoom(room) {
  const shown = roomShown(room);
  $("room").hidden = !shown;
  if (!shown) return;
  const w = room.waiting_room, f = room.figures || {};
  const mode = w.enabled ? "on" : w.require_pass_at_open ? "hidden path" : "off";
  $("r-enabled").textContent = mode;
  $("r-enabled").className = w.enabled ? "on" : w.require_pass_at_open ? "warn" : "";
  $("r-rate").textContent = w.admit_per_s === "auto" ? "auto" : fmt(w.admit_per_s) + "/s";
  $("r-rate-now").textContent = fmt(f.rate_now, 1);
  $("r-joined").textContent = fmt(f.joined);
  $("r-waiting").textContent = fmt(f.waiting);
  $("r-served").textContent = fmt(f.served);
  $("r-out").textContent = fmt(f.passes_out);
  $("r-used").textContent = fmt(f.passes_used);
  $("r-expired").textContent = fmt(f.passes_expired);
  $("r-drawn").textContent = f.drawn == null ? "–" : f.drawn ? "yes" : "not yet";
  // How accurate the waiting estimates were: turns checked against what buyers were told.
  $("r-eta").textContent = f.eta_checked
    ? `${fmt(f.eta_mean_error_s, 1)} / ${fmt(f.eta_mean_abs_error_s, 1)} (${fmt(f.eta_checked)} checked)`
    : "–";
  $("room-settings").textContent = `opens ${fmt(w.opens_before_s)} s before the sale · pass good ${fmt(w.pass_ttl_s)} s · proof of work ${w.challenge_bits ? w.challenge_bits + " bits" : "none"}`;
  const figures = (h) => (h.room && h.room.figures) || {};
  chart("c-room", [
    { name: "waiting", values: history.map((h) => figures(h).waiting || 0) },
    { name: "passes out", values: history.map((h) => figures(h).passes_out || 0) },
    { name: "rate /s", values: history.map((h) => figures(h).rate_now || 0) },
  ]);
}

function chart(id, series) {
  const canvas = $(id);
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = w * dpr; canvas.height = h * dpr;
  const g = canvas.getContext("2d");
  g.scale(dpr, dpr);
  g.clearRect(0, 0, w, h);
  const all = series.flatMap((s) => s.values);
  const lo = Math.min(0, ...all), hi = Math.max(1, ...all);
  const left = 48, bottom = h - 18, top = 8, right = w - 8;
  // The x axis spans what has been collected (30 s at least, two minutes at most).
  const span = Math.max(30, ...series.map((s) => s.values.length));
  const y = (v) => bottom - ((v - lo) / (hi - lo)) * (bottom - top);
  const x = (i) => left + (i / (span - 1)) * (right - left);
  g.strokeStyle = "#334155"; g.fillStyle = "#94a3b8"; g.font = "11px system-ui"; g.lineWidth = 1;
  for (const v of [lo, (lo + hi) / 2, hi]) {
    g.beginPath(); g.moveTo(left, y(v)); g.lineTo(right, y(v)); g.stroke();
    g.fillText(Math.abs(v) >= 1000 ? (v / 1000).toFixed(1) + "k" : (+v.toFixed(1)).toString(), 4, y(v) + 4);
  }
  g.fillText(`−${span} s`, left, h - 4); g.fillText("now", right - 22, h - 4);
  series.forEach((s, k) => {
    g.strokeStyle = COLORS[k % COLORS.length]; g.lineWidth = 2; g.beginPath();
    const offset = span - s.values.length;
    s.values.forEach((v, i) => (i ? g.lineTo(x(i + offset), y(v)) : g.moveTo(x(i + offset), y(v))));
    g.stroke();
    g.fillStyle = COLORS[k % COLORS.length];
    g.fillText(s.name, left + 6 + k * 110, top + 10);
  });
}

async function watch() {
  clearInterval(poller);
  history = []; previous = null;
  const id = $("event").value;
  if (!id) { state("no event to watch", "bad"); return; }
  const tick = async () => {
    try { await sample(id); state(`live · event ${id}`, "live"); }
    catch (e) { state(String(e.message || e), "bad"); }
  };
  await tick();
  poller = setInterval(tick, 1000);
}

$("connect").onsubmit = async (e) => {
  e.preventDefault();
  if ($("token").value) sessionStorage.setItem("admin-token", $("token").value);
  try { await loadEvents(); await watch(); }
  catch (err) { state("admin API refused: " + err.message, "bad"); }
};

if (token()) loadEvents().then(watch).catch((e) => state(String(e.message), "bad"));
