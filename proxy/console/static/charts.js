// wsmode console: its charts, drawn as SVG by this script (no library, nothing fetched).
// Numbers become coordinates; every piece of text, a replica's name included, is set with
// textContent, never parsed as markup. console.js calls the three entry points:
// conversationCharts (a conversation's bytes and time to first event, turn by turn),
// addSample and replicaCharts (the replicas over the last minutes).
"use strict";

// the SVG namespace is a name, not an address: nothing is fetched from it
const SVG_NS = "http://www.w3.org/2000/svg";
const W = 520; // every chart's coordinates (its viewBox); the page scales it
const H = 210;
const BOX = { left: 62, right: W - 14, top: 46, bottom: H - 40 };
const WINDOW = 300; // seconds of replica samples kept and shown at most: five minutes
const MIN_SPAN = 30; // seconds the time axis covers at least (a page just opened)
const MAX_SAMPLES = 600; // kept at most, whatever console.state_interval is
const SERIES = 6; // colours of replica series (console.css .series-0 …), then again

function svg(tag, attrs, cls) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  if (cls) node.setAttribute("class", cls);
  return node;
}

function label(x, y, text, cls, anchor) {
  const node = svg("text", { x, y, "text-anchor": anchor || "start" }, cls);
  node.textContent = String(text);
  return node;
}

function tip(node, text) {
  const title = svg("title");
  title.textContent = text;
  node.appendChild(title);
  return node;
}

// 1, 2, 5 times a power of ten, at least `v`: the top of an axis, its half a round number
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 5, 10]) if (m * p >= v * (1 - 1e-9)) return m * p;
  return 10 * p;
}

function yOf(v, max) {
  return BOX.bottom - (Math.max(0, v) / max) * (BOX.bottom - BOX.top);
}

// a chart: its frame, the y axis (0, half, top) with gridlines and the axis's name
function frame(cls, title, max, format, yName) {
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" }, `chart ${cls}`);
  root.appendChild(label(8, 15, title, "chart-title"));
  for (const v of [0, max / 2, max]) {
    const y = yOf(v, max);
    root.appendChild(svg("line", { x1: BOX.left, x2: BOX.right, y1: y, y2: y }, "grid"));
    root.appendChild(label(BOX.left - 6, y + 4, format(v), "tick y-tick", "end"));
  }
  const name = label(14, (BOX.top + BOX.bottom) / 2, yName, "axis-label y-label", "middle");
  name.setAttribute("transform", `rotate(-90 14 ${(BOX.top + BOX.bottom) / 2})`);
  root.appendChild(name);
  return root;
}

// a line of swatches and their names under the title, left to right
function legend(root, entries) {
  let x = 8;
  for (const [text, cls] of entries) {
    root.appendChild(svg("rect", { x, y: 22, width: 10, height: 10 }, `swatch ${cls}`));
    root.appendChild(label(x + 14, 31, text, "legend-text"));
    x += 14 + 7 * text.length + 16; // a character is about 6 to 7 units at the chart's font
  }
}

// the x axis of turns: a slot per turn, numbered (every k-th when there are many)
function turnAxis(root, n) {
  const slot = (BOX.right - BOX.left) / Math.max(1, n);
  const every = Math.ceil(n / 16);
  for (let i = 0; i < n; i += 1) {
    if (i % every === 0 || i === n - 1) {
      const x = BOX.left + (i + 0.5) * slot;
      root.appendChild(label(x, BOX.bottom + 14, i + 1, "tick x-tick", "middle"));
    }
  }
  root.appendChild(label((BOX.left + BOX.right) / 2, H - 8, "turn", "axis-label x-label", "middle"));
  return slot;
}

function bar(x, width, from, to, max, cls, value) {
  const top = yOf(to, max);
  const height = Math.max(0, yOf(from, max) - top);
  return svg("rect", { x, y: top, width, height, "data-value": value }, cls);
}

// ---- a conversation

// client bytes against upstream bytes per turn, and the saving so far (`saved(client,
// upstream)`: the page's rule; never below 0, as the conversation's summary says).
// `f.bytes`: exact sizes (the label, the tips); `f.size`: the axis's
function bytesChart(turns, saved, f) {
  const format = f.bytes;
  let client = 0;
  let upstream = 0;
  const cumulative = turns.map((t) => {
    client += t.client_bytes;
    upstream += t.upstream_bytes;
    return Math.max(0, saved(client, upstream));
  });
  const top = Math.max(1, ...turns.map((t) => Math.max(t.client_bytes, t.upstream_bytes)),
    ...cumulative);
  const max = niceMax(top);
  const root = frame("bytes-chart", "bytes per turn", max, f.size, "bytes");
  legend(root, [["client bytes", "client"], ["upstream bytes", "upstream"],
    ["saved so far", "saved"]]);
  const slot = turnAxis(root, turns.length);
  const width = Math.min(slot * 0.34, 24);
  turns.forEach((t, i) => {
    const x = BOX.left + (i + 0.5) * slot;
    const g = svg("g", {}, "turn-bars");
    g.appendChild(bar(x - width, width, 0, t.client_bytes, max, "bar client", t.client_bytes));
    g.appendChild(bar(x, width, 0, t.upstream_bytes, max, "bar upstream", t.upstream_bytes));
    root.appendChild(tip(g, `turn ${i + 1}: the client sent ${format(t.client_bytes)}, ` +
      `wsmode sent ${format(t.upstream_bytes)} upstream, ${format(cumulative[i])} saved so far`));
  });
  const points = cumulative.map((v, i) => `${BOX.left + (i + 0.5) * slot},${yOf(v, max)}`);
  root.appendChild(svg("polyline", { points: points.join(" ") }, "line saved"));
  cumulative.forEach((v, i) => {
    const dot = svg("circle", { cx: BOX.left + (i + 0.5) * slot, cy: yOf(v, max), r: 2.5,
      "data-value": v }, "dot saved");
    root.appendChild(dot);
  });
  const last = cumulative.length ? cumulative[cumulative.length - 1] : 0;
  root.appendChild(label(BOX.right, 15, `saved so far ${format(last)}`, "saved-label", "end"));
  return root;
}

// the parts of a turn's time to first event, bottom up (docs/console.md "The charts")
const FIRST_PARTS = [
  ["proxy_request", "wsmode before the request", "proxy-request"],
  ["upstream", "model server", "upstream"],
  ["proxy_relay", "wsmode relaying", "proxy-relay"],
];

function parts(first) {
  // a feed without the split (an older proxy): all of wsmode's part before the request
  const request = first.proxy_request === undefined ? first.proxy : first.proxy_request;
  return { proxy_request: request, upstream: first.upstream, proxy_relay: first.proxy_relay || 0 };
}

function firstEventChart(turns, f) {
  const format = f.ms;
  const totals = turns.map((t) => {
    if (!t.first_event) return 0;
    const p = parts(t.first_event);
    return p.proxy_request + p.upstream + p.proxy_relay;
  });
  const max = niceMax(Math.max(...totals));
  const root = frame("ttfe-chart", "time to first event", max, format, "time");
  legend(root, FIRST_PARTS.map(([, text, cls]) => [text, cls]));
  const slot = turnAxis(root, turns.length);
  const width = Math.min(slot * 0.5, 36);
  turns.forEach((t, i) => {
    if (!t.first_event) return; // no event came from upstream: an empty slot
    const p = parts(t.first_event);
    const x = BOX.left + (i + 0.5) * slot - width / 2;
    const g = svg("g", {}, "ttfe-bar");
    let from = 0;
    for (const [key, , cls] of FIRST_PARTS) {
      g.appendChild(bar(x, width, from, from + p[key], max, `bar ${cls}`, p[key]));
      from += p[key];
    }
    const wsmode = p.proxy_request + p.proxy_relay;
    root.appendChild(tip(g, `turn ${i + 1}: first event after ${format(from)}: wsmode ` +
      `${format(wsmode)} (${format(p.proxy_request)} before the request, ` +
      `${format(p.proxy_relay)} relaying), model server ${format(p.upstream)}`));
  });
  return root;
}

// both charts of a conversation, side by side; the time to first event only when a turn
// has one (the sidecar's turns do not). `f`: the page's formats (bytes, size, ms).
function conversationCharts(turns, saved, f) {
  const box = document.createElement("div");
  box.className = "charts";
  box.appendChild(bytesChart(turns, saved, f));
  if (turns.some((t) => t.first_event)) box.appendChild(firstEventChart(turns, f));
  return box;
}

// ---- the replicas over the last minutes: one sample per snapshot, kept here (page side)

// `samples`: the page's ring, oldest first; `s`: a snapshot. A snapshot already kept (the
// same one again after a reconnect) is not kept twice.
function addSample(samples, s) {
  if (!s.upstreams || typeof s.time !== "number") return;
  const newest = samples.length ? samples[samples.length - 1].time : -Infinity;
  if (s.time <= newest) return;
  samples.push({
    time: s.time,
    replicas: s.upstreams.map((u) => ({
      name: u.name,
      inFlight: u.in_flight,
      prompt: u.prompt_tokens || 0,
      cached: u.cached_tokens || 0,
    })),
  });
  while (samples.length > MAX_SAMPLES || samples[0].time < s.time - WINDOW) samples.shift();
}

// the time axis: from the oldest sample kept (MIN_SPAN seconds ago at least) to now
function timeAxis(root, all) {
  const step = all.span <= 60 ? 10 : all.span <= 150 ? 30 : 60;
  for (let ago = Math.floor(all.span / step) * step; ago >= 0; ago -= step) { // left to right
    const text = ago === 0 ? "now" : ago < 60 ? `−${ago} s` : `−${ago / 60} min`;
    root.appendChild(label(xOfTime(all.now - ago, all), BOX.bottom + 14, text, "tick x-tick",
      "middle"));
  }
}

function xOfTime(t, all) {
  return BOX.left + ((t - (all.now - all.span)) / all.span) * (BOX.right - BOX.left);
}

// per replica: its in-flight requests at each sample, and the cached share of the prompt
// tokens of the turns it finished between one sample and the next
function series(samples) {
  const names = [];
  const byName = new Map();
  for (const [i, s] of samples.entries()) {
    for (const r of s.replicas) {
      if (!byName.has(r.name)) {
        byName.set(r.name, { name: r.name, inFlight: [], share: [], prompt: 0, cached: 0 });
        names.push(r.name);
      }
      const one = byName.get(r.name);
      one.inFlight.push([s.time, r.inFlight]);
      const before = i > 0 ? samples[i - 1].replicas.find((p) => p.name === r.name) : undefined;
      if (!before) continue;
      const prompt = r.prompt - before.prompt;
      const cached = r.cached - before.cached;
      if (prompt > 0 && cached >= 0) { // below 0: the counters restarted (another process)
        one.share.push([s.time, Math.min(1, cached / prompt)]);
        one.prompt += prompt;
        one.cached += cached;
      }
    }
  }
  return names.map((n) => byName.get(n));
}

function lines(root, all, pick, y, cls) {
  all.list.forEach((one, i) => {
    const pts = pick(one);
    const colour = `series series-${i % SERIES}`;
    const line = svg("polyline", {
      points: pts.map(([t, v]) => `${xOfTime(t, all)},${y(v)}`).join(" "),
      "data-index": i,
    }, `line ${cls} ${colour}`);
    root.appendChild(line);
    if (cls === "share") {
      for (const [t, v] of pts) {
        root.appendChild(svg("circle", { cx: xOfTime(t, all), cy: y(v), r: 2.5,
          "data-value": v, "data-index": i }, `dot share ${colour}`));
      }
    }
  });
}

function replicaLegend(list, format) {
  const ul = document.createElement("ul");
  ul.className = "legend replica-legend";
  list.forEach((one, i) => {
    const li = document.createElement("li");
    const swatch = document.createElement("span");
    swatch.className = `swatch series-${i % SERIES}`;
    const name = document.createElement("span");
    name.className = "replica-name";
    name.textContent = one.name;
    const what = document.createElement("span");
    what.className = "replica-numbers";
    what.textContent = format(one);
    li.append(swatch, name, what);
    ul.appendChild(li);
  });
  return ul;
}

// `samples`: the page's ring; `num` and `share`: the page's number formats
function replicaCharts(samples, num, share) {
  const box = document.createElement("div");
  box.className = "charts";
  if (samples.length === 0) return box;
  const now = samples[samples.length - 1].time;
  const span = Math.min(WINDOW, Math.max(MIN_SPAN, now - samples[0].time));
  const all = { now, span, list: series(samples) };
  const most = Math.max(1, ...all.list.flatMap((one) => one.inFlight.map(([, v]) => v)));
  const max = Math.max(2, Math.ceil(niceMax(most)));
  const load = frame("in-flight-chart", "requests in flight", max, num, "in flight");
  timeAxis(load, all);
  lines(load, all, (one) => one.inFlight, (v) => yOf(v, max), "in-flight");
  const cache = frame("cached-chart", "cached share of the prompt", 1,
    (v) => `${Math.round(v * 100)} %`, "cached");
  timeAxis(cache, all);
  lines(cache, all, (one) => one.share, (v) => yOf(v, 1), "share");
  const left = document.createElement("div");
  left.className = "chart-box";
  left.append(load, replicaLegend(all.list, (one) => {
    const last = one.inFlight.length ? one.inFlight[one.inFlight.length - 1][1] : 0;
    return ` ${num(last)} in flight now`;
  }));
  const right = document.createElement("div");
  right.className = "chart-box";
  right.append(cache, replicaLegend(all.list, (one) => (one.prompt
    ? ` cached ${share(one.cached, one.prompt)} of ${num(one.prompt)} prompt tokens`
    : " no turn finished")));
  box.append(left, right);
  return box;
}
