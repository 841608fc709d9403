// exo dashboard: reads /exo/events (Server-Sent Events over fetch, so the
// API key can go in a header) and renders it; the chat posts to
// /v1/chat/completions. Everything from the cluster or a model is put in
// the page as text (textContent), never as markup: model output cannot run
// script here, and the Content-Security-Policy allows no inline script.
"use strict";

const $ = (id) => document.getElementById(id);

// el builds an element; strings and numbers among the children become text nodes.
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "title") e.title = v;
    else e.setAttribute(k, v);
  }
  for (const k of kids.flat()) {
    if (k === undefined || k === null || k === false) continue;
    e.append(typeof k === "string" || typeof k === "number" ? document.createTextNode(String(k)) : k);
  }
  return e;
}

const fmt = {
  bytes(n) {
    if (!n && n !== 0) return "–";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n : n.toFixed(n < 10 ? 2 : 1)) + " " + u[i];
  },
  rate(bps) { return bps > 0 ? (bps / 1e9).toFixed(bps < 1e8 ? 3 : 2) + " GB/s" : "–"; },
  s(x) {
    if (!x) return "–";
    return x < 1 ? (x * 1000).toFixed(x < 0.01 ? 1 : 0) + " ms" : x.toFixed(2) + " s";
  },
  offset(x, pm) {
    const ms = Math.round(x * 1000);
    return (ms >= 0 ? "+" : "") + ms + " ms ±" + Math.max(1, Math.round(pm * 1000)) + " ms";
  },
  time(t) { return new Date(t).toLocaleTimeString(); },
  pct(x) { return Math.round(x * 100) + "%"; },
  ago(t) {
    const s = Math.max(0, (Date.now() - new Date(t).getTime()) / 1000);
    if (s < 60) return Math.round(s) + "s";
    if (s < 3600) return Math.round(s / 60) + "m";
    return Math.round(s / 3600) + "h";
  },
};

// ---- the API key -----------------------------------------------------------

const auth = {
  key: sessionStorage.getItem("exo-api-key") || "",
  headers(extra) {
    const h = Object.assign({}, extra || {});
    if (this.key) h["Authorization"] = "Bearer " + this.key;
    return h;
  },
};

function askKey(message) {
  $("login").hidden = false;
  document.querySelectorAll(".view").forEach((v) => v.classList.remove("active"));
  $("login-error").textContent = message || "";
  $("login-key").focus();
}

$("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  auth.key = $("login-key").value.trim();
  sessionStorage.setItem("exo-api-key", auth.key);
  $("login").hidden = true;
  showTab();
  connect();
});

// ---- tabs --------------------------------------------------------------------

function showTab() {
  const name = (location.hash || "#overview").slice(1);
  const views = { overview: "view-overview", live: "view-live", chat: "view-chat" };
  const id = views[name] || "view-overview";
  document.querySelectorAll(".view").forEach((v) => v.classList.toggle("active", v.id === id));
  document.querySelectorAll(".tab").forEach((t) => t.classList.toggle("active", t.id === "tab-" + id.slice(5)));
  if (id === "view-live") drawCharts();
}
window.addEventListener("hashchange", showTab);

// ---- the event stream -----------------------------------------------------------

const live = { state: null, requests: new Map(), conn: null };

function setConn(text, ok) {
  const c = $("conn");
  c.textContent = text;
  c.classList.toggle("ok", !!ok);
  c.classList.toggle("bad", !ok);
}

async function connect() {
  if (live.conn) live.conn.abort();
  const ctl = new AbortController();
  live.conn = ctl;
  let wait = 500;
  while (!ctl.signal.aborted) {
    try {
      const resp = await fetch("/exo/events", { headers: auth.headers({ Accept: "text/event-stream" }), signal: ctl.signal, cache: "no-store" });
      if (resp.status === 401) {
        setConn("API key needed", false);
        askKey(auth.key ? "That key was refused." : "");
        return;
      }
      if (!resp.ok) throw new Error(resp.status + " " + resp.statusText);
      setConn("live", true);
      wait = 500;
      await readSSE(resp.body, (name, data) => {
        if (name === "state") onState(JSON.parse(data));
        else if (name === "requests") onRequests(JSON.parse(data));
      });
    } catch (e) {
      if (ctl.signal.aborted) return;
      setConn("reconnecting (" + (e.message || e) + ")", false);
    }
    await new Promise((r) => setTimeout(r, wait));
    wait = Math.min(wait * 2, 5000);
  }
}

// readSSE calls on(event, data) for each event of a text/event-stream body.
async function readSSE(body, on) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  let name = "message", data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      let line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      if (line.endsWith("\r")) line = line.slice(0, -1);
      if (line === "") {
        if (data.length) on(name, data.join("\n"));
        name = "message"; data = [];
      } else if (line.startsWith("event:")) name = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
  }
}

function onState(st) {
  if (!live.state) performance.mark("exo-first-state"); // first render of cluster data (docs/BENCHMARKS.md)
  live.state = st;
  $("cluster-name").textContent = st.cluster + " · via " + st.host;
  document.title = "exo · " + st.cluster;
  renderHosts(st);
  renderLinks(st);
  renderModels(st);
  fillModelPicker(st);
}

function onRequests(list) {
  for (const r of list) live.requests.set(r.key, r);
  // Keep the latest 300.
  if (live.requests.size > 300) {
    const keys = [...live.requests.values()].sort((a, b) => new Date(a.start) - new Date(b.start)).map((r) => r.key);
    for (const k of keys.slice(0, keys.length - 300)) live.requests.delete(k);
  }
  renderRequests();
  drawCharts();
  chatNoteRoutes();
}

// ---- cluster -------------------------------------------------------------------

function meter(used, total) {
  const f = total > 0 ? Math.min(1, used / total) : 0;
  const fill = el("span", { class: "fill" + (f > 0.9 ? " hot" : "") });
  fill.style.width = (f * 100).toFixed(1) + "%"; // CSSOM, which the CSP allows (a style attribute it would not)
  return el("span", { class: "meter", title: fmt.pct(f) }, fill);
}

function renderHosts(st) {
  const box = $("hosts");
  box.replaceChildren(...st.hosts.map((h) => {
    const v = h.view;
    const rows = [];
    rows.push(el("div", { class: "kv" }, el("span", {}, "address"), el("span", {}, h.address)));
    rows.push(el("div", { class: "kv" }, el("span", {}, "backend"), el("span", {}, h.backend)));
    if (v && v.memory) {
      const m = v.memory;
      rows.push(el("div", { class: "kv" }, el("span", {}, "memory"),
        el("span", {}, meter(m.used_bytes, m.total_bytes), " " + fmt.bytes(m.used_bytes) + " / " + fmt.bytes(m.total_bytes))));
    } else if (v && v.memory_error) {
      rows.push(el("div", { class: "kv" }, el("span", {}, "memory"), el("span", { class: "muted" }, v.memory_error)));
    }
    for (const g of (v && v.gpus) || []) {
      const parts = [];
      if (g.utilization_ratio !== undefined) parts.push(fmt.pct(g.utilization_ratio) + " busy");
      if (g.memory_used_bytes !== undefined) parts.push(fmt.bytes(g.memory_used_bytes) + " / " + fmt.bytes(g.memory_total_bytes));
      if (g.temperature_celsius !== undefined) parts.push(g.temperature_celsius + " °C");
      if (g.power_watts !== undefined) parts.push(Math.round(g.power_watts) + " W");
      rows.push(el("div", { class: "kv" }, el("span", {}, "gpu " + g.index),
        el("span", {}, g.utilization_ratio !== undefined ? meter(g.utilization_ratio, 1) : "", " " + (g.name ? g.name + ": " : "") + parts.join(", "))));
    }
    if (h.up) {
      rows.push(el("div", { class: "kv" }, el("span", {}, "clock"), el("span", {}, h.name === st.host ? "reference" : fmt.offset(h.clock_offset_s, h.clock_uncertainty_s))));
      if (!h.same_config) rows.push(el("div", { class: "warn" }, "runs a different cluster file"));
      if (v && v.last_reload && v.last_reload.error) rows.push(el("div", { class: "warn" }, "last reload failed: " + v.last_reload.error.split("\n")[0]));
    } else {
      rows.push(el("div", { class: "error" }, h.error || "not answering"));
    }
    return el("div", { class: "host " + (h.up ? "up" : "down"), "data-host": h.name },
      el("div", { class: "host-head" }, el("span", { class: "dot" }), el("b", {}, h.name),
        el("span", { class: "badge " + (h.up ? "ok" : "bad") }, h.up ? "supervisor up" : "supervisor down")),
      rows);
  }));
}

function renderLinks(st) {
  const box = $("links");
  if (!st.links.length) {
    box.replaceChildren(el("p", { class: "muted" }, "No prefill links (no decode runner with prefill endpoints is up)."));
    return;
  }
  box.replaceChildren(...st.links.map((l) => el("div", { class: "link", "data-endpoint": l.endpoint },
    el("span", { class: "badge " + (l.up ? "ok" : "bad") }, l.up ? "up" : "skipped"),
    el("b", {}, l.decode_host), el("span", { class: "muted" }, "←"), el("b", {}, l.prefill_host || "?"),
    el("span", { class: "mono muted" }, l.endpoint),
    el("span", {}, l.kind + (l.interface ? " (" + l.interface + ")" : "")),
    el("span", {}, "goodput " + fmt.rate(l.goodput_bytes_per_s || l.last_goodput_bytes_per_s) + (l.goodput_bytes_per_s ? "" : l.last_goodput_bytes_per_s ? " (last transfer)" : "")))));
}

function stateClass(s) {
  return { ready: "ok", starting: "warn", waiting: "warn", unhealthy: "bad", backoff: "bad", crashloop: "bad", stopped: "muted", unknown: "muted" }[s] || "muted";
}

function renderModels(st) {
  const box = $("models");
  box.replaceChildren(...st.models.map((m) => el("div", { class: "model", "data-model": m.name },
    el("div", { class: "model-head" }, el("b", {}, m.name),
      el("span", { class: "badge " + (m.ready_decode > 0 ? "ok" : "bad") }, m.ready_decode + "/" + m.decode + " decode ready")),
    (m.placements || []).map((p) => placementLines(p)),
    el("div", { class: "runners" }, m.runners.map((r) => runnerCard(r))))));
}

// placementLines: a pipeline's or tensor group's placement (its stages'
// hosts and layer ranges, the memory each host counted, or whom it waits
// for), as the answering host computed it.
function placementLines(p) {
  const what = p.role + " " + p.shard + (p.groups ? " group " + p.group + " of " + p.groups : "");
  const unit = p.shard === "tensor" ? "rank" : "stage";
  // A stage of tensor ranks (p.ranks) names its ranks' hosts, rank 0 first.
  const hostsOf = (s, i) => p.ranks > 1 ? (p.hosts || []).slice(i * p.ranks, (i + 1) * p.ranks).join("+") || s.host : s.host;
  const stages = (p.stages || []).map((s, i) => unit + " " + i + " " + hostsOf(s, i) + (p.shard === "tensor" ? "" : " layers " + s.layer_start + ":" + s.layer_end)).join(" · ");
  const mem = (p.memory || []).map((m) => m.host + " " + (m.bytes ? fmt.bytes(m.bytes) + " " : "") + "(" + (m.source === "file" ? "memory_gib" : m.source) + ")").join(", ");
  const lines = [el("div", { class: "kv" }, el("span", {}, "placement"), el("span", {}, what + (stages ? ": " + stages : "")))];
  if (mem) lines.push(el("div", { class: "kv" }, el("span", {}, "memory"), el("span", {}, mem)));
  if (p.waiting) lines.push(el("div", { class: "kv" }, el("span", {}, "waiting"), el("span", {}, p.note)));
  return el("div", { class: "placement", "data-placement": p.role + (p.groups ? "/" + p.group : ""), "data-waiting": p.waiting ? p.waiting.join(",") : "" }, lines);
}

function runnerCard(r) {
  const lines = [];
  let state = r.state;
  if (r.health === "loading" && r.state === "starting") state = "loading";
  lines.push(el("div", { class: "kv" }, el("span", {}, "source"), el("span", { class: "mono" }, r.source)));
  if (r.stage || r.tensor) {
    lines.push(el("div", { class: "kv shard" }, el("span", {}, r.stage ? "stage" : "rank"),
      el("span", {}, r.stage ? r.stage + (r.layers ? " · layers " + r.layers : "") + (r.tensor ? " · rank " + r.tensor : "") : r.tensor)));
  }
  if (r.state === "waiting" && r.last_error) {
    lines.push(el("div", { class: "kv" }, el("span", {}, "waiting"), el("span", {}, r.last_error)));
  }
  if (r.health === "loading") {
    const what = r.phase === "download" ? "downloading" : r.phase === "load" ? "loading weights" : "loading";
    const bytes = r.total_bytes ? " · " + fmt.bytes(r.done_bytes || 0) + " / " + fmt.bytes(r.total_bytes) : "";
    const eta = r.load_eta_s ? " · about " + fmt.s(r.load_eta_s) + " left" + (r.phase === "download" ? " to download" : "") : "";
    lines.push(el("div", { class: "kv load" }, el("span", {}, what),
      el("span", {}, meter(r.progress || 0, 1), " " + fmt.pct(r.progress || 0) + bytes + eta)));
  }
  if (r.state === "ready" && r.role === "decode") {
    lines.push(el("div", { class: "kv" }, el("span", {}, "queue"), el("span", {}, r.waiting + " waiting, " + r.running + " in flight")));
  }
  if (r.engine_memory) {
    const m = r.engine_memory;
    lines.push(el("div", { class: "kv" }, el("span", {}, "MLX memory"),
      el("span", {}, fmt.bytes(m.active_bytes) + " active, " + fmt.bytes(m.cache_bytes) + " cache, " + fmt.bytes(m.peak_bytes) + " peak")));
  }
  if (r.state === "ready" && r.role === "prefill") {
    lines.push(el("div", { class: "kv" }, el("span", {}, "queue"), el("span", {}, r.waiting + " waiting, " + r.running + " running")));
  }
  if (r.stage_transport) {
    const t = r.stage_transport;
    lines.push(el("div", { class: "kv", title: t.detail || "" }, el("span", {}, "hidden states"),
      el("span", {}, t.transport === "tcp" ? "stage link (TCP)" + (t.reason ? ": " + t.reason : "") : t.transport === "mlx" ? "MLX's ring" : t.transport)));
  }
  for (const e of r.prefill_endpoints || []) {
    lines.push(el("div", { class: "kv" }, el("span", {}, "prefill"), el("span", {}, e.addr + " " + (e.state === "closed" ? "used" : "skipped") + (e.state !== "closed" && e.last_error ? " (" + e.last_error + ")" : ""))));
  }
  if (r.restarts > 0 || r.last_exit) {
    lines.push(el("div", { class: "kv restarts" }, el("span", {}, "restarts"),
      el("span", {}, String(r.restarts) + (r.last_exit ? " · last: " + r.last_exit : "") + (r.last_error && r.state !== "ready" ? " · " + r.last_error : ""))));
  }
  if (r.next_start) {
    lines.push(el("div", { class: "kv" }, el("span", {}, "restart in"), el("span", {}, fmt.s(Math.max(0, (new Date(r.next_start) - Date.now()) / 1000)))));
  }
  const hist = (r.history || []).slice(-6);
  if (hist.length > 1) {
    lines.push(el("div", { class: "history" }, hist.map((t, i) => el("span", { class: "step " + stateClass(t.state), title: fmt.time(t.at) + (t.reason ? " · " + t.reason : "") },
      (i ? "→ " : "") + t.state))));
  }
  return el("div", { class: "runner", "data-runner": r.host + "/" + r.runner, "data-state": r.state, "data-restarts": r.restarts },
    el("div", { class: "runner-head" },
      el("span", { class: "role " + r.role }, r.role),
      el("b", {}, r.host), el("span", { class: "muted mono" }, r.runner),
      el("span", { class: "badge state " + stateClass(r.state) }, state + (r.state === "ready" && r.since ? " " + fmt.ago(r.since) : ""))),
    lines);
}

// ---- live P/D --------------------------------------------------------------------

function sortedRequests() {
  return [...live.requests.values()].sort((a, b) => new Date(a.start) - new Date(b.start));
}

function routeText(r) {
  // Without a cost model (remote_prefill_route = "floor") the floor alone decided.
  const why = r.route === "remote" ? (r.reason || "floor") : (r.outcome || r.reason);
  return r.route + (why ? " (" + why + ")" : "");
}

function renderRequests() {
  const rows = sortedRequests().slice(-100).reverse();
  $("requests").tBodies[0].replaceChildren(...rows.map((r) => el("tr", { class: r.route + (r.error ? " failed" : ""), "data-key": r.key, "data-route": r.route },
    el("td", { class: "c-time" }, fmt.time(r.start)),
    el("td", { class: "c-route" }, el("span", { class: "route " + r.route }, routeText(r)), r.prefill_host ? " ← " + r.prefill_host : ""),
    el("td", { class: "num c-ttft" }, r.done || r.ttft_s ? fmt.s(r.ttft_s) : "…"),
    el("td", { class: "num c-prompt" }, r.prompt_tokens),
    el("td", { class: "num c-cached" }, r.cached_tokens),
    el("td", { class: "num c-fill" }, fmt.s(r.fill_s) + (r.predicted_fill_s ? " (" + fmt.s(r.predicted_fill_s) + ")" : "")),
    el("td", { class: "num c-kv" }, r.kv_bytes ? fmt.bytes(r.kv_bytes) + " in " + fmt.s(r.kv_transfer_s) : "–"),
    el("td", { class: "num c-tps" }, r.tokens_per_s ? r.tokens_per_s.toFixed(1) : "–"),
    el("td", { class: "c-out" }, r.error ? el("span", { class: "error" }, r.error) : r.done ? String(r.completion_tokens) + " tok" : "running"),
    el("td", { class: "c-model" }, r.model),
    el("td", { class: "c-decode" }, r.host + "/" + r.runner))));
}

const chartWindow = 10 * 60 * 1000; // the last ten minutes

function canvasCtx(id) {
  const c = $(id);
  const dpr = window.devicePixelRatio || 1;
  const w = c.clientWidth || 360, h = c.clientHeight || 140;
  if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
    c.width = Math.round(w * dpr);
    c.height = Math.round(h * dpr);
  }
  const g = c.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  return { g, w, h };
}

function css(name) { return getComputedStyle(document.body).getPropertyValue(name).trim(); }

// axes draws the frame and returns (t, v) → (x, y) for values 0..vmax.
function axes(g, w, h, vmax, label) {
  const left = 38, bottom = 16;
  g.strokeStyle = css("--line");
  g.fillStyle = css("--muted");
  g.font = "10px system-ui, sans-serif";
  g.beginPath();
  g.moveTo(left, 4); g.lineTo(left, h - bottom); g.lineTo(w - 4, h - bottom);
  g.stroke();
  g.fillText(label(vmax), 2, 12);
  g.fillText(label(0), 2, h - bottom);
  g.fillText("-10 min", left, h - 3);
  g.fillText("now", w - 26, h - 3);
  const now = Date.now();
  return (t, v) => [left + (w - 4 - left) * (1 - (now - t) / chartWindow), (h - bottom) - (h - bottom - 6) * (v / vmax)];
}

function drawCharts() {
  if (!$("view-live").classList.contains("active")) return;
  const since = Date.now() - chartWindow;
  const rs = sortedRequests().filter((r) => r.done && new Date(r.start).getTime() >= since);
  const colors = { remote: css("--remote"), local: css("--local") };
  const scatter = (id, val, label) => {
    const { g, w, h } = canvasCtx(id);
    const pts = rs.filter((r) => val(r) > 0);
    const vmax = Math.max(...pts.map(val), 0) * 1.1 || 1;
    const xy = axes(g, w, h, vmax, label);
    for (const r of pts) {
      const [x, y] = xy(new Date(r.start).getTime(), val(r));
      g.fillStyle = colors[r.route] || colors.local;
      g.beginPath(); g.arc(x, y, 3, 0, 2 * Math.PI); g.fill();
    }
  };
  scatter("chart-ttft", (r) => r.ttft_s, (v) => v.toFixed(v < 0.1 ? 3 : v < 1 ? 2 : 1));
  scatter("chart-tps", (r) => r.tokens_per_s, (v) => v.toFixed(0));
  const { g, w, h } = canvasCtx("chart-share");
  const xy = axes(g, w, h, 1, (v) => Math.round(v * 100) + "%");
  const bucket = 30 * 1000;
  const bins = new Map();
  for (const r of rs) {
    const b = Math.floor(new Date(r.start).getTime() / bucket);
    const x = bins.get(b) || { n: 0, remote: 0 };
    x.n++; if (r.route === "remote") x.remote++;
    bins.set(b, x);
  }
  g.fillStyle = colors.remote;
  for (const [b, x] of bins) {
    const [x0, y] = xy(b * bucket, x.remote / x.n);
    const [x1] = xy((b + 1) * bucket, 0);
    const [, y0] = xy(0, 0);
    g.fillRect(x0 + 1, y, Math.max(1, x1 - x0 - 2), y0 - y);
  }
}
window.addEventListener("resize", drawCharts);

// ---- chat -------------------------------------------------------------------------

const chat = { messages: [], busy: false, pending: [] };

function fillModelPicker(st) {
  const sel = $("chat-model");
  const names = st.models.map((m) => m.name);
  const have = [...sel.options].map((o) => o.value);
  if (names.join("\n") === have.join("\n")) {
    for (const o of sel.options) {
      const m = st.models.find((x) => x.name === o.value);
      o.textContent = m.name + (m.ready_decode > 0 ? "" : " (not ready)");
    }
    return;
  }
  const cur = sel.value;
  sel.replaceChildren(...st.models.map((m) => el("option", { value: m.name }, m.name + (m.ready_decode > 0 ? "" : " (not ready)"))));
  if (names.includes(cur)) sel.value = cur;
}

$("chat-clear").addEventListener("click", () => {
  chat.messages = [];
  $("chat-log").replaceChildren();
});

$("chat-input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) {
    ev.preventDefault();
    $("chat-form").requestSubmit();
  }
});

$("chat-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("chat-input").value;
  if (!text.trim() || chat.busy) return;
  $("chat-input").value = "";
  send(text);
});

function num(id) {
  const v = parseFloat($(id).value);
  return Number.isFinite(v) ? v : undefined;
}

async function send(text) {
  chat.busy = true;
  $("chat-send").disabled = true;
  chat.messages.push({ role: "user", content: text });
  const log = $("chat-log");
  log.append(el("div", { class: "msg user" }, el("div", { class: "who" }, "you"), el("div", { class: "body" }, text)));
  const reasoning = el("pre", { class: "reasoning-text" });
  const reasoningBox = el("details", { class: "reasoning", hidden: true }, el("summary", {}, "reasoning"), reasoning);
  const content = el("div", { class: "body content" });
  const calls = el("div", { class: "calls" });
  const meta = el("div", { class: "meta" }, "waiting…");
  const msg = el("div", { class: "msg assistant streaming" }, el("div", { class: "who" }, "assistant"), reasoningBox, content, calls, meta);
  log.append(msg);
  log.scrollTop = log.scrollHeight;

  const model = $("chat-model").value;
  const body = { model, stream: true, stream_options: { include_usage: true }, messages: [] };
  const sys = $("chat-system").value.trim();
  if (sys) body.messages.push({ role: "system", content: sys });
  body.messages.push(...chat.messages);
  const t = num("chat-temp"), p = num("chat-topp"), mx = num("chat-max");
  if (t !== undefined) body.temperature = t;
  if (p !== undefined) body.top_p = p;
  if (mx !== undefined) body.max_tokens = Math.round(mx);
  const extraText = $("chat-extra").value.trim();
  let extraErr = "";
  if (extraText) {
    try {
      const extra = JSON.parse(extraText);
      if (typeof extra !== "object" || extra === null || Array.isArray(extra)) throw new Error("not a JSON object");
      for (const [k, v] of Object.entries(extra)) {
        if (k === "messages" || k === "stream") throw new Error('"' + k + '" is set by the chat');
        body[k] = v;
      }
    } catch (e) {
      extraErr = "more request fields: " + (e.message || e);
    }
  }

  const t0 = performance.now();
  const sent = Date.now();
  let first = 0, answer = "", thought = "", usage = null, finish = "";
  const toolCalls = [];
  let chunks = 0;
  try {
    if (extraErr) throw new Error(extraErr);
    const resp = await fetch("/v1/chat/completions", { method: "POST", headers: auth.headers({ "Content-Type": "application/json" }), body: JSON.stringify(body) });
    const runner = resp.headers.get("X-Exo-Runner") || "";
    if (!resp.ok) {
      let m = resp.status + " " + resp.statusText;
      try { m = (await resp.json()).error.message || m; } catch (_) { /* not JSON */ }
      throw new Error(m);
    }
    await readSSE(resp.body, (_name, data) => {
      if (data === "[DONE]") return;
      const ch = JSON.parse(data);
      if (ch.usage) usage = ch.usage;
      for (const c of ch.choices || []) {
        const d = c.delta || {};
        if ((d.content || d.reasoning_content || d.tool_calls) && !first) first = performance.now();
        if (d.reasoning_content) {
          thought += d.reasoning_content;
          reasoning.textContent = thought;
          reasoningBox.hidden = false;
        }
        if (d.content) {
          answer += d.content;
          content.textContent = answer;
          msg.dataset.chunks = String(++chunks);
        }
        for (const tc of d.tool_calls || []) {
          const i = tc.index || 0;
          toolCalls[i] = toolCalls[i] || { id: "", name: "", args: "" };
          if (tc.id) toolCalls[i].id = tc.id;
          if (tc.function && tc.function.name) toolCalls[i].name += tc.function.name;
          if (tc.function && tc.function.arguments) toolCalls[i].args += tc.function.arguments;
          calls.replaceChildren(...toolCalls.filter(Boolean).map((x) => el("div", { class: "call" }, el("span", { class: "call-label" }, "call"), el("code", {}, x.name + "(" + x.args + ")"))));
        }
        if (c.finish_reason) finish = c.finish_reason;
      }
      log.scrollTop = log.scrollHeight;
    });
    const t1 = performance.now();
    const made = toolCalls.filter(Boolean);
    if (made.length) {
      chat.messages.push({ role: "assistant", content: answer || null,
        tool_calls: made.map((x, i) => ({ id: x.id || "call_" + i, type: "function", function: { name: x.name, arguments: x.args } })) });
    } else {
      chat.messages.push({ role: "assistant", content: answer });
    }
    const parts = [runner ? "served by " + runner : ""];
    if (first) parts.push("TTFT " + fmt.s((first - t0) / 1000));
    if (usage) {
      parts.push(usage.prompt_tokens + " prompt tokens" + (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens ? " (" + usage.prompt_tokens_details.cached_tokens + " cached)" : ""));
      parts.push(usage.completion_tokens + " generated");
      if (first && usage.completion_tokens > 1 && t1 > first) parts.push(((usage.completion_tokens - 1) / ((t1 - first) / 1000)).toFixed(1) + " tok/s");
    }
    if (finish) parts.push("finish " + finish);
    meta.replaceChildren(el("span", { class: "route-line" }), " " + parts.filter(Boolean).join(" · "));
    chat.pending.push({ meta, runner, sent, usage });
    chatNoteRoutes();
  } catch (e) {
    meta.replaceChildren(el("span", { class: "error" }, "error: " + (e.message || e)));
    chat.messages.pop();
  } finally {
    msg.classList.remove("streaming");
    chat.busy = false;
    $("chat-send").disabled = false;
  }
}

// chatNoteRoutes puts each answer's route, as its decode runner recorded
// it, under the answer once the record arrives in the live stream: the
// newest finished record of that runner with the same token counts, started
// after the question was sent.
function chatNoteRoutes() {
  const clockSkew = 5000; // the decode host's clock may differ a little
  chat.pending = chat.pending.filter((p) => {
    if (!p.usage) return false;
    const rec = sortedRequests().reverse().find((r) => r.done && p.runner === r.host + "/" + r.runner &&
      r.prompt_tokens === p.usage.prompt_tokens && r.completion_tokens === p.usage.completion_tokens &&
      new Date(r.start).getTime() >= p.sent - clockSkew);
    if (!rec) return true;
    const line = p.meta.querySelector(".route-line");
    const bits = ["route " + routeText(rec)];
    if (rec.prefill_host) bits.push("prefill on " + rec.prefill_host);
    bits.push("fill " + fmt.s(rec.fill_s) + (rec.predicted_fill_s ? " (predicted " + fmt.s(rec.predicted_fill_s) + ")" : ""));
    if (rec.kv_bytes) bits.push("KV " + fmt.bytes(rec.kv_bytes) + " in " + fmt.s(rec.kv_transfer_s));
    line.textContent = bits.join(" · ") + " ·";
    line.classList.add(rec.route);
    return false;
  });
}

// ---- start ------------------------------------------------------------------------

showTab();
connect();
setInterval(() => { if (live.state) renderModels(live.state); }, 5000); // keep "ready 3m" and restart timers current
