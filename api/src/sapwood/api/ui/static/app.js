// Sapwood's web viewer: a single page over the /v1 API (no framework, no build step).
// Safety rule: data from the API (ids, decoded text, error messages) only ever reaches the page
// as text nodes / textContent, never as HTML; the page's CSP forbids inline scripts as well.
"use strict";

const KEY_SLOT = "sapwood.apiKey";
const state = { features: { cells: false, decisions: false, tokenizer: false } };

// -- DOM helpers ------------------------------------------------------------------------------------
/** An element with properties/attributes `props` and children (strings become text nodes). */
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k === "style") Object.assign(node.style, v); // CSSOM: allowed by the CSP, unlike style="..."
    else if (k === "onclick" || k === "onsubmit" || k === "onchange") node.addEventListener(k.slice(2), v);
    else if (k === "title" || k === "href" || k === "type" || k === "name" || k === "value" || k === "id" ||
             k === "placeholder" || k === "checked" || k === "colSpan" || k === "hidden") node[k] = v;
    else node.setAttribute(k, String(v));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    if (child instanceof Node) node.append(child);
    else node.append(...neutralise(child)); // tree.js: bidi controls shown escaped
  }
  return node;
}
const $ = (id) => document.getElementById(id);
const fmt = (x, digits = 3) => (x === null || x === undefined ? "—" : typeof x === "number" && !Number.isInteger(x)
  ? x.toFixed(digits) : String(x));
const short = (id) => (id ? String(id).slice(0, 8) : "—");
const when = (t) => (t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) : "—");
const link = (href, text, cls) => el("a", { href, class: cls }, text);
const query = (params) => {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (Array.isArray(v)) v.forEach((x) => q.append(k, x));
    else if (v !== undefined && v !== null && v !== "") q.set(k, v);
  }
  const s = q.toString();
  return s ? "?" + s : "";
};

function table(columns, rows, emptyText) {
  if (!rows.length) return el("p", { class: "muted" }, emptyText || "nothing here");
  return el("table", {},
    el("thead", {}, el("tr", {}, columns.map((c) => el("th", {}, c.label)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, columns.map((c) => el("td", { class: c.cls }, c.cell(r)))))));
}

// A table of more than VIRTUAL_AFTER rows keeps only the rows in view (and OVERSCAN more each side) in the
// DOM: rows have a fixed height (ROW_PX, style.css), spacer rows above and below keep the scrollbar true.
const VIRTUAL_AFTER = 200, ROW_PX = 28, OVERSCAN = 8, VIEW_PX = 420;

function virtualTable(columns, rows, id) {
  if (rows.length <= VIRTUAL_AFTER) return table(columns, rows);
  const tbody = el("tbody", {});
  const box = el("div", { class: "virtual-table", id, dataset: { rows: rows.length } },
    el("table", {}, el("thead", {}, el("tr", {}, columns.map((c) => el("th", {}, c.label)))), tbody));
  const spacer = (n) => {
    const tr = el("tr", { class: "spacer" }, el("td", { colSpan: columns.length }));
    tr.style.height = `${n * ROW_PX}px`;
    return tr;
  };
  let shown = "";
  const draw = () => {
    const top = box.scrollTop, height = box.clientHeight || VIEW_PX;
    const a = Math.max(0, Math.floor(top / ROW_PX) - OVERSCAN);
    const b = Math.min(rows.length, Math.ceil((top + height) / ROW_PX) + OVERSCAN);
    if (shown === `${a}:${b}`) return;
    shown = `${a}:${b}`;
    tbody.replaceChildren(spacer(a),
      ...rows.slice(a, b).map((r, i) => el("tr", { class: "row", dataset: { index: a + i } },
        columns.map((c) => el("td", { class: c.cls }, c.cell(r))))),
      spacer(rows.length - b));
    box.dataset.first = a;
    box.dataset.last = b - 1;
  };
  let pending = false;
  box.addEventListener("scroll", () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; draw(); });
  });
  draw();
  return box;
}

function setStatus(text, isError) {
  const s = $("status");
  s.textContent = text || "";
  s.className = isError ? "error" : "";
}

// -- API --------------------------------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

function apiKey() { return sessionStorage.getItem(KEY_SLOT); }

async function api(path, params, accept) {
  const headers = { Authorization: "Bearer " + apiKey() };
  if (accept) headers.Accept = accept;
  const response = await fetch(path + query(params || {}), { headers, credentials: "omit", cache: "no-store" });
  if (!response.ok) {
    let code = "error";
    let message = response.statusText;
    try {
      const body = await response.json();
      code = body.error.code;
      message = body.error.message;
    } catch (_) { /* not a JSON error body */ }
    throw new ApiError(response.status, code, message);
  }
  return accept === "application/octet-stream" ? response.arrayBuffer() : response.json();
}

// -- key handling -----------------------------------------------------------------------------------
function showLogin(message) {
  $("login").hidden = false;
  $("main").replaceChildren();
  $("logout").hidden = true;
  $("who").textContent = "";
  $("login-error").textContent = message || "";
  $("key-input").focus();
}

async function useKey(key) {
  sessionStorage.setItem(KEY_SLOT, key);
  try {
    await api("/v1/runs", { limit: 1 });
  } catch (err) {
    sessionStorage.removeItem(KEY_SLOT);
    showLogin(err.status === 401 || err.status === 403 ? `The server refused this key: ${err.message}`
      : `Could not check the key: ${err.message}`);
    return false;
  }
  $("login").hidden = true;
  $("logout").hidden = false;
  $("who").textContent = "key " + key.split(".")[0];
  return true;
}

// -- pages ------------------------------------------------------------------------------------------
function progressBar(p) {
  if (!p) return el("span", { class: "muted" }, "rollout run");
  const total = p.total || 0;
  const pct = (n) => (total ? (100 * n) / total : 0);
  const bar = el("div", { class: "progress", title: `${p.done} done, ${p.claimed} claimed, ${p.pending} pending` },
    el("span", { class: "done", style: { width: `${pct(p.done)}%` } }),
    el("span", { class: "claimed", style: { width: `${pct(p.claimed)}%` } }));
  return el("div", { class: "progress-cell" }, bar, `${p.done}/${total} done, ${p.claimed} claimed`);
}

// The run-level retokenization drift table (/v1/drift): runs with chat calls the gateway checked.
function driftTable(drift) {
  if (!drift.runs.length) return [];
  const pct = (rate) => (rate === null ? "—" : `${(100 * rate).toFixed(2)} %`);
  return [el("h2", {}, "Retokenization drift"),
    el("p", { class: "muted" }, "Chat calls whose input continued the previous call's context (checked) and " +
      "those where the previous output ids did not come back verbatim (drifted); first position: the smallest " +
      "input index where a call drifted."),
    el("div", { id: "drift-table" }, table([
      { label: "run", cell: (r) => link(`#/run/${encodeURIComponent(r.run_id)}`, r.run_id) },
      { label: "calls", cell: (r) => r.calls },
      { label: "checked", cell: (r) => r.checked },
      { label: "drifted", cell: (r) => r.drifted },
      { label: "rate", cell: (r) => pct(r.rate) },
      { label: "first position", cell: (r) => fmt(r.first_position) },
    ], drift.runs))];
}

async function pageRuns(params) {
  const [page, drift] = await Promise.all([api("/v1/runs", { limit: 50, cursor: params.get("cursor") }),
    api("/v1/drift")]);
  const rows = page.items;
  return el("section", {},
    el("h1", {}, "Runs"),
    el("p", { class: "muted" }, "Training runs (replay or live queues, with their progress) and the run ids " +
      "rollouts were recorded under."),
    table([
      { label: "run", cell: (r) => link(`#/run/${encodeURIComponent(r.run_id)}`, r.run_id) },
      { label: "kind", cell: (r) => r.kind || "rollout" },
      { label: "replay progress", cell: (r) => progressBar(r.progress) },
      { label: "executions", cell: (r) => Object.entries(r.executions).map(([s, n]) => `${s} ${n}`).join(", ") || "—" },
      { label: "seed", cell: (r) => fmt(r.seed) },
      { label: "created", cell: (r) => when(r.created_at) },
      { label: "description", cell: (r) => r.description || "" },
    ], rows, "no runs yet"),
    pager(page.next_cursor, "#/runs", params),
    ...driftTable(drift));
}

function pager(nextCursor, base, params) {
  const nav = el("p", { class: "pager" });
  if (params.get("cursor")) nav.append(link(base + query(Object.fromEntries([...params].filter(([k]) => k !== "cursor"))), "⟲ first page"), " ");
  if (nextCursor) {
    const next = new URLSearchParams(params);
    next.set("cursor", nextCursor);
    nav.append(link(base + "?" + next.toString(), "next page →", "next"));
  }
  return nav;
}

async function pageRun(runId, params) {
  const run = await api(`/v1/runs/${encodeURIComponent(runId)}`);
  const parts = [el("h1", {}, "Run ", el("code", {}, run.run_id)),
    el("dl", { class: "facts" },
      fact("kind", run.kind || "rollout (recorded executions)"), fact("seed", fmt(run.seed)),
      fact("filter", run.filter ? JSON.stringify(run.filter) : "—"),
      fact("config", run.config ? JSON.stringify(run.config) : "—"),
      fact("progress", progressBar(run.progress)),
      fact("recorded executions", link(`#/executions${query({ run_id: run.run_id })}`,
        Object.entries(run.executions).map(([s, n]) => `${s} ${n}`).join(", ") || "none")))];
  if (run.kind) {
    const items = await api(`/v1/runs/${encodeURIComponent(runId)}/items`, { limit: 100, cursor: params.get("cursor") });
    parts.push(el("h2", {}, "Queue (claim order)"), table([
      { label: "#", cell: (r) => r.position },
      { label: "execution", cell: (r) => link(`#/execution/${r.execution_id}`, short(r.execution_id), "mono") },
      { label: "state", cell: (r) => el("span", { class: `state ${r.state}` }, r.state) },
      { label: "claimed by", cell: (r) => r.claimed_by || "—" },
      { label: "attempts", cell: (r) => r.attempts },
      { label: "done", cell: (r) => when(r.done_at) },
    ], items.items, "the queue is empty"), pager(items.next_cursor, `#/run/${encodeURIComponent(runId)}`, params));
  }
  return el("section", {}, parts);
}

function fact(label, value) {
  return [el("dt", {}, label), el("dd", {}, value)];
}

const STATUSES = ["running", "success", "timeout", "error"];
const FILTERS = [["task_id", "task"], ["run_id", "run"], ["min_policy_version", "min policy version"],
  ["max_policy_version", "max policy version"], ["min_score", "min score"], ["max_score", "max score"]];

async function pageExecutions(params) {
  const filter = { status: params.getAll("status") };
  for (const [name] of FILTERS) filter[name] = params.get(name) || undefined;
  const page = await api("/v1/executions", { ...filter, limit: 50, cursor: params.get("cursor") });
  const form = el("form", { class: "filters", id: "filters", onsubmit: (ev) => {
    ev.preventDefault();
    const data = new FormData(ev.target);
    const out = new URLSearchParams();
    for (const [k, v] of data) if (v !== "") out.append(k, v);
    location.hash = "#/executions" + (out.toString() ? "?" + out.toString() : "");
  } },
  el("fieldset", {}, el("legend", {}, "status"), STATUSES.map((s) => el("label", {},
    el("input", { type: "checkbox", name: "status", value: s, checked: filter.status.includes(s) }), s))),
  FILTERS.map(([name, label]) => el("label", {}, label,
    el("input", { name, value: filter[name] || "", size: name.includes("version") ? 6 : 14 }))),
  el("button", { type: "submit" }, "Filter"));
  return el("section", {},
    el("h1", {}, "Executions"), form,
    table([
      { label: "execution", cell: (r) => link(`#/execution/${r.execution_id}`, short(r.execution_id), "mono") },
      { label: "task", cell: (r) => r.task_id },
      { label: "run", cell: (r) => r.run_id },
      { label: "status", cell: (r) => el("span", { class: `state ${r.status}` }, r.status) },
      { label: "reward", cell: (r) => fmt(r.reward) },
      { label: "partial score", cell: (r) => fmt(r.score) },
      { label: "policy ≤", cell: (r) => fmt(r.max_policy_version) },
      { label: "calls", cell: (r) => r.n_calls },
      { label: "forks", cell: (r) => r.n_forks },
      { label: "segments", cell: (r) => r.n_segments },
      { label: "tokens", cell: (r) => r.n_tokens },
      { label: "started", cell: (r) => when(r.started_at) },
    ], page.items, "no execution matches these filters"),
    pager(page.next_cursor, "#/executions", params));
}

// -- the tree ---------------------------------------------------------------------------------------
async function pageExecution(executionId) {
  const [tree, trajectories] = await Promise.all([
    api(`/v1/executions/${executionId}/tree`),
    api(`/v1/executions/${executionId}/trajectories`),
  ]);
  const ex = tree.execution;
  const latest = tree.scores.length ? tree.scores[tree.scores.length - 1] : null;
  return el("section", {},
    el("h1", {}, "Execution ", el("code", {}, ex.execution_id)),
    el("dl", { class: "facts" },
      fact("task", `${ex.task_id} (${ex.task_family || "—"})`), fact("run", link(`#/run/${encodeURIComponent(ex.run_id)}`, ex.run_id)),
      fact("status", el("span", { class: `state ${ex.status}` }, ex.status)),
      fact("reward", fmt(ex.reward)),
      fact("partial score", latest ? `${fmt(latest.score)} (revision ${latest.revision} by ${latest.scorer})` : "—"),
      fact("engine", ex.engine), fact("policy versions", `up to ${fmt(ex.max_policy_version)}`),
      fact("size", `${ex.n_nodes} nodes, ${ex.n_tokens} tokens, ${ex.n_calls} calls, ${ex.n_forks} forks, ` +
        `${ex.n_segments} segments`),
      fact("started / finished", `${when(ex.started_at)} / ${when(ex.finished_at)}`)),
    el("h2", {}, "Tree"),
    el("p", { class: "legend" },
      el("span", { class: "role prompt" }, "prompt"), el("span", { class: "role observation" }, "observation"),
      el("span", { class: "role action" }, "action"), el("span", { class: "role summary" }, "summary"),
      " a box is a node or a collapsed chain of single children (▸ expands it); edges branch at forks; " +
      "a dashed edge leads from a compaction summary to the next segment's root."),
    tree.truncated ? el("p", { class: "error" }, `truncated: ${tree.nodes.length} of ${tree.n_nodes_total} nodes`) : null,
    renderTree(tree),
    el("h2", {}, "Trajectories (one per leaf)"),
    virtualTable([
      { label: "leaf", cell: (r) => link(`#/node/${r.leaf_node_id}`, short(r.leaf_node_id), "mono") },
      { label: "segments", cell: (r) => r.n_segments },
      { label: "tokens", cell: (r) => r.n_tokens },
      { label: "trainable", cell: (r) => r.n_trainable },
      { label: "reward / partial score", cell: (r) => leafOutcome(ex, r.leaf_node_id, r.reward) },
    ], trajectories.items, "trajectories"),
    el("h2", {}, "Score revisions"),
    table([
      { label: "revision", cell: (r) => r.revision }, { label: "score", cell: (r) => fmt(r.score) },
      { label: "components", cell: (r) => JSON.stringify(r.components) }, { label: "scorer", cell: (r) => r.scorer },
      { label: "note", cell: (r) => r.note }, { label: "at", cell: (r) => when(r.created_at) },
    ], tree.scores, "no partial scores"));
}

function leafOutcome(ex, leafId, reward) {
  if (ex.leaf_rewards && leafId in ex.leaf_rewards) return `reward ${fmt(ex.leaf_rewards[leafId])}`;
  if (ex.status === "timeout") return el("span", { class: "timeout" }, `timed out — partial score ${fmt(ex.score)}`);
  return reward === null || reward === undefined ? "—" : `reward ${fmt(reward)}`;
}

function renderTree(tree) {
  return renderTreeView(tree, { leafOutcome, tokenizer: state.features.tokenizer }); // tree.js
}

// -- a node and a call ------------------------------------------------------------------------------
function heatColor(lp) {
  const p = Math.exp(Math.max(lp, -20)); // probability of the sampled token
  const hue = Math.round(120 * p); // red (unlikely) → green (certain)
  return `hsl(${hue}, 70%, ${85 - 20 * (1 - p)}%)`;
}

function heatMap(tokenIds, logprobs, tokenTexts) {
  const box = el("div", { class: "heatmap", id: "heatmap" });
  tokenIds.forEach((id, i) => {
    const lp = logprobs ? logprobs[i] : null;
    const text = tokenTexts ? tokenTexts[i] : null;
    const label = text === null ? String(id) : text.replace(/\n/g, "↵").replace(/\t/g, "→");
    const cell = el("span", { class: text === null ? "tok ids" : "tok text",
      title: `token ${id}` + (lp === null ? "" : `, log-prob ${lp.toFixed(4)}, p ${Math.exp(lp).toFixed(3)}`) }, label);
    if (lp !== null) cell.style.background = heatColor(lp);
    box.append(cell);
  });
  return [heatLegend(), box];
}

function heatLegend() {
  const stops = [0, 0.25, 0.5, 0.75, 1];
  return el("div", { class: "heat-legend", id: "heatmap-legend" }, "probability of the sampled token: ",
    stops.map((p) => el("span", { class: "swatch", style: { background: heatColor(p > 0 ? Math.log(p) : -20) } },
      p === 0 ? "≈0" : String(p))), el("span", { class: "muted" }, " (hover a token for its log-prob)"));
}

function tokensOrText(text, ids, id) {
  if (text !== null && text !== undefined) return el("pre", { class: "context text", id }, text);
  return el("pre", { class: "context ids", id }, ids ? ids.join(" ") : "(token ids not included)");
}

async function pageNode(nodeId) {
  const [node, seen, traj] = await Promise.all([
    api(`/v1/nodes/${nodeId}`, { limit: 8192 }),
    api(`/v1/nodes/${nodeId}/calls`, { limit: 50 }),
    api(`/v1/nodes/${nodeId}/trajectory`, { limit: 8192 }),
  ]);
  return el("section", {},
    el("h1", {}, "Node ", el("code", {}, node.node_id)),
    el("dl", { class: "facts" },
      fact("execution", link(`#/execution/${node.execution_id}`, node.execution_id)),
      fact("role", el("span", { class: `role ${node.role}` }, node.role)),
      fact("tokens", `${node.length} (offset ${node.depth} in its context), segment ${node.segment}`),
      fact("produced by", node.call_id ? link(`#/call/${node.call_id}`, node.call_id) : "—"),
      fact("policy version", fmt(node.policy_version))),
    el("h2", {}, state.features.tokenizer ? "Text" : "Token ids"),
    tokensOrText(node.text, node.token_ids, "node-text"),
    node.logprobs ? [el("h2", {}, "Rollout log-probs"), heatMap(node.token_ids, node.logprobs, node.token_texts)] : null,
    node.next_offset !== null ? el("p", { class: "muted" }, `first ${node.token_ids.length} tokens shown`) : null,
    el("h2", {}, `Model calls whose exact input contains this node (tokens ${seen.token_start}–${seen.token_end})`),
    table([
      { label: "call", cell: (r) => link(`#/call/${r.call_id}`, short(r.call_id), "mono") },
      { label: "kind", cell: (r) => r.call_kind }, { label: "segment", cell: (r) => r.segment },
      { label: "input tokens", cell: (r) => r.input_len }, { label: "policy", cell: (r) => r.policy_version },
    ], seen.items, "no call saw this node (it is the last of its context)"),
    el("h2", {}, `Logical trajectory ending here (${traj.n_tokens} tokens over ${traj.segments.length} segments)`),
    el("div", { class: "pieces", id: "trajectory" }, traj.pieces.map((p) => el("span", {
      class: `piece ${p.role}`, title: `${p.role}, segment ${p.segment}, tokens ${p.offset}–${p.offset + p.token_ids.length}`,
    }, p.token_ids.join(" ")))),
    traj.next_offset !== null ? el("p", { class: "muted" }, `first ${traj.limit} tokens shown`) : null);
}

async function pageCall(callId) {
  const a = await api(`/v1/calls/${callId}/audit`);
  const check = el("span", { id: "browser-check", class: "muted" }, "recomputing in the browser…");
  const page = el("section", {},
    el("h1", {}, "Model call ", el("code", {}, a.call.call_id)),
    el("p", { id: "verified", class: a.verified ? "ok" : "error" },
      a.verified ? "✔ verified: the context rebuilt from the tree has the recorded length and digest"
        : "✘ NOT verified: the rebuilt context differs from what the producer recorded"),
    el("dl", { class: "facts" },
      fact("execution", link(`#/execution/${a.call.execution_id}`, a.call.execution_id)),
      fact("task / run", `${a.task_id} / ${a.run_id}`),
      fact("kind", `${a.call.call_kind}, segment ${a.call.segment}, seq ${a.call.seq}`),
      fact("policy version", el("span", { id: "policy-version" }, String(a.call.policy_version))),
      fact("engine", el("span", { id: "engine" }, a.engine)),
      fact("sampling", JSON.stringify(a.sampling_params)),
      fact("timings", JSON.stringify(a.timings)),
      fact("finish", a.call.finish_reason),
      fact("recorded digest", el("code", { id: "recorded-digest" }, a.input.recorded_digest)),
      fact("server's digest", el("code", { id: "computed-digest" }, a.input.computed_digest)),
      fact("browser's digest", check)),
    el("h2", {}, `Exact input context (${a.input.length} tokens)`),
    table([
      { label: "node", cell: (r) => link(`#/node/${r.node_id}`, short(r.node_id), "mono") },
      { label: "role", cell: (r) => el("span", { class: `role ${r.role}` }, r.role) },
      { label: "tokens", cell: (r) => `${r.depth}–${r.depth + r.length}` },
      { label: "call", cell: (r) => (r.call_id ? link(`#/call/${r.call_id}`, short(r.call_id), "mono") : "—") },
      { label: "policy", cell: (r) => fmt(r.policy_version) },
    ], a.input.path),
    tokensOrText(a.input.text, a.input.token_ids, "input-context"),
    el("h2", {}, `Output (${a.output.length} tokens) with rollout log-probs`),
    tokensOrText(a.output.text, null, "output-text"),
    heatMap(a.output.token_ids || [], a.output.logprobs, a.output.token_texts));
  recheck(callId, a.input.recorded_digest, check);
  return page;
}

/** Fetch the exact input as packed int32 and recompute its BLAKE2b-128 here, independently of the server. */
async function recheck(callId, recorded, target) {
  try {
    const buffer = await api(`/v1/calls/${callId}/input.bin`, null, "application/octet-stream");
    await new Promise((r) => setTimeout(r, 0));
    const digest = window.blake2bHex(new Uint8Array(buffer), 16);
    target.replaceChildren(el("code", {}, digest), digest === recorded ? " ✔ matches the recorded digest"
      : " ✘ differs from the recorded digest");
    target.className = digest === recorded ? "ok" : "error";
    target.dataset.digest = digest;
  } catch (err) {
    target.textContent = `could not recompute: ${err.message}`;
    target.className = "error";
  }
}

// -- scheduler (optional routes) ---------------------------------------------------------------------
function genericTable(body) {
  const items = Array.isArray(body) ? body : (body && Array.isArray(body.items) ? body.items : null);
  if (!items) return el("pre", { class: "context" }, JSON.stringify(body, null, 2));
  const columns = [...new Set(items.slice(0, 50).flatMap((r) => Object.keys(r)))];
  return table(columns.map((c) => ({ label: c, cell: (r) => (typeof r[c] === "object" && r[c] !== null
    ? JSON.stringify(r[c]) : fmt(r[c])) })), items, "none yet");
}

async function optionalPanel(title, path, present) {
  const panel = el("section", { class: "panel", id: `panel-${title.toLowerCase()}` }, el("h2", {}, title));
  if (!present) {
    panel.append(el("p", { class: "muted" }, `this server has no ${path} route`));
    return panel;
  }
  try {
    panel.append(genericTable(await api(path, { limit: 100 })));
  } catch (err) {
    if (err.status !== 404) throw err;
    panel.append(el("p", { class: "muted" }, `this server has no ${path} route`));
  }
  return panel;
}

async function pageScheduler() {
  return el("section", {}, el("h1", {}, "Scheduler"),
    await optionalPanel("Cells", "/v1/cells", state.features.cells),
    await optionalPanel("Decisions", "/v1/scheduler/decisions", state.features.decisions));
}

// -- routing ----------------------------------------------------------------------------------------
const ROUTES = [
  [/^#\/runs$/, (m, p) => pageRuns(p), "runs"],
  [/^#\/run\/(.+)$/, (m, p) => pageRun(decodeURIComponent(m[1]), p), "runs"],
  [/^#\/executions$/, (m, p) => pageExecutions(p), "executions"],
  [/^#\/execution\/([0-9a-f-]{36})$/, (m) => pageExecution(m[1]), "executions"],
  [/^#\/node\/([0-9a-f-]{36})$/, (m) => pageNode(m[1]), "executions"],
  [/^#\/call\/([0-9a-f-]{36})$/, (m) => pageCall(m[1]), "executions"],
  [/^#\/scheduler$/, () => pageScheduler(), "scheduler"],
];

async function render() {
  if (!apiKey()) { showLogin(); return; }
  const [path, qs] = (location.hash || "#/runs").split("?");
  const params = new URLSearchParams(qs || "");
  const route = ROUTES.find(([re]) => re.test(path));
  if (!route) { location.hash = "#/runs"; return; }
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === route[2]);
  setStatus("loading…");
  const hash = location.hash;
  delete document.body.dataset.rendered;
  try {
    const view = await route[1](path.match(route[0]), params);
    if (location.hash !== hash) return; // navigated away meanwhile: that render wins
    $("main").replaceChildren(view);
    setStatus("");
    document.body.dataset.rendered = hash; // for tests and scripts: this page is complete
  } catch (err) {
    if (err.status === 401) { sessionStorage.removeItem(KEY_SLOT); showLogin(`The server refused the key: ${err.message}`); setStatus(""); return; }
    $("main").replaceChildren(el("p", { class: "error", id: "page-error" }, `${err.status || ""} ${err.code || ""}: ${err.message}`));
    setStatus("");
  }
}

async function start() {
  try {
    state.features = await (await fetch("features.json", { cache: "no-store" })).json();
  } catch (_) { /* an older server: no optional panels */ }
  $("nav-scheduler").hidden = !(state.features.cells || state.features.decisions);
  $("login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const key = $("key-input").value.trim();
    $("key-input").value = "";
    if (await useKey(key)) render();
  });
  $("logout").addEventListener("click", () => { sessionStorage.removeItem(KEY_SLOT); showLogin(); });
  window.addEventListener("hashchange", render);
  if (apiKey() && await useKey(apiKey())) render();
  else if (!apiKey()) showLogin();
}

start();
