// The buyer app and the ops dashboard in a real browser (Debian's Chromium, driven by
// playwright-core) against the real stack: edge, core, Redis, MariaDB, RocketMQ and the
// payment simulator. Screenshots go to $SCREENSHOT_DIR (target/ui-screenshots).
import { test, before, after, afterEach } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { createHash } from "node:crypto";
import { chromium } from "playwright-core";

const env = process.env;
const EDGE = `http://127.0.0.1:${env.EDGE_PORT || 8080}`;
// The cluster stack's second edge (STACK_MODE=cluster): the second buyer's browser and
// half of the dashboard sale's buyers go through it. Without one, both are EDGE.
const EDGE2 = env.EDGE2_PORT ? `http://127.0.0.1:${env.EDGE2_PORT}` : EDGE;
const OPS = `http://127.0.0.1:${env.OPS_PORT || 8082}`;
const PAYSIM = `http://127.0.0.1:${env.PAYSIM_PORT || 8090}`;
const ADMIN = `http://127.0.0.1:${env.ADMIN_PORT || 9091}`;
const STACK_DIR = env.STACK_DIR || ".stack";
const ADMIN_TOKEN = readFileSync(join(STACK_DIR, "admin.token"), "utf8").trim();
const SHOTS = env.SCREENSHOT_DIR || "target/ui-screenshots";
mkdirSync(SHOTS, { recursive: true });

let browser;
// Uncaught errors in any page (a timer's TypeError shows nowhere else): each test ends
// with none.
const pageErrors = [];

before(async () => {
  browser = await chromium.launch({
    executablePath: env.CHROMIUM || "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
  });
  const newContext = browser.newContext.bind(browser);
  browser.newContext = async (...options) => {
    const context = await newContext(...options);
    context.on("weberror", (e) => pageErrors.push(`${e.page()?.url()}: ${e.error()}`));
    return context;
  };
});

afterEach(() => {
  assert.deepEqual(pageErrors.splice(0), [], "uncaught errors in the pages");
});

after(async () => {
  await browser?.close();
});

async function admin(method, path, body) {
  const r = await fetch(ADMIN + path, {
    method,
    headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await r.json();
  assert.ok(r.ok, `${method} ${path}: ${r.status} ${JSON.stringify(data)}`);
  return data;
}

/** Users with a password: their usernames. */
async function users(count, password) {
  const made = await admin("POST", "/admin/users", { count, password });
  return Array.from({ length: count }, (_, i) => `user${made.first_user_id + i}`);
}

/**
 * A published event selling from `startInS` seconds from now; `room`: its waiting room
 * (the body of PUT /admin/events/{id}/waiting-room), set before it is published.
 */
async function sale({ title, ga, rows, cols, limit = 2, startInS = 0, room }) {
  const now = Date.now();
  const iso = (ms) => new Date(ms).toISOString();
  const categories = [{ name: "Standing", price_cents: 4500, quantity: ga }];
  if (rows) categories.push({ name: "Seated", price_cents: 8900, seats: { rows, cols } });
  const created = await admin("POST", "/admin/events", {
    title, venue: "Loopback Arena", show_time: iso(now + 30 * 86400e3),
    sale_start: iso(now + startInS * 1000), sale_end: iso(now + 3600e3),
    per_user_limit: limit, pay_timeout_s: 600, categories,
  });
  if (room) await admin("PUT", `/admin/events/${created.event_id}/waiting-room`, room);
  await admin("POST", `/admin/events/${created.event_id}/publish`);
  return { id: created.event_id, categories: created.categories.map((c) => c.id), saleStartMs: now + startInS * 1000 };
}

/** A published train selling now: its classes' ids, first class first. */
async function train({ title, stations, classes, limit = 2 }) {
  const now = Date.now();
  const iso = (ms) => new Date(ms).toISOString();
  const created = await admin("POST", "/admin/events", {
    title, venue: "Line 7", kind: "train", stations, show_time: iso(now + 30 * 86400e3),
    sale_start: iso(now), sale_end: iso(now + 3600e3),
    per_user_limit: limit, pay_timeout_s: 600, categories: classes,
  });
  await admin("POST", `/admin/events/${created.event_id}/publish`);
  return { id: created.event_id, categories: created.categories.map((c) => c.id) };
}

async function signIn(page, username, password) {
  await page.fill('input[name="username"]', username);
  await page.fill('input[name="password"]', password);
  await page.click('form#login button[type="submit"]');
  await page.waitForSelector('[data-testid="user"]');
}

const text = (page, testid) => page.textContent(`[data-testid="${testid}"]`);

async function shot(page, name) {
  await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
}

test("a buyer waits for the open, picks seats, is queued then created, pays; another buyer sees the seats taken", async () => {
  const password = "pw-" + Math.random().toString(36).slice(2);
  const [alice, bob] = await users(2, password);
  const ev = await sale({ title: "Aurora Live — browser test", ga: 50, rows: 5, cols: 8, startInS: 10 });

  const page = await (await browser.newContext({ viewport: { width: 1200, height: 900 } })).newPage();
  await page.goto(`${EDGE}/#/event/${ev.id}`);
  await signIn(page, alice, password);
  await page.waitForSelector('[data-testid="countdown"]:has-text("Opens in")');
  assert.equal(await page.isDisabled('[data-testid="buy"]'), true, "the buy button waits for the open");
  await page.check('input[aria-label="Seated"]');
  await page.waitForSelector('[data-seat="1:4"]');
  await shot(page, "01-event-countdown");

  // The button opens with the sale, on the server's clock.
  await page.waitForSelector('[data-testid="buy"]:not([disabled])', { timeout: 20_000 });
  await page.click('[data-seat="1:4"]');
  await page.click('[data-seat="1:5"]');
  await shot(page, "02-seats-picked");
  // Every status the page shows, in order.
  await page.evaluate(() => {
    window.seen = [];
    const el = document.querySelector('[data-testid="purchase-status"]');
    new MutationObserver(() => window.seen.push(el.textContent)).observe(el, { childList: true, characterData: true, subtree: true });
  });
  await page.click('[data-testid="buy"]');
  await page.waitForSelector('[data-testid="purchase-status"]:has-text("CREATED")', { timeout: 30_000 });
  const seen = await page.evaluate(() => window.seen);
  assert.equal(seen[0], "QUEUED", `statuses shown: ${seen}`);
  assert.equal(seen.at(-1), "CREATED");
  await shot(page, "03-created");

  await page.click('[data-testid="order-link"]');
  await page.waitForSelector('[data-testid="order-status"]:has-text("UNPAID")');
  assert.equal(await text(page, "order-seats"), "Row 1 seat 4, Row 1 seat 5");
  await shot(page, "04-order-unpaid");

  // Pay through the provider simulator's page, and come back paid.
  await page.click('[data-testid="pay"]');
  await page.waitForURL(/\/paysim\/pay\?/);
  // The provider's page is the simulator's own origin, never the edge's.
  assert.ok(page.url().startsWith(`${PAYSIM}/paysim/pay?`), page.url());
  await shot(page, "05-provider-page");
  await page.click('button[value="pay"]');
  await page.waitForSelector('[data-testid="order-status"]:has-text("PAID")', { timeout: 15_000 });
  await shot(page, "06-order-paid");

  // MySQL agrees: two seated units paid.
  const stats = await admin("GET", `/admin/events/${ev.id}/stats`);
  const seated = stats.categories.find((c) => c.category_id === ev.categories[1]);
  assert.equal(seated.paid, 2, JSON.stringify(stats));

  // A second buyer, in a browser of their own, sees those two seats sold.
  const other = await (await browser.newContext({ viewport: { width: 1200, height: 900 } })).newPage();
  await other.goto(`${EDGE2}/#/event/${ev.id}`);
  await signIn(other, bob, password);
  await other.check('input[aria-label="Seated"]');
  await other.waitForSelector('[data-seat="1:4"][data-state="S"]');
  assert.equal(await other.getAttribute('[data-seat="1:5"]', "data-state"), "S");
  assert.equal(await other.isDisabled('[data-seat="1:4"]'), true);
  assert.equal(await other.getAttribute('[data-seat="1:6"]', "data-state"), "F");
  await shot(other, "07-seats-taken-for-another-buyer");
});

test("a sold-out sale says so and offers nothing to buy", async () => {
  const password = "pw-" + Math.random().toString(36).slice(2);
  const [first, late] = await users(2, password);
  const ev = await sale({ title: "Tiny Room — one ticket", ga: 1, limit: 1 });
  // The only ticket goes to the first buyer, through the edge.
  const login = await fetch(`${EDGE}/api/login`, {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ username: first, password }),
  }).then((r) => r.json());
  await new Promise((ok) => setTimeout(ok, 1000)); // the edge learns of the new sale
  const bought = await fetch(`${EDGE}/api/events/${ev.id}/orders`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${login.token}`, "Idempotency-Key": "only" },
    body: JSON.stringify({ category_id: ev.categories[0], quantity: 1 }),
  });
  assert.equal(bought.status, 202);

  const page = await (await browser.newContext()).newPage();
  await page.goto(`${EDGE}/#/event/${ev.id}`);
  await signIn(page, late, password);
  await page.waitForSelector('[data-testid="soldout"]:not([hidden])', { timeout: 10_000 });
  assert.match(await text(page, `avail-${ev.categories[0]}`), /Sold out/);
  assert.equal(await page.isDisabled('[data-testid="buy"]'), true);
  await shot(page, "08-sold-out");
});

/** A sale of one ticket, open, and a buyer's page on it with Buy enabled. */
async function oneTicketOnSale(title) {
  const password = "pw-" + Math.random().toString(36).slice(2);
  const [buyer] = await users(1, password);
  const ev = await sale({ title, ga: 1, limit: 1 });
  await new Promise((ok) => setTimeout(ok, 1000)); // the edge learns of the new sale
  const page = await (await browser.newContext({ viewport: { width: 1200, height: 900 } })).newPage();
  await page.goto(`${EDGE}/#/event/${ev.id}`);
  await signIn(page, buyer, password);
  await page.waitForSelector('[data-testid="buy"]:not([disabled])', { timeout: 10_000 });
  return { ev, page };
}

test("a purchase whose answer was lost, refused on its retry by an edge that did not know it yet, is found by its key and followed to its order", async () => {
  const { ev, page } = await oneTicketOnSale("Lost Answer Hall — one ticket");
  // The network between the page and the edge: the first purchase reaches the edge and
  // the core (it takes the only ticket), and its answer is lost; the retry meets an
  // edge that has not learned its key yet and refuses it from its sold-out flag, as
  // another edge can for a refresh or two.
  const sent = [];
  await page.route(`**/api/events/${ev.id}/orders`, async (route) => {
    if (route.request().method() !== "POST") return route.continue();
    sent.push(route.request().headers()["idempotency-key"]);
    if (sent.length === 1) {
      const reached = await route.fetch();
      sent.push(reached.status());
      return route.abort("connectionreset");
    }
    return route.fulfill({
      status: 409, contentType: "application/json",
      body: JSON.stringify({ error: { code: "SOLD_OUT", message: "sold out" } }),
    });
  });
  await page.click('[data-testid="buy"]');
  await page.waitForSelector('[data-testid="purchase-status"]:has-text("CREATED")', { timeout: 30_000 });
  assert.deepEqual(sent.slice(1, 2), [202], "the first purchase was admitted");
  assert.equal(sent.length, 3, `two purchases sent: ${JSON.stringify(sent)}`);
  assert.equal(sent[2], sent[0], "the retry carries the same key");
  assert.equal(await text(page, "buy-error"), "", "no 'sold out' for a purchase that was admitted");
  await page.click('[data-testid="order-link"]');
  await page.waitForSelector('[data-testid="order-status"]:has-text("UNPAID")');
  await shot(page, "08b-lost-answer-found-by-its-key");
});

test("a refusal after a try that was never answered is not the last word: the page says so and the same choice is sent with the same key", async () => {
  const { ev, page } = await oneTicketOnSale("Lost Answer Hall — first try unknown");
  // The first try's connection drops (it reaches nothing here, as if it were still on
  // its way); the retry is refused from memory. The key admitted nothing the core knows.
  const sent = [];
  await page.route(`**/api/events/${ev.id}/orders`, async (route) => {
    if (route.request().method() !== "POST") return route.continue();
    sent.push(route.request().headers()["idempotency-key"]);
    if (sent.length === 1) return route.abort("connectionreset");
    if (sent.length === 2) {
      return route.fulfill({
        status: 409, contentType: "application/json",
        body: JSON.stringify({ error: { code: "SOLD_OUT", message: "sold out" } }),
      });
    }
    return route.continue();
  });
  await page.click('[data-testid="buy"]');
  await page.waitForFunction(() => /first try was never answered/.test(document.querySelector('[data-testid="buy-error"]').textContent), null, { timeout: 15_000 });
  assert.equal(await text(page, "purchase-status"), "UNKNOWN");
  // The same choice again: the same key, now answered for real (the ticket is still there).
  await page.waitForSelector('[data-testid="buy"]:not([disabled])', { timeout: 5_000 });
  await page.click('[data-testid="buy"]');
  await page.waitForSelector('[data-testid="purchase-status"]:has-text("CREATED")', { timeout: 30_000 });
  assert.equal(sent.length, 3, JSON.stringify(sent));
  assert.ok(sent.every((k) => k === sent[0]), `one key for the one purchase: ${JSON.stringify(sent)}`);
});

test("a payment that lands on an order cancelled meanwhile comes back as to be refunded, not as received", async () => {
  const { ev, page } = await oneTicketOnSale("Refund Hall — one ticket");
  const token = await page.evaluate(() => sessionStorage.getItem("token"));
  await page.click('[data-testid="buy"]');
  await page.waitForSelector('[data-testid="purchase-status"]:has-text("CREATED")', { timeout: 30_000 });
  await page.click('[data-testid="order-link"]');
  await page.waitForSelector('[data-testid="order-status"]:has-text("UNPAID")');
  const orderNo = page.url().match(/#\/order\/(\d+)/)[1];
  // On the provider's page, the order is cancelled (another tab, say) before paying.
  await page.click('[data-testid="pay"]');
  await page.waitForURL(/\/paysim\/pay\?/);
  const [status] = await call(token, "POST", `/api/orders/${orderNo}/cancel`);
  assert.equal(status, 200);
  await page.click('button[value="pay"]');
  await page.waitForSelector('[data-testid="payment-note"]', { timeout: 15_000 });
  assert.match(await text(page, "payment-note"), /to be refunded/);
  assert.equal(await text(page, "order-status"), "CANCELLED");
  const stats = await admin("GET", `/admin/events/${ev.id}/stats`);
  assert.equal(stats.refunds_pending, 1, JSON.stringify(stats));
  await shot(page, "08c-payment-after-cancellation");
});

test("a train buyer picks a journey, sees its free seats and price, buys a seat; another buyer sees it free before and taken across", async () => {
  const password = "pw-" + Math.random().toString(36).slice(2);
  const [alice, bob] = await users(2, password);
  const ev = await train({
    title: "Coastal Express — browser test",
    stations: ["A-town", "B-ville", "C-city", "D-port"],
    classes: [
      { name: "First", price_cents: 1000, seats: { rows: 1, cols: 2 } },
      { name: "Second", price_cents: 500, seats: { rows: 2, cols: 4 } },
    ],
  });
  const [first, second] = ev.categories;
  await new Promise((ok) => setTimeout(ok, 1000)); // the edge learns of the new sale

  const page = await (await browser.newContext({ viewport: { width: 1200, height: 900 } })).newPage();
  await page.goto(`${EDGE}/#/event/${ev.id}`);
  await signIn(page, alice, password);
  // The whole route by default; To offers only the stations after From.
  await page.waitForSelector(`[data-testid="avail-${first}"]:has-text("2 free")`);
  assert.equal(await page.inputValue('[data-testid="from"]'), "0");
  assert.equal(await page.inputValue('[data-testid="to"]'), "3");
  await page.selectOption('[data-testid="from"]', { label: "B-ville" });
  assert.deepEqual(await page.$$eval('[data-testid="to"] option', (os) => os.map((o) => o.textContent)), ["C-city", "D-port"]);
  assert.equal(await page.inputValue('[data-testid="to"]'), "3", "To stays D-port");
  // Two segments: 2 × € 10.00 in First, 2 × € 5.00 in Second.
  await page.waitForSelector(`[data-testid="price-${first}"]:has-text("€ 20.00")`);
  assert.equal(await text(page, `avail-${first}`), "2 free");
  assert.equal(await text(page, `price-${second}`), "€ 10.00");
  assert.equal(await text(page, `avail-${second}`), "8 free");

  await page.check(`[data-testid="cat-${first}"]`);
  await page.waitForSelector('[data-testid="carriage-1"] [data-seat="1:1"][data-state="F"]');
  assert.match(await text(page, "carriage-1"), /Carriage 1/);
  assert.equal(await page.$('[data-testid="carriage-2"]'), null, "First has one carriage");
  await page.waitForSelector('[data-testid="buy"]:not([disabled])');
  await page.click('[data-seat="1:1"]');
  await page.click('[data-testid="buy"]');
  await page.waitForSelector('[data-testid="purchase-status"]:has-text("CREATED")', { timeout: 30_000 });
  // The availability follows the purchase.
  await page.waitForSelector(`[data-testid="avail-${first}"]:has-text("1 free")`, { timeout: 10_000 });
  await page.click('[data-testid="order-link"]');
  await page.waitForSelector('[data-testid="order-status"]:has-text("UNPAID")');
  assert.equal(await text(page, "order-journey"), "B-ville → D-port");
  assert.equal(await text(page, "order-seats"), "Carriage 1 seat 1");
  await shot(page, "10-train-order");

  // A second buyer: seat 1:1 is free A-town → B-ville, taken A-town → D-port.
  const other = await (await browser.newContext({ viewport: { width: 1200, height: 900 } })).newPage();
  await other.goto(`${EDGE2}/#/event/${ev.id}`);
  await signIn(other, bob, password);
  await other.waitForSelector('[data-testid="from"]');
  await other.selectOption('[data-testid="to"]', { label: "B-ville" });
  await other.waitForSelector(`[data-testid="avail-${first}"]:has-text("2 free")`);
  assert.equal(await text(other, `price-${first}`), "€ 10.00");
  await other.check(`[data-testid="cat-${first}"]`);
  await other.waitForSelector('[data-seat="1:1"][data-state="F"]');
  assert.equal(await other.isDisabled('[data-seat="1:1"]'), false);
  await shot(other, "11-train-seat-free-before-the-journey");
  await other.selectOption('[data-testid="to"]', { label: "D-port" });
  await other.waitForSelector('[data-seat="1:1"][data-state="S"]');
  assert.equal(await other.isDisabled('[data-seat="1:1"]'), true);
  assert.equal(await other.getAttribute('[data-seat="1:2"]', "data-state"), "F");
  await other.waitForSelector(`[data-testid="avail-${first}"]:has-text("1 free")`);
  assert.equal(await text(other, `price-${first}`), "€ 30.00");
  await shot(other, "12-train-seat-taken-across-the-journey");
});

test("the ops dashboard shows a sale's numbers live while buyers stream in", async () => {
  // 600 buyers for 300 standing units, admitted over a few seconds through the edge.
  const made = await admin("POST", "/admin/users", { count: 600 });
  const { tokens } = await admin("POST", "/admin/tokens", { first_user_id: made.first_user_id, count: 600, ttl_s: 600 });
  const ev = await sale({ title: "Dashboard sale", ga: 300, limit: 1 });
  const page = await (await browser.newContext({ viewport: { width: 1400, height: 1000 } })).newPage();
  await page.goto(`${OPS}/?event=${ev.id}`);
  await page.fill("#token", ADMIN_TOKEN);
  await page.click('#connect button[type="submit"]');
  await page.waitForSelector('[data-testid="state"]:has-text("live")', { timeout: 10_000 });
  assert.equal(await text(page, "stock"), "300");

  let next = 0;
  const buyer = async (edge) => {
    while (next < tokens.length) {
      const token = tokens[next++];
      await fetch(`${edge}/api/events/${ev.id}/orders`, {
        method: "POST",
        headers: { "Content-Type": "application/json", Authorization: `Bearer ${token}`, "Idempotency-Key": "k" },
        body: JSON.stringify({ category_id: ev.categories[0], quantity: 1 }),
      });
      await new Promise((ok) => setTimeout(ok, 60)); // a stream, not a spike: a few seconds of it
    }
  };
  const seenAdmitting = page.waitForFunction(
    () => Number(document.querySelector('[data-testid="admitted-rate"]').textContent.replace(/,/g, "")) > 0,
    null, { timeout: 20_000 },
  );
  await Promise.all(Array.from({ length: 8 }, (_, i) => buyer(i % 2 ? EDGE2 : EDGE)));
  await seenAdmitting;
  // Sold out, every unit an order, nothing queued, the books balanced.
  await page.waitForFunction(
    () => ["stock", "orders", "queue", "gap"].map((t) => document.querySelector(`[data-testid="${t}"]`).textContent).join() === "0,300,0,0",
    null, { timeout: 20_000 },
  );
  await shot(page, "09-ops-dashboard");

  // A wrong token is refused, and says so.
  const bad = await (await browser.newContext()).newPage();
  await bad.goto(`${OPS}/`);
  await bad.fill("#token", "not-the-token");
  await bad.click('#connect button[type="submit"]');
  await bad.waitForSelector('[data-testid="state"]:has-text("refused")');
});

/** A user's token, through the edge's login. */
async function login(username, password) {
  const r = await fetch(`${EDGE}/api/login`, {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ username, password }),
  });
  assert.equal(r.status, 200);
  return (await r.json()).token;
}

/** A user's call to the edge's API: [status, body]. */
async function call(token, method, path, body) {
  const r = await fetch(EDGE + path, {
    method, headers: { "Content-Type": "application/json", Authorization: `Bearer ${token}` },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return [r.status, await r.json()];
}

/** Joins the event's waiting room outside the browser, with a proof of work solved here. */
async function joinRoom(token, eventId) {
  const [status, ch] = await call(token, "GET", `/api/events/${eventId}/queue/challenge`);
  assert.equal(status, 200, JSON.stringify(ch));
  const prefix = `${ch.challenge}:${token.split(".")[1]}:${eventId}:`;
  const zeros = (d) => { let n = 0; for (const b of d) { if (b) return n + Math.clz32(b) - 24; n += 8; } return n; };
  let nonce = 0;
  while (zeros(createHash("sha256").update(prefix + nonce).digest()) < ch.bits) nonce++;
  const joined = await call(token, "POST", `/api/events/${eventId}/queue`, { challenge: ch.challenge, nonce: String(nonce) });
  assert.equal(joined[0], 200, JSON.stringify(joined[1]));
}

test("a waiting room: a buyer joins before the open (proof of work in the page), gets a turn, buys with the pass; a later buyer waits, reads sold out, and gets a turn once an order is cancelled; the dashboard counts them", async () => {
  const password = "pw-" + Math.random().toString(36).slice(2);
  const [alice, bob, carol, dave] = await users(4, password);
  // Signed in first: the six seconds before the open are for the room.
  const page = await (await browser.newContext({ viewport: { width: 1200, height: 1000 } })).newPage();
  await page.goto(`${EDGE}/`);
  await signIn(page, alice, password);
  const ev = await sale({
    title: "Queue Hall — waiting room", ga: 2, limit: 2, startInS: 6,
    // Carol's pass must still be out at the dashboard's count, however slow the run.
    room: { enabled: true, admit_per_s: 5, pass_ttl_s: 180, challenge_bits: 8 },
  });

  // What the page sends: its joins (with their bodies) and purchases (with their headers).
  const joins = [], purchases = [];
  page.on("request", (req) => {
    if (req.method() !== "POST") return;
    if (/\/api\/events\/\d+\/queue$/.test(req.url())) joins.push(req);
    if (/\/api\/events\/\d+\/orders$/.test(req.url())) purchases.push(req.headers());
  });
  await page.goto(`${EDGE}/#/event/${ev.id}`);
  await page.waitForSelector('[data-testid="room"]:not([hidden])');
  assert.equal(await page.isDisabled('[data-testid="buy"]'), true, "no buying before the turn");
  // Every state and position the page shows, in order, and the proof of work's progress.
  await page.evaluate(() => {
    window.seen = [];
    window.pow = [];
    const q = (t) => document.querySelector(`[data-testid="${t}"]`);
    new MutationObserver(() => {
      const state = q("queue-state").dataset.state;
      const now = `${state} ${q("queue-position").textContent}`;
      if (state && window.seen.at(-1) !== now) window.seen.push(now);
    }).observe(q("room"), { attributes: true, childList: true, characterData: true, subtree: true });
    new MutationObserver(() => window.pow.push(q("pow-text").textContent))
      .observe(q("pow-text"), { childList: true, characterData: true, subtree: true });
  });
  await page.waitForSelector('[data-testid="join"]:not([disabled])', { timeout: 5_000 });
  await page.click('[data-testid="join"]');

  // In line before the open: waiting, no position until the draw, nothing to buy.
  await page.waitForSelector('[data-testid="queue-state"][data-state="waiting"]', { timeout: 5_000 });
  assert.ok(Date.now() < ev.saleStartMs, `joined ${Date.now() - ev.saleStartMs} ms after the open: too late for this test`);
  assert.equal(await text(page, "queue-position"), "—");
  assert.match(await text(page, "countdown"), /Opens in/);
  assert.equal(await page.isDisabled('[data-testid="buy"]'), true);
  assert.match(await page.textContent("#buy-note"), /waiting room/);
  await shot(page, "13-room-waiting-for-the-draw");
  // The join carried a proof solved in the page, and was accepted.
  assert.equal(joins.length, 1);
  const proof = JSON.parse(joins[0].postData());
  assert.match(proof.nonce, /^[0-9A-Za-z]{1,32}$/, JSON.stringify(proof));
  assert.ok(proof.challenge, JSON.stringify(proof));
  assert.equal((await joins[0].response()).status(), 200);
  const pow = await page.evaluate(() => window.pow);
  assert.ok(pow.some((t) => /hashes tried/.test(t)), `proof of work progress shown: ${JSON.stringify(pow)}`);
  // Carol joins too (outside the browser): the draw orders the two of them.
  const carolToken = await login(carol, password);
  await joinRoom(carolToken, ev.id);

  // After the open: a position, then the turn, the bar full, the pass's time shown.
  await page.waitForSelector('[data-testid="queue-state"][data-state="your_turn"]', { timeout: 20_000 });
  const position = await text(page, "queue-position");
  assert.match(position, /^[12]$/, "one of the two drawn");
  assert.ok(await page.isVisible('progress[data-testid="queue-progress"]'), "the progress bar is shown");
  assert.deepEqual(await page.$eval('[data-testid="queue-progress"]', (p) => [p.value, p.max]), [1, 1]);
  assert.match(await text(page, "queue-pass"), /Your pass is good until .* left/);
  const seen = await page.evaluate(() => window.seen);
  assert.equal(seen[0], "waiting —", `states shown: ${JSON.stringify(seen)}`);
  assert.equal(seen.at(-1), `your_turn ${position}`, `states shown: ${JSON.stringify(seen)}`);
  await shot(page, "14-room-your-turn");

  // Carol's turn too: both units are spoken for by the two passes out.
  let carolState;
  for (const until = Date.now() + 10_000; Date.now() < until; await new Promise((ok) => setTimeout(ok, 200))) {
    carolState = (await call(carolToken, "GET", `/api/events/${ev.id}/queue`))[1].state;
    if (carolState === "your_turn") break;
  }
  assert.equal(carolState, "your_turn");

  // So Bob, joining now, waits third in line: a position, nobody ahead, the bar empty.
  const other = await (await browser.newContext({ viewport: { width: 1200, height: 1000 } })).newPage();
  const polls = [];
  other.on("request", (req) => {
    if (req.method() === "GET" && /\/api\/events\/\d+\/queue$/.test(req.url())) polls.push(Date.now());
  });
  await other.goto(`${EDGE2}/#/event/${ev.id}`);
  await signIn(other, bob, password);
  await other.waitForSelector('[data-testid="join"]:not([disabled])', { timeout: 5_000 });
  await other.click('[data-testid="join"]');
  await other.waitForSelector('[data-testid="queue-state"][data-state="waiting"]', { timeout: 10_000 });
  assert.equal(await text(other, "queue-position"), "3");
  assert.equal(await text(other, "queue-ahead"), "0");
  assert.match(await text(other, "queue-eta"), /^about \d+:\d\d$|being estimated|longer than estimated/);
  assert.ok(await other.isVisible('progress[data-testid="queue-progress"]'), "the progress bar is shown");
  assert.deepEqual(await other.$eval('[data-testid="queue-progress"]', (p) => [p.value, p.max]), [0, 1]);
  assert.equal(await other.isDisabled('[data-testid="buy"]'), true, "no buying before the turn");
  await shot(other, "15-room-waiting-in-line");

  // Alice buys both units with her pass.
  await page.waitForSelector('[data-testid="buy"]:not([disabled])', { timeout: 5_000 });
  await page.selectOption('[data-testid="quantity"]', "2");
  await page.click('[data-testid="buy"]');
  await page.waitForSelector('[data-testid="purchase-status"]:has-text("CREATED")', { timeout: 30_000 });
  assert.equal(purchases.length, 1);
  assert.match(purchases[0]["queue-pass"] || "", new RegExp(`^[^.]+\\.q\\.${ev.id}\\.\\d+\\.${position}\\.`), JSON.stringify(purchases[0]));
  assert.match(await text(page, "queue-message"), /pass was used/);
  assert.equal(await page.isDisabled('[data-testid="buy"]'), true, "a pass buys once");
  await page.click('[data-testid="order-link"]');
  await page.waitForSelector('[data-testid="order-status"]:has-text("UNPAID")');
  await shot(page, "16-room-order");

  // Bob's page reads sold out, says so plainly (for now: tickets of orders cancelled or
  // left unpaid come back to the line), and asks less often (every 10 s, not 2).
  await other.waitForSelector('[data-testid="queue-state"][data-state="sold_out"]', { timeout: 10_000 });
  const soldAt = Date.now();
  assert.match(await text(other, "queue-message"), /Sold out for now.*come back/);
  assert.equal(await other.isHidden('[data-testid="queue-progress"]'), true);
  assert.equal(await other.isDisabled('[data-testid="buy"]'), true);
  await other.waitForTimeout(2_500);
  assert.deepEqual(polls.filter((t) => t > soldAt), [], "polling slows down once sold out");
  await shot(other, "17-room-sold-out-while-waiting");

  // Dave joins after the units are gone: sold out at once.
  const late = await (await browser.newContext()).newPage();
  await late.goto(`${EDGE}/#/event/${ev.id}`);
  await signIn(late, dave, password);
  await late.waitForSelector('[data-testid="join"]:not([disabled])', { timeout: 5_000 });
  await late.click('[data-testid="join"]');
  await late.waitForSelector('[data-testid="queue-state"][data-state="sold_out"]', { timeout: 10_000 });
  assert.match(await text(late, "queue-message"), /Sold out/);
  assert.equal(await late.isDisabled('[data-testid="buy"]'), true);

  // The dashboard's room panel: four joined, one pass used (Carol's still out).
  const ops = await (await browser.newContext({ viewport: { width: 1400, height: 1200 } })).newPage();
  await ops.goto(`${OPS}/?event=${ev.id}`);
  await ops.fill("#token", ADMIN_TOKEN);
  await ops.click('#connect button[type="submit"]');
  await ops.waitForSelector('[data-testid="state"]:has-text("live")', { timeout: 10_000 });
  await ops.waitForSelector('[data-testid="room"]:not([hidden])', { timeout: 5_000 });
  await ops.waitForFunction(() => {
    const n = (t) => Number(document.querySelector(`[data-testid="${t}"]`).textContent.replace(/,/g, ""));
    return n("room-joined") >= 1 && n("room-passes-used") >= 1;
  }, null, { timeout: 10_000 });
  assert.equal(await text(ops, "room-joined"), "4");
  assert.equal(await text(ops, "room-passes-used"), "1");
  assert.equal(await text(ops, "room-passes-out"), "1");
  assert.equal(await text(ops, "room-enabled"), "on");
  assert.equal(await text(ops, "room-rate"), "5/s");
  assert.equal(await text(ops, "room-drawn"), "yes");
  await shot(ops, "18-ops-waiting-room");

  // Alice cancels her order: its units come back, and Bob's page, still asking, reads
  // his turn (it stopped asking once sold out before: his turn went by unseen).
  page.once("dialog", (d) => d.accept());
  await page.click('[data-testid="cancel"]');
  await page.waitForSelector('[data-testid="order-status"]:has-text("CANCELLED")', { timeout: 10_000 });
  await other.waitForSelector('[data-testid="queue-state"][data-state="your_turn"]', { timeout: 30_000 });
  await other.waitForSelector('[data-testid="buy"]:not([disabled])', { timeout: 5_000 });
  await shot(other, "19-room-turn-after-a-cancellation");
});

test("a waiting room's turn a close interrupts: the page says it is kept, follows the reopen and buys with the new pass", async () => {
  const password = "pw-" + Math.random().toString(36).slice(2);
  const [erin] = await users(1, password);
  const page = await (await browser.newContext({ viewport: { width: 1200, height: 1000 } })).newPage();
  await page.goto(`${EDGE}/`);
  await signIn(page, erin, password);
  const ev = await sale({
    title: "Queue Hall — closed and reopened", ga: 2, limit: 1,
    room: { enabled: true, admit_per_s: 5, pass_ttl_s: 10 },
  });
  const purchases = [];
  page.on("request", (req) => {
    if (req.method() === "POST" && /\/api\/events\/\d+\/orders$/.test(req.url())) purchases.push(req.headers());
  });
  await page.goto(`${EDGE}/#/event/${ev.id}`);
  await page.waitForSelector('[data-testid="join"]:not([disabled])', { timeout: 5_000 });
  await page.click('[data-testid="join"]');
  await page.waitForSelector('[data-testid="queue-state"][data-state="your_turn"]', { timeout: 20_000 });

  // Closed mid-turn: the page says the turn is kept, and goes on following the line.
  await admin("POST", `/admin/events/${ev.id}/close`);
  await page.waitForSelector('[data-testid="queue-state"][data-state="closed"]', { timeout: 10_000 });
  assert.match(await text(page, "queue-message"), /If it reopens, you keep your place in line/);
  assert.equal(await page.isDisabled('[data-testid="buy"]'), true);
  await shot(page, "19-room-closed-mid-turn");
  // Closed longer than the pass's whole lifetime, then reopened.
  await page.waitForTimeout(11_000);
  const reopenedAt = Date.now();
  await admin("POST", `/admin/events/${ev.id}/reopen`);
  await page.waitForSelector('[data-testid="queue-state"][data-state="your_turn"]', { timeout: 10_000 });
  await page.waitForSelector('[data-testid="buy"]:not([disabled])', { timeout: 10_000 });
  await page.click('[data-testid="buy"]');
  await page.waitForSelector('[data-testid="purchase-status"]:has-text("CREATED")', { timeout: 30_000 });
  assert.equal(purchases.length, 1);
  // The pass bought with is the new one: "<kid>.q.<event>.<user>.<id>.<expires_ms>.<sig>",
  // good past the reopen (the one signed before the close ran out during it).
  const pass = (purchases[0]["queue-pass"] || "").split(".");
  assert.equal(pass[2], String(ev.id), JSON.stringify(purchases[0]));
  assert.ok(Number(pass[5]) > reopenedAt, `the pass expires at ${pass[5]}, before the reopen at ${reopenedAt}`);
  await shot(page, "20-room-bought-after-the-reopen");
});

test("the hidden path: the buy button takes a pass (proof of work in the page) and buys with it", async () => {
  const password = "pw-" + Math.random().toString(36).slice(2);
  const [buyer] = await users(1, password);
  const ev = await sale({
    title: "Back Door — hidden path", ga: 5, limit: 1,
    room: { enabled: false, require_pass_at_open: true, challenge_bits: 8 },
  });
  await new Promise((ok) => setTimeout(ok, 1000)); // the edge learns of the new sale
  const page = await (await browser.newContext()).newPage();
  const purchases = [];
  page.on("request", (req) => {
    if (req.method() === "POST" && /\/api\/events\/\d+\/orders$/.test(req.url())) purchases.push(req.headers());
  });
  await page.goto(`${EDGE}/#/event/${ev.id}`);
  await signIn(page, buyer, password);
  await page.waitForSelector('[data-testid="buy"]:not([disabled])', { timeout: 10_000 });
  assert.equal(await page.isHidden('[data-testid="room"]'), true, "no waiting room to show");
  await page.click('[data-testid="buy"]');
  await page.waitForSelector('[data-testid="purchase-status"]:has-text("CREATED")', { timeout: 30_000 });
  assert.equal(purchases.length, 1);
  assert.match(purchases[0]["queue-pass"] || "", new RegExp(`^[^.]+\\.q\\.${ev.id}\\.\\d+\\.h`), JSON.stringify(purchases[0]));
});
