// Stampede's buyer app: plain JS, no build step. Routes: #/ (events), #/event/<id>,
// #/order/<order no>. Every call goes through the edge's /api/ with the user's token.
// A train (kind "train") sells journeys: its page picks from/to, its classes show the
// seats free on that journey and a carriage map for it.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const view = $("#view");
let timers = [];
let clockOffsetMs = 0; // server clock − this browser's clock

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
  OUTCOME_UNKNOWN: "Your purchase was sent but not confirmed yet; checking what became of it…",
  INVALID: "That request was not valid.",
  NOT_FOUND: "Not found.",
  NOT_PAYABLE: "This order can no longer be paid.",
  UNAVAILABLE: "The sale service is not answering. Try again shortly.",
  PAYLOAD_TOO_LARGE: "That request was too large.",
  INTERNAL: "Something went wrong on our side. Try again.",
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

async function api(method, path, body, idempotencyKey) {
  const headers = { "Content-Type": "application/json" };
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
  if (b) b.onclick = () => logout();
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

  view.innerHTML = `
    <div class="card">
      <h1 data-testid="title">${esc(ev.title)}</h1>
      <div class="muted">${esc(ev.venue)} · ${new Date(ev.show_time).toLocaleString()} · up to ${ev.per_user_limit} per person</div>
      <p><span id="pill" class="pill"></span></p>
      <div id="countdown" class="countdown" data-testid="countdown"></div>
      <div id="soldout" class="error" data-testid="soldout" hidden>${train ? "Sold out: no seat is free on this journey." : "Sold out: every ticket of this sale is taken."}</div>
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

  async function loadJourney() {
    const [f, t] = [from, to];
    const a = await api("GET", `/api/events/${id}/availability?from=${f}&to=${t}`);
    if (f !== from || t !== to) return; // the journey changed meanwhile
    if (a.status !== 200) { onJourney = {}; $("#buy-error").textContent = errorText(a); return; }
    onJourney = Object.fromEntries(a.body.classes.map((c) => [c.id, c]));
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
    $("#buy").disabled = s.key !== "open" || busy || waitS > 0 || !c || c.sold_out;
    $("#buy-note").textContent = waitS > 0 ? `Too many tries: you can try again in ${waitS} s.` : s.key === "soon" ? "The button opens when the sale does." : "";
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
  }

  async function follow() {
    $("#progress").hidden = false;
    for (let i = 0; i < 240; i++) {
      const st = await api("GET", `/api/events/${id}/orders/status`);
      if (st.status === 200) {
        const b = st.body;
        $("#pstatus").className = "status " + b.status;
        $("#pstatus").textContent = b.status;
        if (b.status === "QUEUED") {
          $("#pdetail").textContent = "Your tickets are held; your order is being created…";
        } else if (b.order_no) {
          $("#pdetail").innerHTML = `Order <a href="#/order/${b.order_no}" data-testid="order-link">${b.order_no}</a> — pay it before the deadline to keep your tickets.`;
          return;
        } else if (b.status === "FAILED") {
          $("#pdetail").textContent = "The purchase failed" + (b.reason ? ": " + b.reason : ".") + " Your tickets were released.";
          return;
        }
      }
      await new Promise((ok) => setTimeout(ok, 500));
    }
  }

  $("#buy").onclick = async () => {
    const c = category();
    if (!c) return;
    busy = true; tick();
    $("#buy-error").textContent = "";
    const body = { category_id: c.id };
    if (train) Object.assign(body, { from, to });
    if (c.seats && picked.size) body.seat_ids = [...picked];
    else body.quantity = c.seats ? 1 : Number(($("#qty") || {}).value || 1);
    const r = await api("POST", `/api/events/${id}/orders`, body, crypto.randomUUID());
    busy = false;
    const unknown = r.body && r.body.error && r.body.error.code === "OUTCOME_UNKNOWN";
    if (r.status === 202 || unknown) {
      // Unknown: the status says whether it was admitted; nothing is untrue meanwhile.
      $("#pstatus").className = "status QUEUED";
      $("#pstatus").textContent = unknown ? "CHECKING" : "QUEUED";
      if (unknown) $("#buy-error").textContent = errorText(r);
      picked.clear();
      follow();
      renderPicker();
      if (train) refresh();
    } else {
      if (r.status === 429) blockedUntil = Date.now() + 1000 * Math.max(1, r.retryAfter);
      const soldOut = r.body && r.body.error && r.body.error.code === "SOLD_OUT";
      $("#buy-error").textContent = train && soldOut ? MESSAGES.SOLD_OUT_JOURNEY : errorText(r);
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
      ${note ? `<p class="${note === "paid" ? "" : "error"}">${note === "paid" ? "Payment received." : "The payment was " + esc(note) + "."}</p>` : ""}
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
