"""The web viewer at /ui in a real browser: headless Chromium (Debian's package) driven by Playwright,
against a real ``sapwood serve`` subprocess over a small synthetic SQLite store (char tokenizer).

Chromium is required, not optional: without it these tests fail (``scripts/test`` installs it).
Screenshots of each page go to ``$SAPWOOD_UI_SCREENSHOTS`` (``=docs`` refreshes the README's) or a temp dir.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright

from sapwood.api import ApiSettings, create_app
from sapwood.api.auth import create_key
from sapwood.platform import runs
from sapwood.platform.events import CellHeartbeat, CellRegistered, RoleAssigned
from sapwood.platform.store import Store
from sapwood.platform.writer import ExecutionWriter
from tests.support.api_client import calls_of, load_executions
from tests.support.histories import drift_execution
from tests.support.live_server import sapwood_serve, serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
#: Where screenshots go: ``SAPWOOD_UI_SCREENSHOTS=docs`` refreshes the README's; by default a temp dir.
SHOTS = ROOT / os.environ.get("SAPWOOD_UI_SCREENSHOTS", str(Path(tempfile.gettempdir()) / "sapwood-ui-screenshots"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
XSS_CONTEXT = '<script>window.__xss = "script"</script><img src=x onerror="window.__xss = \'img\'">'
XSS_OUTPUT = "</pre><b onmouseover=alert(1)>bold?</b>"


def chromium_path() -> str:
    path = os.environ.get("SAPWOOD_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("Chromium is missing: install Debian's package (apt-get install chromium; scripts/test does) "
                    "or point SAPWOOD_CHROMIUM at a Chromium binary")
    return path


def chars(text: str) -> np.ndarray:
    return np.array([ord(c) for c in text], dtype=np.int32)


def hostile_execution() -> ExecutionWriter:
    """An execution whose tokens decode (char tokenizer) to markup and script."""
    w = ExecutionWriter(run_id="hostile", task_id="<i>task</i>", engine="<b>engine</b>")
    w.start()
    p = w.prompt(chars(XSS_CONTEXT))
    out = chars(XSS_OUTPUT)
    w.call(p.node_id, chars(" answer:"), out, np.linspace(-3.0, -0.01, out.size, dtype=np.float32))
    w.finish("success", reward=1.0)
    return w


BIDI_TEXT = "\u202Elive \u2066x\u2069"
#: the one run with chat calls checked for retokenization drift: 3 checked, 2 drifted (one at position 0)
DRIFT_RUN = "chat-drift"
BIG_NODES = 16_384


def big_execution() -> ExecutionWriter:
    """A 16,384-node tree: 64 branches from one prompt; each a chain of ~250 observations with a one-node
    side branch every 25 nodes, and one compaction (summary call + new segment) in the first branch."""
    w = ExecutionWriter(run_id="big", task_id="big-tree", engine="synthetic")
    w.start()
    root = w.prompt(chars("solve the big task")).node_id
    w.fork(root, 64)
    n = 1
    for b in range(64):
        at = root
        for i in range(255):
            if n >= BIG_NODES:
                break
            if b == 0 and i == 100:
                summary = w.call(at, chars(""), chars("sum"), np.full(3, -0.5, dtype=np.float32), kind="summary")
                w.compact(summary.output_node_id, chars("compacted context"))
                at = summary.output_node_id
                n += 2
                continue
            at = w.observe(at, chars(f"b{b} step {i}")).node_id
            n += 1
            if i % 25 == 24 and n < BIG_NODES:
                w.observe(at, chars("side"))
                n += 1
    w.finish("success", reward=1.0)
    return w


def bidi_execution() -> ExecutionWriter:
    """An execution whose text (char tokenizer) carries bidi-override and isolate controls."""
    w = ExecutionWriter(run_id="bidi", task_id="bidi-task", engine="synthetic")
    w.start()
    p = w.prompt(chars(BIDI_TEXT))
    out = chars("ok \u202Dxy")
    w.call(p.node_id, chars(""), out, np.full(out.size, -0.2, dtype=np.float32))
    w.finish("success", reward=1.0)
    return w


def group_starts(tree: dict[str, Any]) -> set[str]:
    """Node ids that begin a box of the drawn tree: roots, segment roots, and children of a fork, of a summary or
    of a node with other than one child (a run of single children in one segment is one box)."""
    kids: dict[str, int] = {}
    for n in tree["nodes"]:
        if n["parent_id"]:
            kids[n["parent_id"]] = kids.get(n["parent_id"], 0) + 1
    ends = set(tree["fork_points"]) | {n["node_id"] for n in tree["nodes"] if n["role"] == "summary"}
    return {n["node_id"] for n in tree["nodes"]
            if not n["parent_id"] or n["parent_id"] in ends or kids[n["parent_id"]] != 1}


@dataclass
class Served:
    base: str
    key: str
    writers: list[ExecutionWriter]
    hostile: ExecutionWriter
    big: ExecutionWriter
    bidi: ExecutionWriter
    log: Path
    console: list[str] = field(default_factory=list)

    def api(self, path: str) -> Any:
        r = httpx.get(self.base + path, headers={"Authorization": f"Bearer {self.key}"}, timeout=30)
        r.raise_for_status()
        return r.json()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``sapwood serve`` (a subprocess, as deployed) over a store of 4 small executions + a hostile one."""
    tmp = tmp_path_factory.mktemp("ui")
    url = f"sqlite:///{tmp / 'ui.db'}"
    store = Store.open(url)
    writers = load_executions(store, 4)
    hostile = hostile_execution()
    store.apply(hostile.events)
    big, bidi = big_execution(), bidi_execution()
    store.apply(big.events)
    store.apply(bidi.events)
    store.apply(drift_execution(DRIFT_RUN, [(False, None), (True, None), (True, 0), (True, 5)]).events)
    with store.transaction() as conn:
        key = create_key(conn, "viewer", "read")[0]
        runs.create_run(conn, "replay-1", runs.ExecutionFilter(run_id="rollout-a"), seed=3, description="warm-up")
        claimed = runs.claim(conn, "replay-1", "learner-0", 2)
        runs.complete(conn, "replay-1", "learner-0", claimed[:1])
    store.close()
    log = tmp / "serve.log"
    env = {"SAPWOOD_DATABASE_URL": url, "SAPWOOD_TOKENIZER": "char", "SAPWOOD_KAFKA_BOOTSTRAP": ""}
    with log.open("w") as out, sapwood_serve(env, output=out) as base:
        yield Served(base, key, writers, hostile, big, bidi, log)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser, served: Served) -> Iterator[Page]:
    """A fresh tab (own session storage) that records console errors and failed requests."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    served.console.clear()

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type in ("error", "warning"):
            served.console.append(f"console {msg.type}: {msg.text}")

    tab.on("console", on_console)
    tab.on("pageerror", lambda exc: served.console.append(f"page error: {exc}"))
    tab.on("requestfailed", lambda req: served.console.append(f"request failed: {req.url}"))
    yield tab
    context.close()


def login(page: Page, served: Served, key: str | None = None) -> None:
    page.goto(served.base + "/ui/")
    page.fill("#key-input", key or served.key)
    page.click("#login-form button")


def goto(page: Page, served: Served, hash_: str) -> None:
    """Open ``/ui/<hash_>`` and wait until the viewer has rendered that page."""
    page.goto(served.base + "/ui/" + hash_)
    page.wait_for_function("h => document.body.dataset.rendered === h", arg=hash_, timeout=60_000)


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"ui-{name}.png"), full_page=False)


def test_pages_load_without_console_errors(page: Page, served: Served) -> None:
    w = served.writers[1]  # timed out, with a partial score
    call = calls_of(w)[-1].event_id
    login(page, served)
    page.wait_for_selector("text=rollout-a")
    assert "1/4 done, 1 claimed" in page.text_content("main table")  # the replay run's progress
    shot(page, "runs")
    visits = [("run", "#/run/replay-1", "text=Queue (claim order)"),
              ("executions", "#/executions", "table"),
              ("executions-filtered", "#/executions?status=timeout&task_id=task-1", "table"),
              ("execution", f"#/execution/{w.execution_id}", "#tree .node"),
              ("call", f"#/call/{call}", "#browser-check code"),
              ("node", f"#/node/{w.leaves()[0]}", "#trajectory .piece"),
              ("scheduler-absent", "#/scheduler", "#panel-cells")]
    for name, hash_, ready in visits:
        goto(page, served, hash_)
        page.wait_for_selector(ready, timeout=30_000)
        assert page.locator("#page-error").count() == 0, page.locator("#page-error").text_content()
        shot(page, name)
    assert served.console == []
    traj = served.api(f"/v1/nodes/{w.leaves()[0]}/trajectory?limit=8192")
    goto(page, served, f"#/node/{w.leaves()[0]}")
    assert page.locator("#trajectory .piece").count() == len(traj["pieces"])
    # the key never reaches a URL, and lives in this tab's session storage only
    assert served.key not in page.url
    assert page.evaluate("sessionStorage.getItem('sapwood.apiKey')") == served.key
    assert page.evaluate("localStorage.length") == 0
    assert served.key not in served.log.read_text()


def test_the_runs_page_shows_the_run_level_drift_table(page: Page, served: Served) -> None:
    login(page, served)
    page.wait_for_selector("#drift-table table")
    rows = [[cell.strip() for cell in row.locator("td").all_text_contents()]
            for row in page.locator("#drift-table tbody tr").all()]
    assert rows == [[DRIFT_RUN, "4", "3", "2", "66.67 %", "0"]], "only the checked run; position 0 is shown"
    assert served.api("/v1/drift")["runs"][0]["run_id"] == DRIFT_RUN
    page.locator("#drift-table").scroll_into_view_if_needed()
    shot(page, "drift")
    assert served.console == []


def test_filters_narrow_the_executions(page: Page, served: Served) -> None:
    login(page, served)
    page.wait_for_selector("text=rollout-a")
    goto(page, served, "#/executions")
    page.check("input[name=status][value=timeout]")
    page.fill("input[name=task_id]", "task-1")
    page.click("#filters button")
    page.wait_for_function("h => document.body.dataset.rendered === h",
                           arg="#/executions?status=timeout&task_id=task-1")
    expected = served.api("/v1/executions?status=timeout&task_id=task-1")["items"]
    rows = page.locator("main table tbody tr")
    assert rows.count() == len(expected) >= 1
    assert page.locator("main table tbody").text_content().count("timeout") == len(expected)


def test_the_tree_of_a_three_segment_execution_with_forks(page: Page, served: Served) -> None:
    w = served.writers[1]
    tree = served.api(f"/v1/executions/{w.execution_id}/tree")
    ex = tree["execution"]
    assert ex["n_segments"] == 3
    assert ex["n_forks"] >= 1
    assert ex["status"] == "timeout"
    starts = group_starts(tree)
    assert len(starts) < len(tree["nodes"])  # some chains are collapsed
    page.set_viewport_size({"width": 1400, "height": 6000})  # tall enough that every box is in view
    login(page, served)
    page.wait_for_selector("text=rollout-a")
    goto(page, served, f"#/execution/{w.execution_id}")
    page.wait_for_selector("#tree[data-ready]")
    assert page.get_attribute("#tree", "data-groups") == str(len(starts))
    boxes = page.locator("#tree .node")
    assert boxes.count() == len(starts)
    assert set(page.eval_on_selector_all("#tree .node", "els => els.map(e => e.dataset.node)")) == starts
    counts = page.eval_on_selector_all("#tree .node", "els => els.map(e => Number(e.dataset.count))")
    assert sum(counts) == len(tree["nodes"])
    assert set(page.eval_on_selector_all("#tree .node", "els => els.map(e => e.dataset.segment)")) == {"0", "1", "2"}
    segment_roots = [n for n in tree["nodes"] if n["parent_id"] is None and n["prev_segment_node"]]
    assert page.locator("#tree .node.segment-root").count() == len(segment_roots) >= 2
    # one dashed edge per compaction, from the summary's box to the segment root's
    assert (page.get_attribute("#tree .segment-edge", "d") or "").count("M") == len(segment_roots)
    assert page.locator("#tree .flag.fork").count() == len(tree["fork_points"])
    assert page.locator("#tree .flag.summary").count() == sum(n["role"] == "summary" for n in tree["nodes"])
    leaves = page.locator("#tree .flag.leaf")
    assert leaves.count() == len(tree["leaves"])
    partial = f"timed out — partial score {ex['score']:.3f}"
    assert all(partial in t for t in leaves.all_text_contents())
    # text inline (char tokenizer): every box shows its first node's decoded text
    first = tree["nodes"][0]
    detail = served.api(f"/v1/nodes/{first['node_id']}?limit=48")
    page.wait_for_function("([id, t]) => document.querySelector(`#tree [data-node='${id}'] .txt`).textContent === t",
                           arg=[first["node_id"], detail["text"]])
    # a collapsed chain expands into one box per node, and collapses back
    chain = page.locator("#tree .node.chain").first
    key, count = chain.get_attribute("data-node"), int(chain.get_attribute("data-count") or 0)
    assert count >= 2
    chain.locator(".chain-toggle").click()
    assert page.get_attribute("#tree", "data-groups") == str(len(starts) + count - 1)
    assert page.get_attribute(f"#tree [data-node='{key}']", "data-count") == "1"
    page.click(f"#tree [data-node='{key}'] .chain-toggle")
    assert page.get_attribute("#tree", "data-groups") == str(len(starts))
    page.set_viewport_size({"width": 1280, "height": 900})
    shot(page, "tree")


def test_a_16k_node_tree_draws_in_under_a_second(page: Page, served: Served) -> None:
    """Time from the parsed /tree response to the first full draw of the viewport (the page's performance
    measure "sapwood:tree-render"), and only the boxes in view are in the DOM."""
    eid = served.big.execution_id
    tree = served.api(f"/v1/executions/{eid}/tree")
    assert len(tree["nodes"]) == BIG_NODES
    assert not tree["truncated"]
    starts = group_starts(tree)
    login(page, served)
    page.wait_for_selector("text=rollout-a")
    goto(page, served, f"#/execution/{eid}")
    page.wait_for_selector("#tree[data-ready]")
    render_ms = page.evaluate("performance.getEntriesByName('sapwood:tree-render')[0].duration")
    page.wait_for_function("performance.getEntriesByName('sapwood:tree-painted').length > 0")
    marks = page.evaluate("Object.fromEntries(['data', 'laid-out', 'drawn', 'painted'].map(m => [m, "
                          "performance.getEntriesByName('sapwood:tree-' + m)[0].startTime]))")
    print(f"16K-node tree: {render_ms:.0f} ms from parsed response to the viewport drawn ({len(starts)} boxes; "
          f"layout {marks['laid-out'] - marks['data']:.0f} ms); the page's next frame "
          f"{marks['painted'] - marks['data']:.0f} ms after the response")
    assert render_ms < 1000
    assert page.get_attribute("#tree", "data-nodes") == str(BIG_NODES)
    assert page.get_attribute("#tree", "data-groups") == str(len(starts))
    in_dom = page.locator("#tree .node").count()
    assert 0 < in_dom < 100 < len(starts)  # virtualised: only what is in view
    assert page.locator("#tree .node.segment-root").count() + page.locator("#tree .flag.fork").count() >= 1
    shot(page, "tree-16k")
    before = set(page.eval_on_selector_all("#tree .node", "els => els.map(e => e.dataset.node)"))
    page.eval_on_selector("#tree", "t => { t.scrollTop = t.scrollHeight; }")
    page.wait_for_function("n => [...document.querySelectorAll('#tree .node')].every(e => !n.includes(e.dataset.node))",
                           arg=sorted(before))
    assert 0 < page.locator("#tree .node").count() < 100
    assert served.console == []


def test_the_trajectory_table_renders_only_the_rows_in_view(page: Page, served: Served) -> None:
    """The big execution's hundreds of trajectories: a few dozen rows in the DOM, the last reached by scrolling."""
    eid = served.big.execution_id
    leaves = [t["leaf_node_id"] for t in served.api(f"/v1/executions/{eid}/trajectories")["items"]]
    assert len(leaves) > 200
    login(page, served)
    page.wait_for_selector("text=rollout-a")
    goto(page, served, f"#/execution/{eid}")
    page.wait_for_selector("#trajectories[data-rows]")
    assert page.get_attribute("#trajectories", "data-rows") == str(len(leaves))
    in_dom = page.locator("#trajectories tr.row").count()
    assert 0 < in_dom < 60
    assert page.get_attribute("#trajectories", "data-first") == "0"
    page.eval_on_selector("#trajectories", "t => { t.scrollTop = t.scrollHeight; }")
    page.wait_for_function("n => document.querySelector('#trajectories').dataset.last === String(n - 1)",
                           arg=len(leaves))
    assert 0 < page.locator("#trajectories tr.row").count() < 60
    last_link = page.locator("#trajectories tr.row").last.locator("a").get_attribute("href")
    assert last_link == f"#/node/{leaves[-1]}"
    scroll = page.eval_on_selector("#trajectories", "t => [t.scrollHeight, t.clientHeight]")
    assert scroll[0] >= 28 * len(leaves)  # the spacers keep the scrollbar the full table's length
    assert served.console == []


def test_bidi_controls_are_shown_escaped_in_logical_order(page: Page, served: Served) -> None:
    w = served.bidi
    (root,) = [n for n in served.api(f"/v1/executions/{w.execution_id}/tree")["nodes"] if n["role"] == "prompt"]
    escaped = "\\u202Elive \\u2066x\\u2069"
    login(page, served)
    page.wait_for_selector("text=rollout-a")
    goto(page, served, f"#/node/{root['node_id']}")
    assert page.text_content("#node-text") == escaped
    assert page.eval_on_selector_all("#node-text .bidi", "els => els.map(e => e.textContent)") == [
        "\\u202E", "\\u2066", "\\u2069"]
    controls = page.evaluate("() => [...document.body.innerText].filter(c => /[\\u202A-\\u202E\\u2066-\\u2069"
                             "\\u200E\\u200F\\u061C]/.test(c)).length")
    assert controls == 0
    # "live" is laid out left to right as stored: each letter right of the one before
    lefts = page.evaluate("""() => {
      const t = [...document.querySelector('#node-text').childNodes]
        .find(n => n.nodeType === 3 && n.data.startsWith('live'));
      return [0, 1, 2, 3].map(i => { const r = document.createRange(); r.setStart(t, i); r.setEnd(t, i + 1);
        return r.getBoundingClientRect().left; }); }""")
    assert lefts == sorted(lefts)
    assert len(set(lefts)) == 4
    goto(page, served, f"#/execution/{w.execution_id}")
    page.wait_for_function(
        "id => document.querySelector(`#tree [data-node='${id}'] .txt`).textContent.includes('live')",
        arg=root["node_id"])
    assert page.text_content(f"#tree [data-node='{root['node_id']}'] .txt") == escaped
    call = calls_of(w)[0].event_id
    goto(page, served, f"#/call/{call}")
    assert page.text_content("#output-text") == "ok \\u202Dxy"
    shot(page, "bidi")


def test_clicking_a_call_shows_the_context_the_audit_verified(page: Page, served: Served) -> None:
    w = served.writers[0]
    tree = served.api(f"/v1/executions/{w.execution_id}/tree")
    node = next(n for n in tree["nodes"] if n["call_id"] and n["segment"] == 2)
    audit = served.api(f"/v1/calls/{node['call_id']}/audit")
    starts, by_id = group_starts(tree), {n["node_id"]: n for n in tree["nodes"]}
    start = node
    while start["node_id"] not in starts:  # the collapsed chain holding the node
        start = by_id[start["parent_id"]]
    page.set_viewport_size({"width": 8000, "height": 6000})  # an expanded chain is wide
    login(page, served)
    page.wait_for_selector("text=rollout-a")
    goto(page, served, f"#/execution/{w.execution_id}")
    if page.get_attribute(f"#tree [data-node='{start['node_id']}']", "data-count") != "1":
        page.click(f"#tree [data-node='{start['node_id']}'] .chain-toggle")  # expand: one box per node
    page.click(f"#tree [data-node='{node['node_id']}'] a.call")
    page.set_viewport_size({"width": 1280, "height": 900})
    page.wait_for_selector("#browser-check code", timeout=60_000)
    assert page.text_content("#recorded-digest") == audit["input"]["recorded_digest"]
    assert page.text_content("#computed-digest") == audit["input"]["computed_digest"]
    # recomputed in the browser (BLAKE2b-128 of /input.bin), independently of the server's check
    assert page.get_attribute("#browser-check", "data-digest") == audit["input"]["recorded_digest"]
    assert "matches" in page.text_content("#browser-check")
    assert page.text_content("#verified").startswith("✔ verified")
    assert page.text_content("#input-context") == audit["input"]["text"]
    assert page.text_content("#policy-version") == str(audit["call"]["policy_version"])
    assert page.locator("#heatmap .tok").count() == audit["output"]["length"]
    # the heat map colours the output's text tokens (char tokenizer: one character each), with a legend
    assert audit["output"]["token_texts"] == list(audit["output"]["text"])
    assert page.eval_on_selector_all("#heatmap .tok.text", "els => els.map(e => e.textContent)") == [
        t.replace("\n", "↵").replace("\t", "→") for t in audit["output"]["token_texts"]]
    assert page.is_visible("#heatmap-legend")
    assert "probability of the sampled token" in page.text_content("#heatmap-legend")
    shot(page, "audit")


def test_a_bad_key_shows_the_error(page: Page, served: Served) -> None:
    key_id = served.key.split(".")[0]
    for bad, expected in ((f"{key_id}.{'A' * 43}", "invalid or revoked API key"),
                          ("not-a-key", "malformed API key")):
        login(page, served, bad)
        page.wait_for_selector("#login-error:not(:empty)")
        assert expected in page.text_content("#login-error")
        assert page.is_visible("#login")
        assert page.locator("#main *").count() == 0
        assert page.evaluate("sessionStorage.getItem('sapwood.apiKey')") is None
    shot(page, "bad-key")


def test_decoded_markup_is_shown_as_text_never_run(page: Page, served: Served) -> None:
    call = calls_of(served.hostile)[0].event_id
    login(page, served)
    page.wait_for_selector("text=rollout-a")
    goto(page, served, f"#/call/{call}")
    page.wait_for_selector("#browser-check code", timeout=30_000)
    assert page.text_content("#input-context") == XSS_CONTEXT + " answer:"
    assert page.text_content("#output-text") == XSS_OUTPUT
    assert page.text_content("#engine") == "<b>engine</b>"
    page.hover("#output-text")
    assert page.evaluate("window.__xss") is None
    assert page.locator("main script, main img, main b, main i").count() == 0
    goto(page, served, "#/executions?run_id=hostile")
    assert "<i>task</i>" in page.text_content("main table")
    assert page.locator("main i").count() == 0
    assert page.evaluate("window.__xss") is None
    shot(page, "escaped")


def test_the_scheduler_panel_shows_cells_and_decisions(browser: Browser, served: Served, tmp_path: Path) -> None:
    """Cells and role decisions recorded as events are listed by the scheduler panel; a decision's reason is
    untrusted text and stays text; the page logs no error."""
    store = Store.open(f"sqlite:///{tmp_path / 'cells.db'}")
    now = time.time()
    store.apply([CellRegistered(cell_id="rollout-a", tier="core", capacity=4, created_at=now - 60),
                 CellRegistered(cell_id="train-b", tier="satellite", capacity=8, created_at=now - 60),
                 CellHeartbeat(cell_id="rollout-a", created_at=now - 1),
                 CellHeartbeat(cell_id="train-b", created_at=now - 1),
                 RoleAssigned(cell_id="train-b", role="train", previous_role="rollout", reason="<b>busy</b> learner",
                              policy="elastic", signals={"backlog_tokens": 123}, created_at=now - 30)])
    with store.transaction() as conn:
        key = create_key(conn, "viewer", "read")[0]
    app = create_app(ApiSettings(), store=store)
    context = browser.new_context()
    tab = context.new_page()
    errors: list[str] = []
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    with serve_in_thread(app) as base:
        tab.goto(base + "/ui/")
        tab.fill("#key-input", key)
        tab.click("#login-form button")
        tab.wait_for_selector("#logout:not([hidden])")
        assert tab.is_visible("#nav-scheduler"), errors
        tab.goto(base + "/ui/#/scheduler")
        tab.wait_for_function("h => document.body.dataset.rendered === h", arg="#/scheduler")
        cells_text = tab.text_content("#panel-cells")
        assert "rollout-a" in cells_text
        assert "train-b" in cells_text
        assert tab.locator("#panel-cells tbody tr").count() == 2
        decisions_text = tab.text_content("#panel-decisions")
        assert "<b>busy</b> learner" in decisions_text
        assert "backlog_tokens" in decisions_text
        assert tab.locator("#panel-decisions tbody tr").count() == 1
        assert tab.locator("#panel-decisions b").count() == 0
        SHOTS.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(SHOTS / "ui-scheduler.png"))
    context.close()
    store.close()
    assert errors == []
