// Stampede's buyer app: plain JS, no build step. Routes: #/ (events), #/event/<id>,
// #/order/<order no>. Every call goes through the edge's /api/ with the user's token.
// A train (kind "train") sells journeys: its page picks from/to, its classes show the
// seats free on that journey and a carriage map for it.
// A sale with a waiting room (docs/waiting-room.md) shows the room on its page: join
// (after a proof of work, if the room asks for one), wait your turn, then buy with the
// turn's pass (the Queue-Pass header). Without a room but with require_pass_at_open, the
// buy button takes such a pass first (the hidden path).
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const view = $("#view");
let timers = [];
let clockOffsetMs = 0; // server clock − this browser's clock
let routeGen = 0; // bumped by every route(): work of a page left behind stops

const MESSAGES = {
  UNAUTHORIZED: "Your session has expired. Please log in again.",
  RATE_LIMITED: "Too many tries at once.",
  NOT_OPEN: "The sale is not open right now.",
  SOLD_OUT: "Sold out — every ticket in this category is taken.",
  SOLD_OUT_JOURNEY: "Sold out — no seat of this class is free on the whole journey.",
  LIMIT_REACHED: "You already hold as many tickets as this event allows per person.",
  SEAT_TAKEN: "Someone was faster: a seat you picked is taken. Pick another.",
  DUPLICATE: "This purchase was already submitted.",
  SALE_BUSY: "The sale is very busy. Try again in a moment.",
  OUTCOME_UNKNOWN: "Your purchase was sent but not confirmed yet; asking again…",
  FIRST_TRY_UNKNOWN: "(Your first try was never answered and may still be on its way: press Buy again with exactly the same choice to learn whether it took tickets.)",
  STILL_UNKNOWN: "Your purchase was sent but could not be confirmed. Press Buy again with exactly the same choice to learn its outcome (the same purchase is never taken twice); any other choice is a new purchase.",
  INVALID: "That request was not valid.",
  NOT_FOUND: "Not found.",
  NOT_PAYABLE: "This order can no longer be paid.",
  UNAVAILABLE: "The sale service is not answering. Try again shortly.",
  PAYLOAD_TOO_LARGE: "That request was too large.",
  INTERNAL: "Something went wrong on our side. Try again.",
  QUEUE_REQUIRED: "This sale has a waiting room: you can buy on your turn only, with its pass.",
  CHALLENGE_FAILED: "Your browser's check (proof of work) was not accepted. Please try again.",
};

/** What the provider's page said when it sent the browser back (`?payment=`). */
const PAYMENT_NOTES = {
  paid: "Payment received.",
  refund_pending: "Your payment arrived after this order could no longer be paid (its window had passed, it was cancelled, or it was paid already): it is recorded, to be refunded.",
  declined: "The payment was declined.",
  refused: "The payment was refused.",
  unconfirmed: "The payment was not confirmed. The status below is what the shop holds: if it still says UNPAID, your payment may yet arrive.",
};

function session() {
  return { token: sessionStorage.getItem("token"), user: sessionStorage.getItem("user") };
}

function clearTimers() {
  timers.forEach(clearInterval);
  timers = [];
}

function every(ms, fn) {
  fn();
  timers.push(setInterval(fn, ms));
}

function esc(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function money(cents) {
  return "€ " + (cents / 100).toFixed(2);
}

function toast(text, bad = false) {
  const t = $("#toast");
  t.textContent = text;
  t.className = "toast" + (bad ? " bad" : "");
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (t.hidden = true), 5000);
}

async function api(method, path, body, idempotencyKey, extraHeaders = {}) {
  const headers = { "Content-Type": "application/json", ...extraHeaders };
  const { token } = session();
  if (token) headers.Authorization = "Bearer " + token;
  if (idempotencyKey) headers["Idempotency-Key"] = idempotencyKey;
  let resp;
  try {
    resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    return { status: 0, body: { error: { code: "UNAVAILABLE" } } };
  }
  let data = {};
  try { data = await resp.json(); } catch (e) { /* an empty or non-JSON body */ }
  if (resp.status === 401 && path !== "/api/login") logout(false);
  return { status: resp.status, body: data, retryAfter: Number(resp.headers.get("Retry-After") || 0) };
}

function errorText(r) {
  const code = r.body && r.body.error && r.body.error.code;
  return MESSAGES[code] || (r.body.error && r.body.error.message) || "Unexpected answer " + r.status;
}

function serverNow() {
  return Date.now() + clockOffsetMs;
}

function learnClock(body, sentAt) {
  if (body && body.server_time_ms) {
    const rtt = Date.now() - sentAt;
    clockOffsetMs = body.server_time_ms + rtt / 2 - Date.now();
  }
}

function duration(ms) {
  const s = Math.max(0, Math.ceil(ms / 1000));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  const two = (n) => String(n).padStart(2, "0");
  return (h ? h + ":" + two(m) : m) + ":" + two(sec);
}

function clock(ms) {
  return new Date(ms - clockOffsetMs).toLocaleTimeString();
}

/** The user id in the bearer token "<kid>.<user>.<exp>.<sig>". */
function userId() {
  return (session().token || "").split(".")[1] || "";
}

/** `bits` leading zero bits in a digest. */
function zeroBits(digest, bits) {
  const bytes = new Uint8Array(digest);
  let i = 0;
  for (; bits >= 8; bits -= 8) if (bytes[i++] !== 0) return false;
  return bits === 0 || bytes[i] >> (8 - bits) === 0;
}

/**
 * The proof of work a join carries: a nonce (letters and digits) such that SHA-256 of
 * "<challenge>:<user id>:<event id>:<nonce>" starts with `bits` zero bits. Hashes in
 * batches (crypto.subtle is asynchronous), reporting progress(tried, expected) after
 * each; null when the page was left meanwhile.
 */
async function solveProof(challenge, bits, eventId, progress) {
  const gen = routeGen;
  const prefix = `${challenge}:${userId()}:${eventId}:`;
  const encoder = new TextEncoder();
  const expected = 2 ** bits, batch = 256;
  // A random start: two tabs of one account do not retrace each other's steps.
  const start = Math.floor(Math.random() * 2 ** 40);
  progress(0, expected);
  for (let tried = 0; ; tried += batch) {
    const nonces = Array.from({ length: batch }, (_, k) => (start + tried + k).toString(36));
    const digests = await Promise.all(nonces.map((n) => crypto.subtle.digest("SHA-256", encoder.encode(prefix + n))));
    if (gen !== routeGen) return null;
    const found = digests.findIndex((d) => zeroBits(d, bits));
    if (found >= 0) { progress(tried + found + 1, expected); return nonces[found]; }
    progress(tried + batch, expected);
  }
}

/**
 * The body of POST .../queue: nothing when the room asks for no proof, else a challenge
 * and its solved nonce. { body } or { error } (the failed answer), or null if the page
 * was left.
 */
async function queueProof(eventId, bits, progress) {
  if (!bits) return { body: undefined };
  const ch = await api("GET", `/api/events/${eventId}/queue/challenge`);
  if (ch.status !== 200) return { error: ch };
  const nonce = await solveProof(ch.body.challenge, ch.body.bits, eventId, progress);
  return nonce === null ? null : { body: { challenge: ch.body.challenge, nonce } };
}

function logout(render = true) {
  sessionStorage.removeItem("token");
  sessionStorage.removeItem("user");
  if (render) route();
}

function renderWho() {
  const { user } = session();
  $("#who").innerHTML = user
    ? `Signed in as <b data-testid="user">${esc(user)}</b> <button id="logout">Log out</button>`
    : "";
  const b = $("#logout");
  // Signed out everywhere (the token is void on every edge and core), then forgotten
  // here — forgotten even if the sign-out could not be sent, which the buyer is told.
  if (b) b.onclick = async () => {
    b.disabled = true;
    const r = await api("POST", "/api/logout");
    if (r.status !== 200 && r.status !== 401) {
      toast("Signed out on this device only: the server did not confirm (" + errorText(r) + "). Sign out again later to end your other sessions.", true);
    }
    logout();
  };
}

function loginView() {
  view.innerHTML = `
    <div class="card">
      <h1>Sign in</h1>
      <p class="muted">Sign in to see the sales and buy tickets.</p>
      <form class="login" id="login">
        <label>Username <input name="username" autocomplete="username" required></label>
        <label>Password <input name="password" type="password" autocomplete="current-password" required></label>
        <button class="primary" type="submit">Sign in</button>
        <div id="login-error" class="error" role="alert"></div>
      </form>
    </div>`;
  $("#login").onsubmit = async (e) => {
    e.preventDefault();
    const f = new FormData(e.target);
    const r = await api("POST", "/api/login", { username: f.get("username"), password: f.get("password") });
    if (r.status === 200) {
      sessionStorage.setItem("token", r.body.token);
      sessionStorage.setItem("user", f.get("username"));
      route();
    } else if (r.status === 429) {
      $("#login-error").textContent = `Too many attempts: wait ${r.retryAfter || 1} s.`;
    } else {
      $("#login-error").textContent = r.status === 401 ? "Wrong username or password." : errorText(r);
    }
  };
}

function saleState(ev, now) {
  const start = Date.parse(ev.sale_start), end = Date.parse(ev.sale_end);
  if (ev.status !== "PUBLISHED") return { key: "closed", label: "Sale closed" };
  if (now < start) return { key: "soon", label: "Opens in " + duration(start - now), start };
  if (now >= end) return { key: "closed", label: "Sale ended" };
  return { key: "open", label: "On sale now" };
}

async function listView() {
  const sent = Date.now();
  const r = await api("GET", "/api/events");
  if (r.status !== 200) { view.innerHTML = `<p class="error">${esc(errorText(r))}</p>`; return; }
  learnClock(r.body, sent);
  const events = r.body.events || [];
  view.innerHTML = `<h1>On sale</h1><p class="muted">Times follow the sale's clock.</p>
    <div class="events" data-testid="events">${events.length ? "" : '<p class="muted">No sales right now.</p>'}
    ${events.map((ev) => `
      <a href="#/event/${ev.id}" data-testid="event-${ev.id}"><div class="card">
        <span class="pill" data-state="${ev.id}"></span>
        <h3>${esc(ev.title)}</h3>
        <div class="muted">${esc(ev.venue)} · ${new Date(ev.show_time).toLocaleString()}</div>
      </div></a>`).join("")}</div>`;
  every(500, () => {
    for (const ev of events) {
      const s = saleState(ev, serverNow());
      const pill = $(`[data-state="${ev.id}"]`);
      if (pill) { pill.className = "pill " + s.key; pill.textContent = s.label; }
    }
  });
}

async function eventView(id) {
  const sent = Date.now();
  const r = await api("GET", `/api/events/${id}`);
  if (r.status !== 200) { view.innerHTML = `<p class="error">${esc(errorText(r))}</p>`; return; }
  learnClock(r.body, sent);
  let ev = r.body;
  const train = ev.kind === "train";
  const picked = new Set();
  let chosen = ev.categories[0] && ev.categories[0].id;
  let blockedUntil = 0;
  let busy = false;
  // A train's journey (station indexes) and its classes' availability on it, by id.
  let from = 0, to = train ? ev.stations.length - 1 : 0;
  let onJourney = {};
  // The waiting room: whether this buyer is in line (null: not asked yet), the last
  // status read, the ahead count first seen (the progress bar's start), whether the
  // turn's pass was spent on a purchase; the hidden path's pass.
  let joined = null, joining = false, queue = null, firstAhead = null, passUsed = false;
  let pollTimer = null, pollEvery = 0, polling = false;
  // When the estimate for the current ahead count runs out (the release rate's, blind to
  // a release held back while the tickets left are all spoken for by passes out).
  let etaFor = null, etaUntil = 0;
  let hiddenPass = null;

  view.innerHTML = `
    <div class="card">
      <h1 data-testid="title">${esc(ev.title)}</h1>
      <div class="muted">${esc(ev.venue)} · ${new Date(ev.show_time).toLocaleString()} · up to ${ev.per_user_limit} per person</div>
      <p><span id="pill" class="pill"></span></p>
      <div id="countdown" class="countdown" data-testid="countdown"></div>
      <div id="soldout" class="error" data-testid="soldout" hidden>${train ? "Sold out: no seat is free on this journey." : "Sold out: every ticket of this sale is taken."}</div>
    </div>
    <div id="room" class="card room" data-testid="room" hidden>
      <h2>Waiting room</h2>
      <p id="room-about" class="muted"></p>
      <div class="row" id="join-row">
        <button id="join" class="primary" data-testid="join" disabled>Join the waiting room</button>
        <span id="join-note" class="muted" data-testid="join-note"></span>
      </div>
      <div id="pow" class="pow" data-testid="pow" hidden>
        <progress id="pow-bar" max="1" value="0"></progress> <span id="pow-text" data-testid="pow-text"></span>
      </div>
      <div id="queue" hidden>
        <table class="queue">
          <tr><th>State</th><td><span id="q-state" class="qstate" data-testid="queue-state"></span></td></tr>
          <tr><th>Your position</th><td id="q-position" data-testid="queue-position"></td></tr>
          <tr><th>People ahead of you</th><td id="q-ahead" data-testid="queue-ahead"></td></tr>
          <tr><th>Estimated wait</th><td id="q-eta" data-testid="queue-eta"></td></tr>
        </table>
        <div class="qbar"><progress id="q-bar" data-testid="queue-progress" aria-label="Progress towards your turn"></progress> <span id="q-bar-text" class="muted"></span></div>
        <p id="q-message" class="qmessage" data-testid="queue-message"></p>
        <p id="q-pass" class="qpass" data-testid="queue-pass" hidden></p>
      </div>
      <div id="room-error" class="error" role="alert" data-testid="room-error"></div>
    </div>
    <div class="card">
      ${train ? `<div class="row journey">
        <label>From <select id="from" data-testid="from"></select></label>
        <label>To <select id="to" data-testid="to"></select></label>
      </div>` : ""}
      <table data-testid="categories"><thead><tr><th></th><th>${train ? "Class" : "Category"}</th><th>${train ? "Price of the journey" : "Price"}</th><th>${train ? "Free seats on the journey" : "Availability"}</th></tr></thead>
      <tbody id="cats"></tbody></table>
      <div id="picker"></div>
      <div class="row">
        <button id="buy" class="primary" data-testid="buy" disabled>Buy</button>
        <span id="buy-note" class="muted"></span>
      </div>
      <div id="buy-error" class="error" role="alert" data-testid="buy-error"></div>
    </div>
    <div id="progress" class="card" hidden>
      <div>Your purchase: <span id="pstatus" class="status" data-testid="purchase-status"></span></div>
      <div id="pdetail" class="muted"></div>
    </div>`;

  // A category as the buyer sees it. A train's class: the event's numbers are
  // seat-segments, meaningless to a buyer, so its price, free seats and sold-out come
  // from the journey's availability (unknown until that answers).
  function shown(c) {
    if (!c || !train) return c;
    const a = onJourney[c.id];
    return a ? { ...c, price_cents: a.price_cents, available: a.free, sold_out: a.sold_out }
      : { ...c, price_cents: null, available: null, sold_out: false };
  }
  const category = () => shown(ev.categories.find((c) => c.id === chosen));
  const journeyQuery = () => (train ? `&from=${from}&to=${to}` : "");

  function renderCategories() {
    const cats = ev.categories.map(shown);
    $("#cats").innerHTML = cats.map((c) => `
      <tr>
        <td><input type="radio" name="cat" value="${c.id}" ${c.id === chosen ? "checked" : ""} ${c.sold_out ? "disabled" : ""} aria-label="${esc(c.name)}" data-testid="cat-${c.id}"></td>
        <td>${esc(c.name)}${c.seats && !train ? ' <span class="muted">(seated)</span>' : ""}</td>
        <td data-testid="price-${c.id}">${c.price_cents == null ? "—" : money(c.price_cents)}</td>
        <td data-testid="avail-${c.id}">${c.sold_out ? '<span class="pill out">Sold out</span>' : c.available == null ? "—" : c.available + (train ? " free" : " left")}</td>
      </tr>`).join("");
    for (const input of view.querySelectorAll('input[name="cat"]')) {
      input.onchange = () => { chosen = Number(input.value); picked.clear(); renderPicker(); };
    }
    const allGone = cats.every((c) => c.sold_out);
    $("#soldout").hidden = !allGone;
  }

  // From: every station but the last; To: the stations after From.
  function renderJourney() {
    const options = (first, last, selected) => ev.stations.slice(first, last).map((name, k) =>
      `<option value="${first + k}" ${first + k === selected ? "selected" : ""}>${esc(name)}</option>`).join("");
    $("#from").innerHTML = options(0, -1, from);
    $("#to").innerHTML = options(from + 1, undefined, to);
  }

  let journeyError = null; // the error text the last failed availability ask showed
  async function loadJourney() {
    const [f, t] = [from, to];
    const a = await api("GET", `/api/events/${id}/availability?from=${f}&to=${t}`);
    if (f !== from || t !== to) return; // the journey changed meanwhile
    if (a.status !== 200) {
      onJourney = {};
      journeyError = $("#buy-error").textContent = errorText(a);
      return;
    }
    onJourney = Object.fromEntries(a.body.classes.map((c) => [c.id, c]));
    // A refusal of an earlier ask (429 while the train was being counted) is over now:
    // the refresh every 2 s asks again.
    if (journeyError && $("#buy-error").textContent === journeyError) $("#buy-error").textContent = "";
    journeyError = null;
  }

  async function journeyChanged() {
    from = Number($("#from").value);
    to = Math.max(Number($("#to").value), from + 1);
    renderJourney();
    picked.clear();
    onJourney = {};
    $("#buy-error").textContent = "";
    renderCategories();
    renderPicker();
    await loadJourney();
    renderCategories();
    tick();
  }

  async function renderPicker() {
    const c = category();
    if (!c) return;
    if (!c.seats) {
      const options = Array.from({ length: ev.per_user_limit }, (_, i) => `<option>${i + 1}</option>`).join("");
      $("#picker").innerHTML = `<p><label>Tickets <select id="qty" data-testid="quantity">${options}</select></label></p>`;
      return;
    }
    const journey = journeyQuery();
    const s = await api("GET", `/api/events/${id}/seats?category=${c.id}${journey}`);
    if (chosen !== c.id || journey !== journeyQuery()) return;
    if (s.status !== 200) { $("#picker").innerHTML = `<p class="error">${esc(errorText(s))}</p>`; return; }
    for (const seat of [...picked]) {
      const [row, col] = seat.split(":").map(Number);
      if (s.body.seats[row - 1][col - 1] !== "F") picked.delete(seat);
    }
    const seat = (st, r, ci) => {
      const name = `${r + 1}:${ci + 1}`;
      const cls = picked.has(name) ? "F picked" : st;
      const title = train ? `Carriage ${r + 1}, seat ${ci + 1}` : `Row ${r + 1}, seat ${ci + 1}`;
      return `<button class="seat ${cls}" data-seat="${name}" data-state="${st}" title="${title}" ${st !== "F" ? "disabled" : ""}>${train ? ci + 1 : ""}</button>`;
    };
    $("#picker").innerHTML = train ? `
      <p class="muted">Pick up to ${ev.per_user_limit} seats, or none for the best available.</p>
      <div class="carriages" data-testid="seatmap">
        ${s.body.seats.map((row, r) => `
          <div class="carriage" data-testid="carriage-${r + 1}">
            <span class="carriage-name">Carriage ${r + 1}</span>
            <div class="seatmap" style="grid-template-columns: repeat(${s.body.cols}, 26px)">${[...row].map((st, ci) => seat(st, r, ci)).join("")}</div>
          </div>`).join("")}
      </div>
      <div class="legend"><span><i style="background:#a7f3d0"></i>free on this journey</span><span><i style="background:#9ca3af"></i>taken on part of it</span><span><i style="background:#4f46e5"></i>yours</span></div>` : `
      <p class="muted">Pick up to ${ev.per_user_limit} seats, or none for the best available.</p>
      <div class="seatmap" data-testid="seatmap" style="grid-template-columns: repeat(${s.body.cols}, 26px)">
        ${s.body.seats.map((row, r) => [...row].map((st, ci) => seat(st, r, ci)).join("")).join("")}
      </div>
      <div class="stage">STAGE</div>
      <div class="legend"><span><i style="background:#a7f3d0"></i>free</span><span><i style="background:#fcd34d"></i>held</span><span><i style="background:#9ca3af"></i>sold</span><span><i style="background:#4f46e5"></i>yours</span></div>`;
    for (const b of view.querySelectorAll(".seat.F")) {
      b.onclick = () => {
        const name = b.dataset.seat;
        if (picked.has(name)) picked.delete(name);
        else if (picked.size < ev.per_user_limit) picked.add(name);
        else toast(`Up to ${ev.per_user_limit} seats per person.`);
        b.classList.toggle("picked", picked.has(name));
      };
    }
  }

  function tick() {
    const s = saleState(ev, serverNow());
    $("#pill").className = "pill " + s.key;
    $("#pill").textContent = { soon: "Opens soon", open: "Open", closed: "Closed" }[s.key];
    $("#countdown").textContent = s.key === "soon" ? s.label : s.key === "open" ? "On sale now" : s.label;
    const waitS = Math.ceil((blockedUntil - Date.now()) / 1000);
    const c = category();
    const room = roomOn();
    $("#buy").disabled = s.key !== "open" || busy || waitS > 0 || !c || c.sold_out || (room && !turnPass());
    $("#buy-note").textContent = busy && $("#buy-note").dataset.busy ? $("#buy-note").textContent
      : waitS > 0 ? `Too many tries: you can try again in ${waitS} s.`
      : room && !turnPass() && !passUsed && s.key !== "closed" && !(c && c.sold_out) && !(queue && FINAL.includes(queue.state))
        ? "This sale has a waiting room: buying opens on your turn."
      : s.key === "soon" ? "The button opens when the sale does." : "";
    roomTick(s);
  }

  // ---- The waiting room ----------------------------------------------------------

  const settings = () => ev.waiting_room || null;
  const roomOn = () => !!(settings() && settings().enabled);
  const hiddenPath = () => !!(settings() && !settings().enabled && settings().require_pass_at_open);
  /** The pass of this buyer's turn, while it is good and unspent. */
  const turnPass = () => (queue && queue.state === "your_turn" && queue.pass && !passUsed
    && serverNow() < queue.pass_expires_ms ? queue.pass : null);
  const STATES = { waiting: "Waiting", your_turn: "Your turn", sold_out: "Sold out", closed: "Closed", expired: "Turn expired" };
  const FINAL = ["sold_out", "closed", "expired"];
  /** Whether nothing can change for this buyer any more: a closed sale may reopen within
   * its window (and a turn the close interrupted gets back the time it had left), and a
   * sold-out one gets tickets back when orders are cancelled or left unpaid (the line
   * moves on then). */
  const over = (state) => state === "expired"
    || (state === "closed" && serverNow() >= Date.parse(ev.sale_end));
  /** How often the place is asked for: while sold out, tickets come back seldom — but a
   * turn given then must be seen well within its pass's lifetime. */
  const pollMs = (state) => (state === "sold_out"
    ? Math.min(10_000, Math.max(2_000, settings().pass_ttl_s * 250)) : 2_000);

  function aboutRoom() {
    const r = settings();
    const before = r.opens_before_s >= 120 ? `${Math.round(r.opens_before_s / 60)} minutes` : `${r.opens_before_s} seconds`;
    const pace = r.admit_per_s === "auto" ? "at the pace the sale can take" : `${r.admit_per_s} a second`;
    return `Joining opens ${before} before the sale. At the open, everyone who joined before it gets a place in a random order (a lottery fixed before anyone joined); later joiners go behind them, in the order they arrive. Buyers are let in ${pace}, and only while tickets are left for them. On your turn you have ${duration(r.pass_ttl_s * 1000)} to buy.`;
  }

  function roomTick(s) {
    const on = roomOn();
    $("#room").hidden = !on;
    if (!on) return;
    $("#room-about").textContent = aboutRoom();
    // The join button: from opens_before_s before the sale until it closes.
    const opensAt = Date.parse(ev.sale_start) - settings().opens_before_s * 1000;
    const now = serverNow();
    $("#join-row").hidden = !!joined;
    if (!joined) {
      $("#join").disabled = joining || joined === null || now < opensAt || s.key === "closed";
      $("#join-note").textContent = joining ? "" : s.key === "closed" ? "The sale is closed."
        : now < opensAt ? "Joining opens in " + duration(opensAt - now) + "." : "";
    }
    // The pass's time left.
    const pass = $("#q-pass");
    if (queue && queue.state === "your_turn" && queue.pass_expires_ms && !passUsed) {
      const left = queue.pass_expires_ms - now;
      pass.hidden = false;
      pass.textContent = left > 0
        ? `Your pass is good until ${clock(queue.pass_expires_ms)} (${duration(left)} left): buy before it runs out.`
        : "Your pass has run out.";
    } else {
      pass.hidden = true;
    }
  }

  function showPow(tried, expected) {
    $("#pow").hidden = false;
    $("#pow-bar").max = expected;
    $("#pow-bar").value = Math.min(tried, expected);
    $("#pow-text").textContent = `Checking your browser (a proof of work): ${tried.toLocaleString()} hashes tried, about ${expected.toLocaleString()} expected…`;
  }

  function showQueue(q) {
    queue = q;
    $("#queue").hidden = false;
    const state = $("#q-state");
    state.dataset.state = q.state;
    state.className = "qstate " + q.state;
    state.textContent = STATES[q.state] || q.state;
    const dash = (v) => (v == null ? "—" : v.toLocaleString());
    $("#q-position").textContent = dash(q.position);
    $("#q-ahead").textContent = dash(q.ahead);
    if (q.state === "waiting" && q.eta_s != null && q.ahead !== etaFor) {
      etaFor = q.ahead;
      etaUntil = Date.now() + q.eta_s * 1000;
    }
    $("#q-eta").textContent = q.state === "your_turn" ? "none: it is your turn" : q.state !== "waiting" ? "—"
      : q.eta_s != null && Date.now() > etaUntil + 3000
        ? "longer than estimated: the tickets left are held by buyers on their turn; yours comes if they do not buy"
      : q.eta_s != null ? "about " + duration(q.eta_s * 1000)
      : q.position == null ? "known after the draw, at the open" : "being estimated…";
    // The bar: from the first position seen towards the turn; unknown before the draw.
    const bar = $("#q-bar");
    if (q.state === "waiting" && q.position != null && q.ahead != null) {
      if (firstAhead === null || q.ahead > firstAhead) firstAhead = q.ahead;
      bar.max = firstAhead + 1;
      bar.value = firstAhead - q.ahead;
      $("#q-bar-text").textContent = firstAhead ? `${firstAhead - q.ahead} of the ${firstAhead} ahead of you have had their turn` : "You are next";
    } else if (q.state === "waiting") {
      bar.removeAttribute("value");
      $("#q-bar-text").textContent = "";
    } else if (q.state === "your_turn") {
      bar.max = 1;
      bar.value = 1;
      $("#q-bar-text").textContent = "";
    }
    $(".qbar").hidden = FINAL.includes(q.state);
    const opens = Date.parse(ev.sale_start);
    $("#q-message").textContent = {
      waiting: q.position == null
        ? `You are in. At the open (${new Date(opens).toLocaleTimeString()}) the lottery gives you your place in line; keep this page open.`
        : "You are in line; keep this page open. Buying opens on your turn.",
      your_turn: passUsed ? "Your pass was used for your purchase below." : "It is your turn: pick your tickets and buy.",
      sold_out: "Sold out for now — every ticket of this sale is taken. Tickets of orders cancelled or left unpaid come back to the line: keep this page open and your turn comes if enough do.",
      closed: over("closed") ? "The sale has ended: the waiting room is over."
        : "The sale is closed. If it reopens, you keep your place in line, and a turn that was running keeps the time it had left.",
      expired: "Your turn came and your pass ran out unused: the turn went to the next in line.",
    }[q.state] || "";
    if (over(q.state)) stopPolling();
    else if (pollTimer) startPolling(pollMs(q.state));
    tick();
  }

  async function poll(force = false) {
    if (polling) return;
    polling = true;
    const gen = routeGen;
    const q = await api("GET", `/api/events/${id}/queue`);
    polling = false;
    if (gen !== routeGen || !(pollTimer || force)) return;
    if (q.status === 200) {
      $("#room-error").textContent = "";
      showQueue(q.body);
    } else if (q.status === 404) {
      // The room was turned off, or this buyer is no longer in it.
      stopPolling();
      joined = false;
      queue = null;
      $("#queue").hidden = true;
      tick();
    } else {
      $("#room-error").textContent = errorText(q); // passing trouble: the polls go on
    }
  }

  function startPolling(every = 2_000) {
    if (pollTimer && pollEvery === every) return;
    stopPolling();
    pollEvery = every;
    pollTimer = setInterval(poll, every);
    timers.push(pollTimer);
  }

  function stopPolling() {
    clearInterval(pollTimer);
    pollTimer = null;
  }

  /** Whether this buyer is in line already (back on the page): then follows it. */
  let checking = false;
  async function checkRoom() {
    if (!roomOn() || joined !== null || checking) return;
    checking = true;
    const q = await api("GET", `/api/events/${id}/queue`);
    checking = false;
    if (joined !== null) return;
    if (q.status === 200) {
      joined = true;
      showQueue(q.body);
      if (!over(q.body.state)) startPolling(pollMs(q.body.state));
    } else if (q.status === 404) {
      joined = false;
    } else {
      $("#room-error").textContent = errorText(q);
      joined = false;
    }
    tick();
  }

  $("#join").onclick = async () => {
    joining = true; tick();
    $("#room-error").textContent = "";
    const proof = await queueProof(id, settings().challenge_bits, showPow);
    if (proof === null) return; // the page was left
    let r = proof.error;
    if (!r) {
      $("#pow-text").textContent = proof.body ? "Browser checked. Joining…" : "Joining…";
      r = await api("POST", `/api/events/${id}/queue`, proof.body);
    }
    joining = false;
    if (r.status === 200) {
      $("#pow").hidden = true;
      joined = true;
      showQueue(r.body);
      if (!over(r.body.state)) startPolling(pollMs(r.body.state));
    } else {
      $("#pow").hidden = true;
      $("#room-error").textContent = r.status === 429 ? `Too many tries: wait ${r.retryAfter || 1} s.` : errorText(r);
    }
    tick();
  };

  /** The hidden path: a fresh pass from POST .../queue (after the proof, if asked). */
  async function takeHiddenPass() {
    if (hiddenPass && serverNow() < hiddenPass.expires - 2000) return hiddenPass.pass;
    hiddenPass = null;
    const note = $("#buy-note");
    note.dataset.busy = "1";
    const proof = await queueProof(id, settings().challenge_bits, (tried, expected) => {
      note.textContent = `Checking your browser: ${tried.toLocaleString()} of about ${expected.toLocaleString()} hashes…`;
    });
    delete note.dataset.busy;
    if (proof === null) return null;
    const r = proof.error || await api("POST", `/api/events/${id}/queue`, proof.body);
    if (r.status === 200 && r.body.pass) {
      hiddenPass = { pass: r.body.pass, expires: r.body.pass_expires_ms };
      return hiddenPass.pass;
    }
    $("#buy-error").textContent = errorText(r);
    return null;
  }

  async function refresh() {
    const sent = Date.now();
    const again = await api("GET", `/api/events/${id}`);
    if (again.status === 200) {
      learnClock(again.body, sent);
      ev = again.body;
    }
    if (train) await loadJourney();
    if (again.status === 200 || train) renderCategories();
    checkRoom(); // a room turned on meanwhile
  }

  /** What the buyer's status says once it names an order. */
  const ORDER_SAYS = {
    CREATED: "pay it before the deadline to keep your tickets.",
    PAID: "paid.",
    CANCELLED: "cancelled.",
  };

  // Every 0.5 s for two minutes, then every 5 s while this page is shown: a purchase
  // waits for MySQL as long as MySQL is away, then becomes an order or fails, and the
  // page must not stop on "held" meanwhile. It asks for this purchase's status (`rid`,
  // its 202's request id, the number its order will have), not the buyer's latest in
  // the event, which a later purchase of theirs replaces.
  let following = 0; // the latest purchase followed: an earlier one's loop stops
  async function follow(rid) {
    $("#progress").hidden = false;
    const gen = routeGen, mine = ++following;
    const current = () => gen === routeGen && mine === following;
    for (let i = 0; current(); i++) {
      const st = await api("GET", `/api/events/${id}/orders/status?request_id=${encodeURIComponent(rid)}`);
      if (!current() || st.status === 401) return; // signed out: the page says so
      const slow = i >= 240;
      if (st.status === 200) {
        const b = st.body;
        $("#pstatus").className = "status " + b.status;
        $("#pstatus").textContent = b.status;
        if (b.status === "QUEUED") {
          $("#pdetail").textContent = slow
            ? "Your tickets are held; creating your order is taking longer than usual. This page keeps checking."
            : "Your tickets are held; your order is being created…";
        } else if (b.order_no) {
          $("#pdetail").innerHTML = `Order <a href="#/order/${esc(b.order_no)}" data-testid="order-link">${esc(b.order_no)}</a> — ${esc(ORDER_SAYS[b.status] || b.status)}`;
          return;
        } else if (b.status === "FAILED") {
          $("#pdetail").textContent = "The purchase failed" + (b.reason ? ": " + b.reason : ".") + " Your tickets were released.";
          return;
        }
      } else if (st.status === 404 && i >= 10) {
        // Between a rebuild of the sale from MySQL and the drop of what it voided, for
        // a moment; for good, a purchase Redis lost before it became an order.
        $("#pdetail").textContent = "Your purchase is not found. If it does not appear shortly, it was lost before it became an order, and it will not become one. This page keeps checking.";
      }
      await new Promise((ok) => setTimeout(ok, slow ? 5_000 : 500));
    }
  }

  // The last purchase answered with a 5xx (or not at all): pressing Buy again for the
  // same thing with the same pass sends the same Idempotency-Key, so a purchase the core
  // may have taken is answered as it was, and a pass it claimed stays this purchase's.
  let lastUnanswered = null; // {what, key}
  $("#buy").onclick = async () => {
    const c = category();
    if (!c) return;
    busy = true; tick();
    $("#buy-error").textContent = "";
    const body = { category_id: c.id };
    if (train) Object.assign(body, { from, to });
    if (c.seats && picked.size) body.seat_ids = [...picked];
    else body.quantity = c.seats ? 1 : Number(($("#qty") || {}).value || 1);
    // A sale behind a waiting room: the turn's pass; on the hidden path, one taken now.
    const pass = roomOn() ? turnPass() : hiddenPath() ? await takeHiddenPass() : null;
    if ((roomOn() || hiddenPath()) && !pass) {
      busy = false;
      if (roomOn()) $("#buy-error").textContent = MESSAGES.QUEUE_REQUIRED;
      tick();
      return;
    }
    // Sent again with the same key while its outcome is not known (OUTCOME_UNKNOWN, or
    // no answer at all): the core answers a repeated key with its first answer; then,
    // below, the purchase is asked for by its key. Never the buyer's latest status: that
    // is another purchase's when this one was not admitted.
    const what = JSON.stringify([body, pass]);
    const reused = lastUnanswered && lastUnanswered.what === what;
    const key = reused ? lastUnanswered.key : crypto.randomUUID();
    // Sent before with this key, with no answer: unsure from the first try on.
    let r, wasUnsure = !!reused;
    for (let tries = 1; ; tries++) {
      r = await api("POST", `/api/events/${id}/orders`, body, key, pass ? { "Queue-Pass": pass } : {});
      const unsure = r.status === 0 || (r.body && r.body.error && r.body.error.code === "OUTCOME_UNKNOWN");
      if (!unsure || tries >= 5) break;
      wasUnsure = true;
      $("#progress").hidden = false;
      $("#pstatus").className = "status QUEUED";
      $("#pstatus").textContent = "CHECKING";
      $("#buy-error").textContent = MESSAGES.OUTCOME_UNKNOWN;
      await new Promise((ok) => setTimeout(ok, 1000));
    }
    // After an answer that never came, a refusal may be another edge's, from its memory
    // (a category sold out meanwhile) before it learned this key was admitted through
    // the first; and a retry may stay unanswered. The purchase the key admitted, if any,
    // is asked for by the key: its status is the truth. Not found, the first try may
    // still be on its way (the core takes up to 15 s): the key is kept for the same
    // choice, and the page says the refusal may not be the last word.
    let firstUnknown = false;
    if (wasUnsure && r.status !== 202 && r.status !== 401) {
      const st = await api("GET", `/api/events/${id}/orders/status`, undefined, key);
      const rid = st.status === 200 && (st.body.request_id || st.body.order_no);
      if (rid) r = { status: 202, body: { request_id: rid } };
      else firstUnknown = true;
    }
    busy = false;
    lastUnanswered = firstUnknown || r.status === 0 || r.status >= 500 ? { what, key } : null;
    // A pass admits one purchase: spent once it is queued (a refused one is given back).
    if (pass && r.status === 202) {
      if (pass === (hiddenPass && hiddenPass.pass)) hiddenPass = null;
      else if (queue && pass === queue.pass) { passUsed = true; stopPolling(); showQueue(queue); }
    }
    if (r.body && r.body.error && r.body.error.code === "QUEUE_REQUIRED") {
      hiddenPass = null;
      if (roomOn() && joined) poll(true);
    }
    if (r.status === 202) {
      $("#pstatus").className = "status QUEUED";
      $("#pstatus").textContent = "QUEUED";
      $("#buy-error").textContent = "";
      picked.clear();
      follow(r.body && r.body.request_id);
      renderPicker();
      if (train) refresh();
    } else {
      if (r.status === 429) blockedUntil = Date.now() + 1000 * Math.max(1, r.retryAfter);
      const code = r.body && r.body.error && r.body.error.code;
      if (firstUnknown || code === "OUTCOME_UNKNOWN" || r.status === 0) $("#pstatus").textContent = "UNKNOWN";
      // SOLD_OUT answers "fewer left than asked for" too: for several, it may not be all.
      $("#buy-error").textContent = train && code === "SOLD_OUT" ? MESSAGES.SOLD_OUT_JOURNEY
        : code === "SOLD_OUT" && body.quantity > 1 ? `Fewer than ${body.quantity} tickets are left in this category (maybe none): try fewer.`
        : code === "OUTCOME_UNKNOWN" ? MESSAGES.STILL_UNKNOWN : errorText(r);
      if (firstUnknown && code !== "OUTCOME_UNKNOWN" && r.status !== 0) $("#buy-error").textContent += " " + MESSAGES.FIRST_TRY_UNKNOWN;
      refresh();
      renderPicker();
    }
    tick();
  };

  if (train) {
    renderJourney();
    $("#from").onchange = journeyChanged;
    $("#to").onchange = journeyChanged;
    await loadJourney();
  }
  renderCategories();
  renderPicker();
  every(250, tick);
  checkRoom();
  timers.push(setInterval(refresh, 2000));
  timers.push(setInterval(() => category() && category().seats && renderPicker(), 2000));
}

async function orderView(no, query) {
  const r = await api("GET", `/api/orders/${no}`);
  if (r.status !== 200) { view.innerHTML = `<p class="error">${esc(errorText(r))}</p>`; return; }
  const o = r.body;
  const note = query.get("payment");
  // A train ticket's journey is station indexes: the names are the event's.
  let journey = "";
  if (o.journey) {
    const e = await api("GET", `/api/events/${o.event_id}`);
    const name = (i) => (e.status === 200 && e.body.stations[i]) || `stop ${i + 1}`;
    journey = `${name(o.journey.from)} → ${name(o.journey.to)}`;
  }
  view.innerHTML = `
    <div class="card">
      <h1>Order ${esc(o.order_no)}</h1>
      ${note ? `<p class="${note === "paid" ? "" : "error"}" data-testid="payment-note">${esc(PAYMENT_NOTES[note] || "The payment was " + note + ".")}</p>` : ""}
      <div>Status: <span class="status ${esc(o.status)}" data-testid="order-status">${esc(o.status)}</span></div>
      <table>
        <tr><th>Tickets</th><td>${o.quantity}</td></tr>
        ${o.journey ? `<tr><th>Journey</th><td data-testid="order-journey">${esc(journey)}</td></tr>` : ""}
        <tr><th>Seats</th><td data-testid="order-seats">${o.seats.length ? o.seats.map((s) => { const [r, c] = s.split(":"); return `${o.journey ? "Carriage" : "Row"} ${r} seat ${c}`; }).join(", ") : "Unseated"}</td></tr>
        <tr><th>Amount</th><td>${money(o.amount_cents)}</td></tr>
        <tr><th>Pay by</th><td>${new Date(o.pay_deadline).toLocaleString()} <span id="left" class="muted"></span></td></tr>
      </table>
      <div class="row" style="margin-top:1rem">
        ${o.status === "UNPAID" ? '<button id="pay" class="primary" data-testid="pay">Pay ' + money(o.amount_cents) + '</button><button id="cancel" class="danger" data-testid="cancel">Cancel order</button>' : ""}
        <a href="#/event/${o.event_id}">Back to the sale</a>
      </div>
      <div id="order-error" class="error" role="alert"></div>
    </div>`;
  if (o.status === "UNPAID") {
    every(500, () => {
      const left = Date.parse(o.pay_deadline) - serverNow();
      $("#left").textContent = left > 0 ? `(${duration(left)} left)` : "(the window has passed)";
    });
    $("#pay").onclick = async () => {
      const p = await api("POST", `/api/orders/${no}/pay`);
      if (p.status !== 200) { $("#order-error").textContent = errorText(p); return; }
      const page = p.body.provider && p.body.provider.page;
      if (!page) { $("#order-error").textContent = "Payments are not set up here (no provider page configured)."; return; }
      const ret = `/#/order/${no}`;
      location.href = `${page}?order_no=${encodeURIComponent(p.body.order_no)}&amount_cents=${p.body.amount_cents}&return=${encodeURIComponent(ret)}`;
    };
    $("#cancel").onclick = async () => {
      if (!confirm("Cancel this order and give the tickets back?")) return;
      const c = await api("POST", `/api/orders/${no}/cancel`);
      if (c.status !== 200) $("#order-error").textContent = errorText(c);
      orderView(no, new URLSearchParams());
    };
  }
}

function route() {
  clearTimers();
  routeGen++;
  renderWho();
  if (!session().token) { loginView(); return; }
  const [path, qs] = (location.hash.slice(1) || "/").split("?");
  const query = new URLSearchParams(qs || "");
  let m;
  if ((m = path.match(/^\/event\/(\d+)$/))) eventView(m[1]);
  else if ((m = path.match(/^\/order\/(\d+)$/))) orderView(m[1], query);
  else listView();
}

window.addEventListener("hashchange", route);
route();
