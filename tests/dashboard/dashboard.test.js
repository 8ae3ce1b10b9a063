// The dashboard in headless Chromium: it asks for the server's token (DASHBOARD_TOKEN) and
// keeps it for the tab, shows the pool online, sees it turn degraded after
// `millrace pool fail` (the CLI, through the API), shows the failed drive in a banner, runs a
// scrub from its button behind a confirmation, and leaves a screenshot that must show something.
//
// node dashboard.test.js URL MILLRACE_BIN POOL DRIVE_TO_FAIL OTHER_DRIVE OUT_DIR
// (run.sh sets up the server and the pool, and passes these.)

"use strict";

const { chromium } = require("playwright-core");
const { execFileSync } = require("child_process");
const fs = require("fs");
const os = require("os");
const path = require("path");

const [url, bin, pool, failDrive, otherDrive, outDir] = process.argv.slice(2);
if (!outDir) {
  console.error("usage: node dashboard.test.js URL MILLRACE_BIN POOL DRIVE_TO_FAIL OTHER_DRIVE OUT_DIR");
  process.exit(2);
}
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
// The server's bearer token: the page must ask for it (prompt) and send it.
const TOKEN = process.env.DASHBOARD_TOKEN || "";
const auth = TOKEN ? { Authorization: "Bearer " + TOKEN } : {};

function check(cond, what) {
  if (!cond) throw new Error("dashboard test: " + what);
  console.log("ok: " + what);
}

// Keeps the pool busy so the graphs have something to draw: 256 KiB writes near its end.
async function load(poolSize, seconds) {
  const chunk = Buffer.alloc(256 << 10, 0x5a);
  const until = Date.now() + seconds * 1000;
  const at = poolSize - 8 * chunk.length;
  let i = 0;
  while (Date.now() < until) {
    const off = at + (i++ % 4) * chunk.length;
    const r = await fetch(`${url}/api/v1/pools/${pool}/data?offset=${off}`, { method: "PUT", body: chunk, headers: auth });
    if (!r.ok) throw new Error(`writing to the pool: HTTP ${r.status} ${await r.text()}`);
    await fetch(`${url}/api/v1/pools/${pool}/data?offset=${off}&length=${chunk.length}`, { headers: auth }).then(r => r.arrayBuffer());
  }
}

// Decodes a PNG in the page itself and counts its colours and its banner-red pixels.
async function analyse(page, png) {
  return page.evaluate(async (b64) => {
    const img = new Image();
    img.src = "data:image/png;base64," + b64;
    await img.decode();
    const c = document.createElement("canvas");
    c.width = img.width; c.height = img.height;
    const g = c.getContext("2d");
    g.drawImage(img, 0, 0);
    const d = g.getImageData(0, 0, c.width, c.height).data;
    const colours = new Set();
    let red = 0;
    for (let i = 0; i < d.length; i += 4) {
      colours.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
      if (d[i] > 220 && d[i + 1] > 60 && d[i + 1] < 110 && d[i + 2] > 50 && d[i + 2] < 100) red++;
    }
    return { width: c.width, height: c.height, colours: colours.size, redShare: red / (d.length / 4) };
  }, png.toString("base64"));
}

async function main() {
  fs.mkdirSync(outDir, { recursive: true });
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "millrace-chromium-"));
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1400, height: 1000 },
    args: [
      "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ],
  });
  try {
    const page = browser.pages()[0] || await browser.newPage();
    const pageErrors = [];
    page.on("pageerror", e => pageErrors.push(String(e)));
    // Refused calls show up as "Failed to load resource"; the test provokes one on purpose.
    page.on("console", m => {
      if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) pageErrors.push(m.text());
    });
    // Answers to the page's confirm() and prompt() dialogs, in order: true accepts, false
    // dismisses, a string is typed into a prompt. A dialog nobody expected is dismissed.
    const answers = [];
    page.on("dialog", d => {
      const a = answers.shift();
      if (typeof a === "function") return a(d);
      if (a === undefined || a === false) return d.dismiss();
      return d.accept(typeof a === "string" ? a : undefined);
    });

    const blank = await page.screenshot();
    let prompted = "";
    if (TOKEN) {
      answers.push(d => { prompted = d.message(); return d.accept(TOKEN); });
    }
    await page.goto(url + "/");
    const card = `[data-pool="${pool}"]`;
    await page.waitForSelector(`${card}[data-pool-state="online"]`, { timeout: 15000 });
    check(true, `pool ${pool} shows online`);
    if (TOKEN) {
      check(/token/.test(prompted), "the page asked for the API token");
      check(await page.evaluate(() => sessionStorage.getItem("millrace-token")) === TOKEN,
        "the page keeps the token for this tab (sessionStorage)");
    }
    check(await page.locator("[data-failed-drive]").count() === 0, "no failed-drive banner while all drives are online");
    check(/started /.test(await page.locator("#facts").innerText()), "the header says when the server started");
    check(await page.locator("#restart").isHidden(), "no restart-after-a-crash banner after a clean start");
    check(await page.locator(`${card} tr[data-member-state="online"]`).count() >= 4, "the members are listed online");
    check(await page.locator(`tr[data-export="nvme"]`).count() === 1, "the NVMe/TCP export is listed");
    check(await page.locator(`[data-nvme-listener="tcp"]`).count() === 1, "the NVMe/TCP listener is listed (with hosts per transport)");

    // Some I/O, so the graphs draw; the throughput figure must move off zero.
    const info = await (await fetch(`${url}/api/v1/pools/${pool}`, { headers: auth })).json();
    await load(info.size_bytes, 4);
    await page.waitForFunction(sel => {
      const t = document.querySelector(sel + ' [data-role="tput-now"]');
      return t && !/^0 B\/s \/ 0 B\/s$/.test(t.textContent);
    }, card, { timeout: 5000 }).catch(() => {});
    const tput = await page.locator(`${card} [data-role="tput-now"]`).textContent();
    check(!/^0 B\/s \/ 0 B\/s$/.test(tput), `the throughput graph shows traffic (${tput})`);

    // Traffic goes on through what follows, so the screenshot shows the graphs at work.
    const busy = load(info.size_bytes, 10);

    // A confirmation that is dismissed changes nothing.
    answers.push(false);
    await page.locator(`${card} button[data-action="fail"][data-path="${otherDrive}"]`).click();
    await page.waitForTimeout(1500);
    const member = await (await fetch(`${url}/api/v1/pools/${pool}`, { headers: auth })).json();
    check(member.members.every(m => m.state === "online"), "dismissing 'Mark failed' leaves every drive online");

    // The CLI fails a drive through the API; the page follows.
    const out = execFileSync(bin, ["pool", "fail", pool, failDrive], { encoding: "utf8" });
    check(/degraded/.test(out), `millrace pool fail says the pool is degraded (${out.trim()})`);
    await page.waitForSelector(`${card}[data-pool-state="degraded"]`, { timeout: 10000 });
    check(true, `pool ${pool} turned degraded on the page`);
    const banner = page.locator(`[data-failed-drive="${failDrive}"]`);
    await banner.waitFor({ state: "visible", timeout: 5000 });
    const text = await banner.textContent();
    check(text.includes("DRIVE FAILED") && text.includes(failDrive), "a banner names the failed drive");
    const box = await banner.boundingBox();
    check(box && box.y < 200 && box.height > 40, "the banner sits at the top of the page, and is big");
    check(await page.locator(`${card} tr[data-member="${failDrive}"][data-member-state="faulty"]`).count() === 1,
      "the member table marks the drive faulty");

    // A scrub from its button, behind a confirmation.
    answers.push(true);
    await page.locator(`${card} button[data-action="scrub"]`).click();
    await page.waitForSelector(`tr[data-job-kind="scrub"][data-job-state="done"]`, { timeout: 30000 });
    check(true, "the scrub started from the page ran to its end");
    const msg = await page.locator("#message").textContent();
    check(/job/.test(msg), `the page says what it started (${msg})`);

    // The error of a refused action reaches the user.
    answers.push("/no/such/drive", true);
    await page.locator(`${card} button[data-action="spare"]`).click();
    await page.waitForSelector("#message.error", { timeout: 5000 });
    const err = await page.locator("#message").textContent();
    check(/\/no\/such\/drive/.test(err), `a refused action shows the server's sentence (${err.slice(0, 120)}…)`);

    await busy;
    const shotPath = path.join(outDir, "dashboard.png");
    const shot = await page.screenshot({ path: shotPath, fullPage: true });
    const a = await analyse(page, shot);
    const b = await analyse(page, blank);
    console.log(`screenshot ${shotPath}: ${shot.length} bytes, ${a.width}x${a.height}, ${a.colours} colours, ${(a.redShare * 100).toFixed(1)}% banner red`);
    check(shot.length > 30000, "the screenshot is more than 30 KB");
    check(b.colours <= 2 && a.colours > 200, "the screenshot is no blank page (hundreds of colours)");
    check(a.redShare > 0.005, "the failed-drive banner's red is in the screenshot");
    check(pageErrors.length === 0, "the page logged no errors" + (pageErrors.length ? ": " + pageErrors.join("; ") : ""));
  } finally {
    await browser.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
}

main().then(() => console.log("dashboard test passed"), e => { console.error(e.stack || String(e)); process.exit(1); });
