// The execution tree, drawn: single-child chains collapsed into one box (expandable), laid out with the
// vendored d3-hierarchy (vendor/d3-hierarchy.min.js, ISC licence), and virtualised: only the boxes and
// edges inside the scrolled viewport are in the DOM, so a 16K-node tree draws in well under a second.
// Sets performance marks "sapwood:tree-data" (response parsed), "sapwood:tree-laid-out", "sapwood:tree-drawn"
// (the viewport's boxes and edges built), "sapwood:tree-painted" (the page's next frame, which includes the
// rest of the page) and the measure "sapwood:tree-render" from data to drawn.
"use strict";

const TREE_BOX_W = 290, TREE_BOX_H = 46, TREE_GAP_X = 40, TREE_GAP_Y = 10, TREE_OVERSCAN = 200;

/** Groups of nodes: a run of single children in one segment becomes one group; forks, leaves and segment
 * boundaries end a run. `expanded` holds group keys (first node ids) drawn node by node. */
function treeGroups(tree, expanded) {
  const byId = new Map(tree.nodes.map((n) => [n.node_id, n]));
  const children = new Map();
  const roots = [];
  for (const n of tree.nodes) {
    const up = n.parent_id || n.prev_segment_node;
    if (up && byId.has(up)) {
      if (!children.has(up)) children.set(up, []);
      children.get(up).push(n);
    } else roots.push(n);
  }
  const forks = new Set(tree.fork_points);
  const groups = [];
  function group(start, chainKey) {
    const g = { key: start.node_id, nodes: [start], children: [], segmentRoot: !start.parent_id && !!start.prev_segment_node };
    groups.push(g);
    let n = start;
    const collapsible = !expanded.has(chainKey || start.node_id);
    for (;;) {
      const kids = children.get(n.node_id) || [];
      const single = kids.length === 1 && kids[0].parent_id && !forks.has(n.node_id) && n.role !== "summary";
      if (single && collapsible) {
        n = kids[0];
        g.nodes.push(n);
        continue;
      }
      if (single) {
        g.children.push(group(kids[0], chainKey || start.node_id)); // an expanded chain: one box per node
      } else {
        for (const kid of kids) g.children.push(group(kid, null));
      }
      g.last = n;
      g.fork = forks.has(n.node_id);
      g.forkBranches = Math.max(n.fork_branches, kids.length);
      g.chainKey = chainKey || start.node_id;
      return g;
    }
  }
  const top = { key: "", nodes: [], children: roots.map((r) => group(r, null)), virtual: true };
  return { top, groups, children };
}

function renderTreeView(tree, opts) {
  performance.mark("sapwood:tree-data");
  const ex = tree.execution;
  const expanded = new Set();
  const texts = new Map(); // node id → decoded text (fetched for boxes in view)
  const box = el("div", { class: "tree-view", id: "tree", tabindex: "0" });
  const inner = el("div", { class: "tree-inner" });
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.classList.add("tree-edges");
  const layer = el("div", { class: "tree-boxes" });
  inner.append(svg, layer);
  box.append(inner);
  let laid = [], links = [], drawnOnce = false, pending = false;

  function layout() {
    const { top, groups } = treeGroups(tree, expanded);
    const root = d3.hierarchy(top, (g) => g.children);
    d3.tree().nodeSize([TREE_BOX_H + TREE_GAP_Y, TREE_BOX_W + TREE_GAP_X])
      .separation(() => 1)(root);
    let minX = Infinity, maxX = -Infinity, maxY = 0;
    laid = root.descendants().filter((d) => !d.data.virtual);
    for (const d of laid) { minX = Math.min(minX, d.x); maxX = Math.max(maxX, d.x); maxY = Math.max(maxY, d.y); }
    for (const d of laid) { d.top = d.x - minX + 8; d.left = d.y - (TREE_BOX_W + TREE_GAP_X) + 8; }
    laid.sort((a, b) => a.top - b.top);
    links = laid.filter((d) => d.parent && !d.parent.data.virtual);
    inner.style.height = `${(laid.length ? maxX - minX : 0) + TREE_BOX_H + 16}px`;
    inner.style.width = `${Math.max(0, maxY - (TREE_BOX_W + TREE_GAP_X)) + TREE_BOX_W + 16}px`;
    box.dataset.groups = String(groups.length);
    box.dataset.nodes = String(tree.nodes.length);
  }

  function firstAtOrBelow(arr, y) { // binary search on .top
    let lo = 0, hi = arr.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (arr[mid].top < y) lo = mid + 1; else hi = mid; }
    return lo;
  }

  function nodeBox(d) {
    const g = d.data;
    const first = g.nodes[0], last = g.last;
    const tokens = g.nodes.reduce((s, n) => s + n.length, 0);
    const flags = [];
    if (g.segmentRoot) flags.push(el("span", { class: "flag segment" }, `segment ${first.segment}`));
    if (g.fork) flags.push(el("span", { class: "flag fork" }, `fork ×${g.forkBranches}`));
    if (last.role === "summary") flags.push(el("span", { class: "flag summary" }, "compaction summary"));
    if (last.is_leaf) flags.push(el("span", { class: "flag leaf" }, "leaf: ", opts.leafOutcome(ex, last.node_id, ex.reward)));
    const head = g.nodes.length > 1
      ? el("button", { type: "button", class: "chain-toggle", title: "expand this chain node by node",
        onclick: () => { expanded.add(g.chainKey); redraw(); } }, `▸ ${g.nodes.length} nodes`)
      : (expanded.has(g.chainKey) && g.chainKey === g.key && d.children && d.children.length === 1
        ? el("button", { type: "button", class: "chain-toggle", title: "collapse this chain",
          onclick: () => { expanded.delete(g.chainKey); redraw(); } }, "▾") : null);
    const txt = el("span", { class: "txt" });
    if (opts.tokenizer) fillText(txt, first.node_id);
    const div = el("div", {
      class: `node ${last.role}${g.segmentRoot ? " segment-root" : ""}${g.nodes.length > 1 ? " chain" : ""}`,
      dataset: { node: first.node_id, last: last.node_id, count: String(g.nodes.length), role: last.role,
        segment: String(first.segment) },
      style: { top: `${d.top}px`, left: `${d.left}px`, width: `${TREE_BOX_W}px`, height: `${TREE_BOX_H}px` },
    },
    el("div", { class: "line", title: `${last.role}, segment ${first.segment}` }, head,
      link(`#/node/${first.node_id}`, short(first.node_id), "mono"),
      el("span", { class: "len" }, `${tokens} tok`),
      last.call_id ? link(`#/call/${last.call_id}`, "call", "call") : null, flags),
    txt);
    return div;
  }

  function fillText(target, nodeId) {
    if (texts.has(nodeId)) { target.replaceChildren(...neutralise(texts.get(nodeId))); return; }
    target.textContent = "…";
    texts.set(nodeId, "…");
    api(`/v1/nodes/${nodeId}`, { limit: 48 }).then((n) => {
      texts.set(nodeId, n.text === null ? "" : n.text);
      const live = layer.querySelector(`[data-node="${nodeId}"] .txt`);
      if (live) live.replaceChildren(...neutralise(texts.get(nodeId)));
    }).catch(() => texts.delete(nodeId));
  }

  function draw() {
    pending = false;
    // before the box is in the page (first draw) its size is that of its CSS: 70% of the window's height
    const height = box.clientHeight || window.innerHeight * 0.7, width = box.clientWidth || window.innerWidth;
    const top = box.scrollTop - TREE_OVERSCAN, bottom = box.scrollTop + height + TREE_OVERSCAN;
    const left = box.scrollLeft - TREE_OVERSCAN, right = box.scrollLeft + width + TREE_OVERSCAN;
    const visible = [];
    for (let i = firstAtOrBelow(laid, top - TREE_BOX_H); i < laid.length && laid[i].top <= bottom; i++) {
      const d = laid[i];
      if (d.left + TREE_BOX_W >= left && d.left <= right) visible.push(d);
    }
    layer.replaceChildren(...visible.map(nodeBox));
    const path = [];
    const segPath = [];
    for (const d of links) {
      const p = d.parent;
      const y0 = Math.min(p.top, d.top), y1 = Math.max(p.top, d.top) + TREE_BOX_H;
      if (y1 < top || y0 > bottom || d.left < left - TREE_GAP_X || p.left > right) continue;
      const x0 = p.left + TREE_BOX_W, ya = p.top + TREE_BOX_H / 2, x1 = d.left, yb = d.top + TREE_BOX_H / 2;
      const mx = (x0 + x1) / 2;
      (d.data.segmentRoot ? segPath : path).push(`M${x0},${ya}C${mx},${ya} ${mx},${yb} ${x1},${yb}`);
    }
    const mk = (dd, cls) => {
      const pth = document.createElementNS("http://www.w3.org/2000/svg", "path");
      pth.setAttribute("d", dd.join(""));
      pth.setAttribute("class", cls);
      return pth;
    };
    svg.setAttribute("width", inner.style.width);
    svg.setAttribute("height", inner.style.height);
    svg.replaceChildren(mk(path, "edge"), mk(segPath, "edge segment-edge"));
    box.dataset.drawn = String(visible.length);
    if (!drawnOnce) {
      drawnOnce = true;
      performance.mark("sapwood:tree-drawn");
      performance.measure("sapwood:tree-render", "sapwood:tree-data", "sapwood:tree-drawn");
      box.dataset.ready = "1";
      requestAnimationFrame(() => performance.mark("sapwood:tree-painted")); // the page's next frame
    }
  }
  function schedule() { if (!pending) { pending = true; requestAnimationFrame(draw); } }
  function redraw() { layout(); draw(); }

  layout();
  performance.mark("sapwood:tree-laid-out");
  draw(); // the viewport's boxes are in the DOM before the page attaches the view
  box.addEventListener("scroll", schedule, { passive: true });
  new ResizeObserver(() => { if (box.isConnected) draw(); }).observe(box);
  return box;
}

/** Bidi controls (LRE..RLO, LRI..PDI, LRM/RLM, ALM) shown as escapes, so stored text cannot reorder the page. */
const BIDI_CONTROLS = /[\u202A-\u202E\u2066-\u2069\u200E\u200F\u061C]/g;
function neutralise(text) {
  const s = String(text);
  BIDI_CONTROLS.lastIndex = 0;
  if (!BIDI_CONTROLS.test(s)) return [document.createTextNode(s)];
  const out = [];
  let at = 0;
  BIDI_CONTROLS.lastIndex = 0;
  for (const m of s.matchAll(BIDI_CONTROLS)) {
    if (m.index > at) out.push(document.createTextNode(s.slice(at, m.index)));
    const esc = document.createElement("span");
    esc.className = "bidi";
    esc.title = "a bidirectional-text control character, shown escaped";
    esc.textContent = "\\u" + m[0].codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
    out.push(esc);
    at = m.index + m[0].length;
  }
  if (at < s.length) out.push(document.createTextNode(s.slice(at)));
  return out;
}
