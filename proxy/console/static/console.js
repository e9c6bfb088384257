// wsmode console: reads /console/feed (Server-Sent Events over fetch, so that the proxy's
// key can go in an Authorization header) and renders what it says, its charts drawn by
// charts.js. Everything shown is set with textContent: nothing from the feed is ever parsed
// as HTML.
"use strict";

const FEED = "/console/feed";
const KEY = "wsmode-console-key"; // sessionStorage: this tab only, never a URL
const MAX_CONVERSATIONS = 50;
const MAX_TURNS = 1000;

const view = {
  showContent: false,
  snapshot: null,
  errorsSince: [], // error events after the last snapshot (the next one holds them too)
  conversations: new Map(), // key -> {key, source, continues, turns: []}
  convOf: new Map(), // response id -> conversation key
  turns: 0,
  // the replicas' samples, one per snapshot, for their charts (charts.js): kept by the page
  // across reconnects, the last five minutes of them
  samples: [],
};

let retryDelay = 1000;
let renderQueued = false;

function $(id) { return document.getElementById(id); }

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) tr.appendChild(cell);
  return tr;
}

function num(n) {
  if (n === null || n === undefined) return "—";
  return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

function bytes(n) { return n === null || n === undefined ? "—" : num(n) + " B"; }

// a size at a glance (occupancy): 1.5 KiB, 4.0 GiB
function size(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return i === 0 ? `${v} B` : `${v.toFixed(1)} ${units[i]}`;
}

function ms(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const v = seconds * 1000;
  return (v < 10 ? v.toFixed(1) : Math.round(v).toString()) + " ms";
}

function clock(t) {
  return t ? new Date(t * 1000).toLocaleTimeString() : "—";
}

function setStatus(kind, text) {
  const s = $("status");
  s.className = "status " + kind;
  s.textContent = text;
}

// ---- the feed

function reset() {
  view.snapshot = null;
  view.errorsSince = [];
  view.conversations = new Map();
  view.convOf = new Map();
  view.turns = 0;
}

// Conversations are linked by response id: whole ids with console.show_content, else their
// shortened form (resp_0123abcd…), which links them just as well and names nothing.
function addTurn(t) {
  let key = t.previous_response_id ? view.convOf.get(t.previous_response_id) : undefined;
  if (key !== undefined && !view.conversations.has(key)) key = undefined; // trimmed away
  if (key === undefined) {
    key = t.response_id || `${t.source} run ${t.run}`;
    view.conversations.set(key, {
      key,
      source: t.source,
      continues: t.previous_response_id || null,
      turns: [],
    });
    while (view.conversations.size > MAX_CONVERSATIONS) {
      const oldest = view.conversations.keys().next().value;
      view.turns -= view.conversations.get(oldest).turns.length;
      view.conversations.delete(oldest);
    }
  } else {
    // the conversation moves to the end: most recently active first when rendered
    const conv = view.conversations.get(key);
    view.conversations.delete(key);
    view.conversations.set(key, conv);
  }
  if (t.response_id) view.convOf.set(t.response_id, key);
  view.conversations.get(key).turns.push(t);
  view.turns += 1;
  while (view.turns > MAX_TURNS) {
    const [oldestKey, oldest] = view.conversations.entries().next().value;
    if (view.conversations.size === 1) {
      oldest.turns.shift(); // one long conversation: its first turns go
      view.turns -= 1;
    } else {
      view.turns -= oldest.turns.length;
      view.conversations.delete(oldestKey);
    }
  }
}

function handle(ev) {
  switch (ev.type) {
    case "hello":
      reset();
      view.showContent = !!ev.show_content;
      $("content-mode").textContent = view.showContent
        ? "showing payload text (console.show_content = true)"
        : "payload text and whole response ids hidden (console.show_content = false)";
      retryDelay = 1000;
      setStatus("live", "live");
      break;
    case "state":
      view.snapshot = ev;
      view.errorsSince = [];
      addSample(view.samples, ev);
      break;
    case "turn":
      addTurn(ev);
      break;
    case "error":
      view.errorsSince.push(ev);
      break;
    default:
      return;
  }
  queueRender();
}

function dispatch(chunk) {
  const data = chunk
    .split("\n")
    .filter((line) => line.startsWith("data:"))
    .map((line) => line.slice(5).replace(/^ /, ""))
    .join("\n");
  if (!data) return;
  try {
    handle(JSON.parse(data));
  } catch (err) {
    console.error("console feed: bad event", err);
  }
}

async function connect() {
  const headers = {};
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = "Bearer " + key;
  let res;
  try {
    res = await fetch(FEED, { headers, cache: "no-store", credentials: "omit" });
  } catch (err) {
    return retry("proxy unreachable");
  }
  if (res.status === 401) {
    sessionStorage.removeItem(KEY);
    askForKey(key ? "The proxy refused that key." : "");
    return;
  }
  if (!res.ok) return retry(`feed answered ${res.status}`);
  $("key-form").hidden = true;
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        dispatch(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
      }
    }
  } catch (err) {
    // the connection broke (the proxy restarted, or dropped a page too slow to keep up)
  }
  retry("feed closed");
}

function retry(why) {
  setStatus("reconnecting", `reconnecting (${why})`);
  setTimeout(connect, retryDelay);
  retryDelay = Math.min(retryDelay * 2, 10000);
}

function askForKey(message) {
  setStatus("locked", "key needed");
  $("key-form").hidden = false;
  $("key-error").textContent = message;
  $("key").focus();
}

// ---- rendering

function queueRender() {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => {
    renderQueued = false;
    render();
  });
}

function fill(tbody, rows, columns, emptyText) {
  tbody.replaceChildren();
  if (rows.length === 0) {
    const td = el("td", emptyText, "empty");
    td.colSpan = columns;
    tbody.appendChild(row([td]));
    return;
  }
  for (const r of rows) tbody.appendChild(r);
}

function renderConnections(s) {
  const rows = s.connections.map((c) =>
    row([
      el("td", c.id, "id"),
      el("td", c.remote || "—"),
      el("td", num(c.responses), "num"),
      el("td", num(c.active), "num"),
      el("td", num(c.queued), "num"),
      el("td", size(c.bytes_in), "num"),
      el("td", size(c.bytes_out), "num"),
    ]),
  );
  fill($("connections").tBodies[0], rows, 7, "no WebSocket connection open");
  // a snapshot lists the newest connections only; `connections_open` counts them all
  const open = s.connections_open === undefined ? s.connections.length : s.connections_open;
  $("connections-count").textContent = open > s.connections.length
    ? `(${num(open)}; the newest ${num(s.connections.length)} listed)`
    : `(${num(open)})`;
  $("http-in-flight").textContent = `HTTP requests in flight: ${s.http_in_flight}` +
    (s.draining ? " · draining" : "");
}

function health(u) {
  if (u.ejected) return el("td", "ejected", "health-bad");
  if (u.healthy === true) return el("td", "healthy", "health-ok");
  if (u.healthy === false) return el("td", "unhealthy", "health-bad");
  return el("td", "not checked");
}

function renderSidecar(sc) {
  const r = row([
    el("td", sc.upstream, "id"),
    el("td", sc.websocket_refused ? "refused: plain HTTP" : "on", "ws-mode"),
    el("td", num(sc.upstream_websockets), "num upstream-websockets"),
    el("td", num(sc.chains), "num chains"),
  ]);
  fill($("sidecar").tBodies[0], [r], 4, "");
}

function renderUpstreams(s) {
  const rows = s.upstreams.map((u) =>
    row([
      el("td", u.name),
      el("td", u.url, "id"),
      health(u),
      el("td", num(u.in_flight), "num"),
      el("td", u.max_concurrency ? num(u.max_concurrency) : "no limit", "num"),
    ]),
  );
  fill($("upstreams").tBodies[0], rows, 5, "no upstream");
}

function meter(value, max) {
  const m = document.createElement("meter");
  m.min = 0;
  m.max = max || 1;
  m.value = value || 0;
  m.high = m.max * 0.8;
  return m;
}

function share(value, max) {
  if (!max) return "—";
  return `${((100 * value) / max).toFixed(1)} %`;
}

function memoryRow(name, part) {
  const cells = [el("td", name)];
  if (part.bytes === undefined) {
    cells.push(el("td", part.backend === "off" ? "off" : `${part.backend}: not known here`));
    cells.push(el("td", ""), el("td", ""), el("td", ""));
    return row(cells);
  }
  const entries = part.max_entries !== undefined
    ? `${num(part.entries)} / ${num(part.max_entries)}`
    : "";
  cells.push(el("td", entries, "num"));
  cells.push(el("td", `${size(part.bytes)} / ${size(part.max_bytes)}`, "num"));
  cells.push(el("td", share(part.bytes, part.max_bytes), "num"));
  const td = el("td");
  td.appendChild(meter(part.bytes, part.max_bytes));
  cells.push(td);
  return row(cells);
}

function renderMemory(s) {
  const m = s.memory;
  const rows = [
    memoryRow("cache (connections)", m.cache),
    memoryRow("store", m.store),
    memoryRow("process budget", m.budget),
  ];
  fill($("memory").tBodies[0], rows, 5, "");
}

function cached(t) {
  if (t.cached_tokens === null || t.cached_tokens === undefined) return "—";
  if (!t.input_tokens) return num(t.cached_tokens);
  return `${num(t.cached_tokens)} / ${num(t.input_tokens)} (${share(t.cached_tokens, t.input_tokens)})`;
}

// the token path (docs/tokens.md): prompt ids taken from the token cache, of those sent
function reusedIds(t) {
  if (t.ids_sent === undefined || t.ids_sent === null) return "—";
  const text = `${num(t.ids_reused)} / ${num(t.ids_sent)} (${share(t.ids_reused, t.ids_sent)})`;
  return t.divergence ? `${text}, ${t.divergence}` : text;
}

// the sidecar's page (sidecar.html): what the client sent against the smaller message on
// the socket; the proxy's: what went upstream against what the client sent
function isSidecar() { return $("sidecar") !== null; }

function savedBytes(client, upstream) {
  return isSidecar() ? client - upstream : upstream - client;
}

function turnRow(t, index) {
  const first = t.first_event;
  const saved = savedBytes(t.client_bytes, t.upstream_bytes);
  const cells = [
    el("td", String(index + 1), "num"),
    el("td", t.response_id || "—", "id response-id"),
    el("td", t.lane === null ? "default" : t.lane, "lane"),
    el("td", num(t.new_items), "num new-items"),
    el("td", num(t.output_items), "num output-items"),
    el("td", bytes(t.client_bytes), "num client-bytes"),
    el("td", bytes(t.upstream_bytes), "num upstream-bytes"),
    el("td", saved > 0 ? bytes(saved) : "—", "num saved"),
    el("td", first ? ms(first.proxy) : "—", "num first-proxy"),
    el("td", first ? ms(first.upstream) : "—", "num first-upstream"),
    el("td", t.outcome + (t.refused ? ` (${t.refused})` : ""), `outcome outcome-${t.outcome}`),
    el("td", t.replica || "—", "replica"),
    el("td", cached(t), "num cached"),
    el("td", reusedIds(t), "num reused-ids"),
  ];
  if (isSidecar()) cells.splice(2, 1, el("td", t.via || "—", "via"));
  if (view.showContent) {
    cells.push(el("td", t.input_text || "", "text input-text"));
    cells.push(el("td", t.output_text || "", "text output-text"));
  }
  const tr = row(cells);
  tr.className = "turn";
  return tr;
}

const TURN_HEADS = ["turn", "response", "lane", "new items in", "output items", "client bytes",
  "upstream bytes", "saved", "first event: proxy", "first event: upstream", "outcome",
  "replica", "cached prompt", "prompt ids reused"];

function renderConversation(conv) {
  const box = el("div", null, "conversation");
  const title = conv.source === "http" || conv.source === "sidecar"
    ? (conv.source === "http" ? "HTTP" : "sidecar") : `connection ${conv.source}`;
  const first = conv.turns[0].response_id;
  const what = first ? `conversation from ${first}` : "a turn that got no response";
  box.appendChild(el("h3", `${title}: ${what}` +
    (conv.continues ? ` (continues ${conv.continues})` : "")));
  let client = 0;
  let upstream = 0;
  for (const t of conv.turns) {
    client += t.client_bytes;
    upstream += t.upstream_bytes;
  }
  const summary = el("p", null, "summary");
  const n = conv.turns.length;
  summary.appendChild(el("span", `${n} ${n === 1 ? "turn" : "turns"}`, "turn-count"));
  summary.appendChild(el("span", " · client sent "));
  summary.appendChild(el("span", bytes(client), "total-client-bytes"));
  summary.appendChild(el("span", " · sent upstream "));
  summary.appendChild(el("span", bytes(upstream), "total-upstream-bytes"));
  summary.appendChild(el("span", " · saved "));
  summary.appendChild(el("span", bytes(Math.max(0, savedBytes(client, upstream))), "total-saved"));
  box.appendChild(summary);
  box.appendChild(conversationCharts(conv.turns, savedBytes, { bytes, size, ms }));
  const table = document.createElement("table");
  const base = isSidecar() ? TURN_HEADS.map((h) => (h === "lane" ? "via" : h)) : TURN_HEADS;
  const heads = base.concat(view.showContent ? ["input text", "output text"] : []);
  table.createTHead().appendChild(row(heads.map((h) => el("th", h))));
  const body = table.createTBody();
  conv.turns.forEach((t, i) => body.appendChild(turnRow(t, i)));
  box.appendChild(table);
  return box;
}

function renderConversations() {
  const list = [...view.conversations.values()].reverse();
  const box = $("conversations");
  box.replaceChildren(...list.map(renderConversation));
  if (list.length === 0) box.appendChild(el("p", "no turn yet", "empty"));
  $("turns-count").textContent = `(${view.turns} turns)`;
}

function renderErrors() {
  const all = (view.snapshot ? view.snapshot.errors : []).concat(view.errorsSince);
  const rows = all.slice().reverse().map((e) =>
    row([
      el("td", clock(e.time)),
      el("td", e.where, "id"),
      el("td", e.status === null || e.status === undefined ? "—" : String(e.status), "num"),
      el("td", e.code || "—", "error-code"),
      el("td", e.message || (view.showContent ? "" : "(hidden)"), "text"),
    ]),
  );
  fill($("errors").tBodies[0], rows, 5, "no error");
  $("errors-count").textContent = `(${all.length})`;
}

function render() {
  const s = view.snapshot;
  if (s) {
    // the sidecar's page has fewer panels, and its snapshot says what it shows
    if (s.connections && $("connections")) renderConnections(s);
    if (s.upstreams && $("upstreams")) renderUpstreams(s);
    if ($("replica-charts")) {
      $("replica-charts").replaceChildren(replicaCharts(view.samples, num, share));
    }
    if (s.memory && $("memory")) renderMemory(s);
    if (s.sidecar && $("sidecar")) renderSidecar(s.sidecar);
    const f = s.feed;
    const dialect = s.dialect ? `dialect ${s.dialect} · ` : "";
    $("feed-info").textContent = `${dialect}console pages ${f.pages} · ` +
      `pages dropped for reading too slowly ${f.dropped} · events kept ${f.ring}/${f.ring_size}`;
  }
  renderConversations();
  renderErrors();
}

function start() {
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, $("key").value);
    $("key").value = "";
    $("key-form").hidden = true;
    setStatus("connecting", "connecting");
    connect();
  });
  render();
  connect();
}

document.addEventListener("DOMContentLoaded", start);
