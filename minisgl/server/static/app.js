// minisgl's built-in page: a chat over /v1/chat/completions and a live view of the radix cache
// (GET /debug/radix). Plain JavaScript, no dependencies: it ships inside the Python package.
"use strict";

const $ = (selector) => document.querySelector(selector);
const KEY_STORAGE = "minisgl-api-key";
const POLL_MS = 1000;
const HISTORY_POINTS = 120;

// ---- the server's API, with the key when it wants one ----------------------------------------
const auth = {
  required: document.body.dataset.apiKeyRequired === "true",
  key: sessionStorage.getItem(KEY_STORAGE) || "",
  waiting: null, // a promise while the key dialog is open
};

class AuthError extends Error {}

function askForKey(message) {
  if (!auth.waiting) {
    $("#key-error").textContent = message || "";
    $("#key-input").value = "";
    $("#key-dialog").showModal();
    auth.waiting = new Promise((resolve) => {
      $("#key-form").onsubmit = () => {
        auth.key = $("#key-input").value.trim();
        sessionStorage.setItem(KEY_STORAGE, auth.key);
        auth.waiting = null;
        resolve();
      };
    });
  }
  return auth.waiting;
}

async function api(path, options = {}) {
  if (auth.required && !auth.key) await askForKey();
  const headers = { ...(options.headers || {}) };
  if (auth.key) headers.Authorization = `Bearer ${auth.key}`;
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) {
    askForKey("The server refused that key.");
    throw new AuthError("invalid API key");
  }
  return response;
}

async function errorMessage(response) {
  try {
    return (await response.json()).error.message;
  } catch {
    return `HTTP ${response.status}`;
  }
}

// Server-sent events of a streamed completion: yields each JSON object until [DONE].
async function* sseEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

// ---- tabs and header --------------------------------------------------------------------------
function showView(name) {
  for (const tab of document.querySelectorAll(".tab")) tab.classList.toggle("active", tab.dataset.view === name);
  $("#view-chat").hidden = name !== "chat";
  $("#view-cache").hidden = name !== "cache";
  if (name === "cache") cacheView.refresh();
}

for (const tab of document.querySelectorAll(".tab")) tab.onclick = () => showView(tab.dataset.view);
$("#change-key").hidden = !auth.required;
$("#change-key").onclick = () => askForKey();

const chat = { model: null, messages: [], controller: null };

async function loadModel() {
  try {
    const response = await api("/v1/models");
    if (!response.ok) throw new Error(await errorMessage(response));
    chat.model = (await response.json()).data[0].id;
    $("#model-name").textContent = chat.model;
    $("#status").textContent = "connected";
  } catch (error) {
    $("#status").textContent = error instanceof AuthError ? "API key needed" : `not connected: ${error.message}`;
    if (error instanceof AuthError) auth.waiting.then(loadModel);
  }
}

// ---- Chat -------------------------------------------------------------------------------------
function addBubble(role, text) {
  const message = document.createElement("div");
  message.className = `message ${role}`;
  const bubble = document.createElement("div");
  bubble.className = "bubble";
  bubble.textContent = text; // never innerHTML: the text is the model's
  const meta = document.createElement("div");
  meta.className = "meta";
  message.append(bubble, meta);
  $("#messages").append(message);
  message.scrollIntoView({ block: "end" });
  return { message, bubble, meta };
}

// A thinking model's reasoning (the stream's reasoning_content), shown above its answer's bubble, folded
// once the answer is done.
function addThought(view) {
  const thought = document.createElement("details");
  thought.className = "thought";
  thought.open = true;
  const summary = document.createElement("summary");
  summary.textContent = "Thinking";
  const body = document.createElement("div");
  thought.append(summary, body);
  view.message.insertBefore(thought, view.bubble);
  return { thought, body };
}

function numberSetting(id) {
  const raw = $(id).value.trim();
  return raw === "" ? undefined : Number(raw);
}

function requestBody() {
  const system = $("#system").value.trim();
  const messages = (system ? [{ role: "system", content: system }] : []).concat(chat.messages);
  const salt = $("#cache-salt").value;
  return {
    model: chat.model,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: numberSetting("#max-tokens"),
    temperature: numberSetting("#temperature"),
    top_p: numberSetting("#top-p"),
    top_k: numberSetting("#top-k"),
    seed: numberSetting("#seed"),
    cache_salt: salt === "" ? undefined : salt,
  };
}

function setBusy(busy) {
  $("#send").disabled = busy;
  $("#stop").disabled = !busy;
  $("#regenerate").disabled = busy || !chat.messages.some((m) => m.role === "assistant");
}

function describeAnswer(usage, finish, firstMs, lastMs, startMs) {
  const parts = [];
  if (usage) {
    parts.push(`${usage.prompt_tokens} prompt tokens`);
    parts.push(`${usage.prompt_tokens_details.cached_tokens} cached`);
    parts.push(`${usage.completion_tokens} generated`);
    if (usage.completion_tokens > 1 && lastMs > firstMs) {
      const speed = (usage.completion_tokens - 1) / ((lastMs - firstMs) / 1000);
      parts.push(`${speed.toFixed(1)} tokens/s`);
    }
  }
  if (firstMs !== null) parts.push(`first token ${Math.round(firstMs - startMs)} ms`);
  parts.push(finish);
  return parts.join(" · ");
}

async function answer() {
  const conversation = chat.messages; // "New chat" while streaming starts another one
  const view = addBubble("assistant", "");
  view.message.classList.add("streaming");
  chat.controller = new AbortController();
  setBusy(true);
  const startMs = performance.now();
  let text = "", reasoning = "", thought = null, usage = null, finish = "stopped", firstMs = null, lastMs = null;
  try {
    const response = await api("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(requestBody()),
      signal: chat.controller.signal,
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    for await (const event of sseEvents(response)) {
      if (event.error) throw new Error(event.error.message);
      if (event.usage) usage = event.usage;
      for (const choice of event.choices) {
        if (choice.delta.reasoning_content) {
          thought ??= addThought(view);
          reasoning += choice.delta.reasoning_content;
          thought.body.textContent = reasoning; // never innerHTML: the text is the model's
        }
        if (choice.delta.content) {
          text += choice.delta.content;
          view.bubble.textContent = text;
        }
        if (choice.delta.reasoning_content || choice.delta.content) {
          lastMs = performance.now();
          firstMs ??= lastMs;
        }
        if (choice.finish_reason) finish = `finish: ${choice.finish_reason}`;
      }
      view.message.scrollIntoView({ block: "end" });
    }
  } catch (error) {
    if (error.name !== "AbortError") finish = `error: ${error.message}`;
    view.message.classList.add("failed");
  } finally {
    view.message.classList.remove("streaming");
    if (thought && text) thought.thought.open = false;
    view.meta.textContent = describeAnswer(usage, finish, firstMs, lastMs, startMs);
    conversation.push({ role: "assistant", content: text });
    chat.controller = null;
    setBusy(false);
  }
}

$("#composer").onsubmit = (event) => {
  event.preventDefault();
  const text = $("#prompt").value.trim();
  if (!text || chat.controller) return;
  $("#prompt").value = "";
  chat.messages.push({ role: "user", content: text });
  addBubble("user", text);
  answer();
};
$("#prompt").onkeydown = (event) => {
  if (event.key !== "Enter" || event.shiftKey) return;
  event.preventDefault();
  $("#composer").requestSubmit();
};
$("#stop").onclick = () => chat.controller?.abort();
$("#regenerate").onclick = () => {
  if (chat.controller || chat.messages.at(-1)?.role !== "assistant") return;
  chat.messages.pop();
  $("#messages").lastElementChild.remove();
  answer();
};
$("#clear").onclick = () => {
  chat.controller?.abort();
  chat.messages = [];
  $("#messages").replaceChildren();
  setBusy(false);
};

// ---- Cache: the KV pool, hit rate and throughput over time, the requests --------------------
function setupCanvas(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const { width, height } = canvas.getBoundingClientRect();
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const context = canvas.getContext("2d");
  context.setTransform(ratio, 0, 0, ratio, 0, 0);
  return { context, width, height };
}

function drawPool(stats) {
  const parts = [
    ["in use by requests", stats.kv_in_use, "in-use", "#7b61d1"],
    ["cached, locked", stats.kv_protected, "locked", "var(--locked)"],
    ["cached, evictable", stats.kv_evictable, "evictable", "var(--evictable)"],
    ["free", stats.kv_free, "free", "#e9ecf1"],
  ];
  $("#pool-bar").replaceChildren(
    ...parts.map(([name, value, , color]) => {
      const div = document.createElement("div");
      div.style.width = `${(100 * value) / stats.kv_capacity}%`;
      div.style.background = color;
      div.title = `${name}: ${value}`;
      return div;
    }),
  );
  $("#pool-legend").replaceChildren(
    ...parts.map(([name, value, cls]) => {
      const span = document.createElement("span");
      span.innerHTML = `<span class="swatch ${cls}"></span> `;
      span.append(`${name} ${value}`);
      return span;
    }),
    `of ${stats.kv_capacity} slots · ${stats.kv_evicted_total} evicted so far`,
  );
}

function drawLines(canvas, series, maxValue) {
  const { context, width, height } = setupCanvas(canvas);
  context.clearRect(0, 0, width, height);
  context.strokeStyle = "#d9dde3";
  context.strokeRect(0.5, 0.5, width - 1, height - 1);
  const top = Math.max(maxValue, ...series.flatMap((s) => s.values.filter((v) => v !== null)), 1e-9);
  for (const { values, color } of series) {
    context.strokeStyle = color;
    context.lineWidth = 1.5;
    context.beginPath();
    context.fillStyle = color;
    let pen = false;
    values.forEach((value, i) => {
      if (value === null) return void (pen = false);
      const x = (i / (HISTORY_POINTS - 1)) * width;
      const y = height - 2 - (value / top) * (height - 6);
      pen ? context.lineTo(x, y) : context.moveTo(x, y);
      const alone = (values[i - 1] ?? null) === null && (values[i + 1] ?? null) === null;
      if (alone) context.fillRect(x - 1.5, y - 1.5, 3, 3); // a line needs two points
      pen = true;
    });
    context.stroke();
  }
}

const history = { last: null, hit: [], generated: [], prefilled: [] };

function recordStats(stats, now) {
  const last = history.last;
  history.last = { stats, now };
  if (!last) return;
  const seconds = (now - last.now) / 1000;
  const prompt = stats.prompt_tokens - last.stats.prompt_tokens;
  const push = (list, value) => {
    list.push(value);
    if (list.length > HISTORY_POINTS) list.shift();
  };
  push(history.hit, prompt > 0 ? (stats.cached_tokens - last.stats.cached_tokens) / prompt : null);
  push(history.generated, (stats.generated_tokens - last.stats.generated_tokens) / seconds);
  push(history.prefilled, (stats.prefill_tokens - last.stats.prefill_tokens) / seconds);
}

function drawHistory(stats) {
  drawLines($("#hit-chart"), [{ values: history.hit, color: "#3b6fd8" }], 1);
  const recent = history.hit.filter((v) => v !== null).at(-1);
  $("#hit-text").textContent =
    `${(100 * stats.hit_rate).toFixed(1)}% of all prompt tokens came from the cache` +
    (recent === undefined ? "" : ` · last interval ${(100 * recent).toFixed(0)}%`);
  drawLines($("#speed-chart"), [
    { values: history.generated, color: "#3b6fd8" },
    { values: history.prefilled, color: "#f0a830" },
  ], 1);
  const now = (list) => (list.at(-1) ?? 0).toFixed(1);
  $("#speed-text").textContent =
    `generated ${now(history.generated)} (blue) · prefilled ${now(history.prefilled)} (orange) · ` +
    `${stats.running} running, ${stats.waiting} waiting`;
}

function drawRequests(requests) {
  $("#requests tbody").replaceChildren(
    ...requests.map((r) => {
      const row = document.createElement("tr");
      for (const cell of [r.rid, r.state, r.namespace, r.prompt_tokens, r.cached_tokens,
        `${r.generated_tokens} / ${r.max_tokens}`]) {
        const td = document.createElement("td");
        td.textContent = cell;
        row.append(td);
      }
      return row;
    }),
  );
}

// ---- Cache: the radix tree, as an icicle ------------------------------------------------------
// Columns are tree levels; a node's height is the KV slots it and everything below it hold, so a
// long shared prefix is a tall bar and its branches split it to the right. Branches thinner than
// MIN_HEIGHT_PX are not drawn (the summary counts them); zooming into a node redraws its subtree.
const MIN_HEIGHT_PX = 0.5;
const LABEL_HEIGHT_PX = 14;

const cacheView = {
  tree: null, // the last snapshot, linked: nodes by id, each with children
  focus: "top", // id of the node the view is zoomed into
  selected: null,
  collapsed: new Set(),
  rects: [],
  lastDrawMs: null,
  timer: null,
  loading: false, // a /debug/radix call in flight: another refresh waits for its turn

  // Builds the linked tree from /debug/radix's "tree" and draws it; returns the milliseconds taken.
  show(tree) {
    const started = performance.now();
    this.tree = tree && link(tree);
    if (!this.tree?.byId.has(this.focus)) this.focus = "top";
    if (this.selected !== null && !this.tree?.byId.has(this.selected)) this.selected = null;
    this.draw();
    this.lastDrawMs = performance.now() - started;
    return this.lastDrawMs;
  },

  async refresh() {
    clearTimeout(this.timer);
    if (this.loading || $("#view-cache").hidden) return;
    this.loading = true;
    try {
      const salt = $("#cache-salt").value;
      const response = await api(`/debug/radix?max_nodes=${$("#max-nodes").value}&head_tokens=32`, {
        headers: salt === "" ? {} : { "X-Cache-Salt": salt },
      });
      if (!response.ok) throw new Error(await errorMessage(response));
      const report = await response.json();
      recordStats(report.stats, performance.now());
      drawPool(report.stats);
      drawHistory(report.stats);
      drawRequests(report.requests);
      this.show(report.tree);
      $("#status").textContent = "connected";
    } catch (error) {
      $("#status").textContent = `cache view: ${error.message}`;
    } finally {
      this.loading = false;
    }
    if ($("#live").checked) this.timer = setTimeout(() => this.refresh(), POLL_MS);
  },

  draw() {
    const canvas = $("#tree");
    const { context, width, height } = setupCanvas(canvas);
    context.clearRect(0, 0, width, height);
    if (!this.tree) {
      this.rects = [];
      $("#tree-summary").textContent = "this cache keeps no tree (--cache-type naive)";
      return this.updateControls();
    }
    const focus = this.tree.byId.get(this.focus);
    const start = focus.id === "top" ? focus.children : [focus];
    const rects = [];
    const scale = height / Math.max(focus.subtree_tokens, 1);
    const place = (node, depth, y) => {
      const h = node.subtree_tokens * scale;
      if (h < MIN_HEIGHT_PX) return;
      rects.push({ node, depth, y, h });
      if (this.collapsed.has(node.id)) return;
      for (const child of node.children) {
        place(child, depth + 1, y);
        y += child.subtree_tokens * scale;
      }
    };
    let y = 0;
    for (const node of start) {
      place(node, 0, y);
      y += node.subtree_tokens * scale;
    }
    const depth = rects.reduce((deepest, r) => Math.max(deepest, r.depth), 0) + 1;
    const columnWidth = Math.min(260, Math.max(90, width / depth));
    for (const r of rects) {
      r.x = r.depth * columnWidth;
      r.w = columnWidth;
    }
    this.rects = rects;
    const maxAge = rects.reduce((oldest, r) => Math.max(oldest, r.node.age || 0), 1);
    context.font = "12px system-ui, sans-serif";
    context.textBaseline = "top";
    for (const r of rects) drawNode(context, r, maxAge, this);
    const drawn = rects.filter((r) => !r.node.namespace).length;
    const t = this.tree;
    $("#tree-summary").textContent =
      `${t.total_nodes} nodes in the cache, ${t.nodes} sent, ${drawn} drawn here · ${t.tokens} tokens` +
      ` · ${t.namespaces.length} namespace${t.namespaces.length === 1 ? "" : "s"}`;
    this.drawBreadcrumb();
    this.updateControls();
  },

  drawBreadcrumb() {
    const crumbs = [];
    for (let node = this.tree.byId.get(this.focus); node; node = node.parentNode) crumbs.unshift(node);
    $("#breadcrumb").replaceChildren(
      ...crumbs.flatMap((node, i) => {
        const link = document.createElement("a");
        link.textContent = i === 0 ? "all" : shortLabel(node, 16);
        link.onclick = () => this.zoom(node.id);
        return i === 0 ? [link] : [" › ", link];
      }),
    );
  },

  updateControls() {
    const node = this.selected === null ? null : this.tree?.byId.get(this.selected);
    $("#zoom-in").disabled = !node || node.id === this.focus;
    $("#zoom-out").disabled = this.focus === "top";
    $("#collapse").disabled = !node || node.children.length === 0;
    $("#collapse").textContent = node && this.collapsed.has(node.id) ? "Expand" : "Collapse";
    showDetails(node, this.tree);
  },

  zoom(id) {
    this.focus = id;
    this.draw();
  },

  nodeAt(event) {
    const box = $("#tree").getBoundingClientRect();
    const x = event.clientX - box.left, y = event.clientY - box.top;
    return this.rects.find((r) => x >= r.x && x < r.x + r.w && y >= r.y && y < r.y + Math.max(r.h, 1))?.node;
  },
};

// The snapshot with links: a synthetic top above the namespaces, each node's parent and children
// (largest branch first), its namespace, and whether eviction takes it (or a node below it) next.
function link(tree) {
  const top = { id: "top", children: [], subtree_tokens: 0, parentNode: null, namespace: true };
  const byId = new Map([["top", top]]);
  for (const ns of tree.namespaces) {
    const node = {
      id: ns.root, label: ns.label, tokens_shown: ns.tokens_shown, namespace: true, children: [],
      subtree_tokens: ns.tokens, subtree_nodes: ns.nodes, parentNode: top,
    };
    node.ns = node;
    top.children.push(node);
    top.subtree_tokens += ns.tokens;
    byId.set(ns.root, node);
  }
  const evicting = new Set(tree.eviction_path);
  const victim = tree.eviction_path.at(-1);
  for (const raw of tree.nodes) {
    const parent = byId.get(raw.parent);
    const node = { ...raw, children: [], parentNode: parent, ns: parent.ns };
    node.evicting = evicting.has(node.id);
    node.victim = node.id === victim;
    parent.children.push(node);
    byId.set(node.id, node);
  }
  for (const node of byId.values()) node.children.sort((a, b) => b.subtree_tokens - a.subtree_tokens);
  return {
    byId, namespaces: tree.namespaces, total_nodes: tree.total_nodes, nodes: tree.nodes.length,
    tokens: top.subtree_tokens,
  };
}

// Not sent (over the bound): what a node's subtree counts beyond itself and its sent children.
function unsent(node) {
  if (node.namespace) return node.subtree_nodes - node.children.reduce((n, c) => n + c.subtree_nodes, 0);
  return node.subtree_nodes - 1 - node.children.reduce((n, c) => n + c.subtree_nodes, 0);
}

function shortLabel(node, chars) {
  if (node.namespace) return node.label;
  const text = node.text === null ? `(hidden: ${node.length} tokens)` : node.text.replaceAll("\n", "⏎");
  return text.length > chars ? `${text.slice(0, chars - 1)}…` : text;
}

function drawNode(context, r, maxAge, view) {
  const { node } = r;
  const h = Math.max(r.h - 1, 1);
  if (node.namespace) context.fillStyle = node.tokens_shown ? "#c9ced8" : "#9aa1ad";
  else if (node.victim) context.fillStyle = "#e5484d";
  else if (node.text === null) context.fillStyle = "#b4bac4";
  else if (node.locks > 0) context.fillStyle = "#f0a830";
  else context.fillStyle = `rgba(91, 141, 239, ${1 - 0.6 * (node.age / maxAge)})`;
  context.fillRect(r.x + 1, r.y, r.w - 2, h);
  if (node.evicting && !node.victim) {
    context.strokeStyle = "#e5484d";
    context.lineWidth = 1.5;
    context.strokeRect(r.x + 1.5, r.y + 0.5, r.w - 3, h - 1);
  }
  if (node.id === view.selected) {
    context.strokeStyle = "#1d2330";
    context.lineWidth = 2;
    context.strokeRect(r.x + 2, r.y + 1, r.w - 4, Math.max(h - 2, 1));
  }
  if (r.h < LABEL_HEIGHT_PX) return;
  const chars = Math.floor((r.w - 8) / 6.5);
  context.fillStyle = "#1d2330";
  const hiddenBelow = view.collapsed.has(node.id) ? node.subtree_nodes - 1 : unsent(node);
  const more = hiddenBelow > 0 ? ` ▸${hiddenBelow}` : "";
  context.fillText(shortLabel(node, Math.max(chars - more.length, 1)) + more, r.x + 5, r.y + 2, r.w - 8);
  if (r.h >= 2 * LABEL_HEIGHT_PX && !node.namespace) {
    context.fillStyle = "#3d4454";
    context.fillText(`${node.length} tok · ${node.locks} lock · age ${node.age}`, r.x + 5, r.y + 16, r.w - 8);
  } else if (r.h >= 2 * LABEL_HEIGHT_PX) {
    context.fillText(`${node.subtree_tokens} tok · ${node.subtree_nodes} nodes`, r.x + 5, r.y + 16, r.w - 8);
  }
}

function showDetails(node, tree) {
  const rows = [];
  if (node && node.namespace) {
    rows.push(["namespace", node.label], ["text", node.tokens_shown ? "shown" : "hidden (another cache_salt)"]);
    rows.push(["tokens", node.subtree_tokens], ["nodes", node.subtree_nodes]);
  } else if (node) {
    rows.push(["namespace", node.ns.label]);
    rows.push(["text", node.text === null ? "hidden (another cache_salt)" : node.text]);
    rows.push(["tokens", node.length], ["locks", node.locks], ["age", `${node.age} cache lookups`]);
    rows.push(["below it", `${node.subtree_tokens - node.length} tokens in ${node.subtree_nodes - 1} nodes`]);
    if (unsent(node) > 0) rows.push(["not sent", `${unsent(node)} nodes (over the bound)`]);
    if (node.victim) rows.push(["eviction", "the next leaf to go"]);
    else if (node.evicting) rows.push(["eviction", "on the branch eviction takes next"]);
  }
  if (!rows.length) {
    const dd = document.createElement("dd");
    dd.className = "muted";
    dd.textContent = tree ? "Click a node of the tree." : "";
    return $("#details").replaceChildren(dd);
  }
  $("#details").replaceChildren(
    ...rows.flatMap(([name, value]) => {
      const dt = document.createElement("dt");
      const dd = document.createElement("dd");
      dt.textContent = name;
      dd.textContent = value;
      return [dt, dd];
    }),
  );
}

const treeCanvas = $("#tree");
treeCanvas.onclick = (event) => {
  cacheView.selected = cacheView.nodeAt(event)?.id ?? null;
  cacheView.draw();
};
treeCanvas.ondblclick = (event) => {
  const node = cacheView.nodeAt(event);
  if (node) cacheView.zoom(node.id);
};
treeCanvas.onmousemove = (event) => {
  const node = cacheView.nodeAt(event);
  const tooltip = $("#tooltip");
  tooltip.hidden = !node;
  if (!node) return;
  tooltip.textContent = node.namespace
    ? `${node.label}: ${node.subtree_tokens} tokens in ${node.subtree_nodes} nodes`
    : `${shortLabel(node, 200)}\n${node.length} tokens · ${node.locks} locks · age ${node.age}` +
      ` · ${node.subtree_tokens} tokens in its branch`;
  const box = treeCanvas.getBoundingClientRect();
  tooltip.style.left = `${Math.min(event.clientX - box.left + 12, box.width - 300)}px`;
  tooltip.style.top = `${event.clientY - box.top + 12}px`;
};
treeCanvas.onmouseleave = () => ($("#tooltip").hidden = true);
$("#zoom-in").onclick = () => cacheView.zoom(cacheView.selected);
$("#zoom-out").onclick = () => cacheView.zoom(cacheView.tree.byId.get(cacheView.focus).parentNode.id);
$("#collapse").onclick = () => {
  const id = cacheView.selected;
  cacheView.collapsed.has(id) ? cacheView.collapsed.delete(id) : cacheView.collapsed.add(id);
  cacheView.draw();
};
$("#max-nodes").onchange = () => cacheView.refresh();
$("#live").onchange = () => cacheView.refresh();
window.addEventListener("resize", () => cacheView.tree && cacheView.draw());

window.cacheView = cacheView; // for the browser test and the curious: cacheView.show(tree) times a draw
setBusy(false);
loadModel();
