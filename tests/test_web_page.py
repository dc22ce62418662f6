"""The built-in web page (issue #24): the cache snapshot it draws, the JSON endpoint behind it, and
the page itself in a real browser (the system's Chromium, driven by selenium) against a real server
on a tiny model. The browser tests skip, saying why, where Chromium, its driver or selenium is missing."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from test_radix_cache import tree_state
from test_server import API_KEY, AUTH, Server, start_server, stop_server
from tiny_models import build_thinking_model, build_tiny_model
from transformers import AutoTokenizer

from minisgl.kvcache.naive_cache import NaivePrefixCache
from minisgl.kvcache.radix_cache import RadixPrefixCache

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# The tiny model's word-level tokenizer knows "w3" .. "w511"; the template just joins the contents.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
WAIT_S = 60
DRAW_BOUND_MS = 3000  # generous: a 10,000-node tree draws in well under a second on two busy cores


def ids(values: list[int] | range) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64)


def label(namespace: str | None) -> str:
    return "shared" if namespace is None else f"hashed {len(namespace)}"


# ---- the snapshot, taken in the process that owns the cache ----------------------------------------
def test_snapshot_is_read_only_and_names_the_next_eviction() -> None:
    cache = RadixPrefixCache("cpu")
    cache.insert_prefix(ids(range(10)), ids(range(10)))
    cache.insert_prefix(ids([0, 1, 2, 3, 50, 51, 52]), ids(range(100, 107)))  # splits [0..9] after 4
    cache.insert_prefix(ids([7, 8, 9]), ids(range(200, 203)), namespace="alice-secret")
    locked = cache.insert_prefix(ids([0, 1, 2, 3, 60]), ids([0, 1, 2, 3, 300])).handle
    cache.lock_handle(locked)
    before = tree_state(cache)
    snap = cache.snapshot(100, 3, label, shown={None})
    assert tree_state(cache) == before  # no split, no clock tick, no LRU refresh
    cache.check_integrity()

    by_id = {n.id: n for n in snap.nodes}
    assert snap.total_nodes == len(snap.nodes) == 5
    roots = {ns.label: ns for ns in snap.namespaces}
    assert roots["shared"].tokens == 14 and roots["shared"].nodes == 4 and roots["shared"].tokens_shown
    assert roots["hashed 12"].tokens == 3 and not roots["hashed 12"].tokens_shown
    salted = [n for n in snap.nodes if n.parent == roots["hashed 12"].root]
    assert len(salted) == 1 and salted[0].head == [] and salted[0].length == 3  # counts only, no tokens
    shared_top = next(n for n in snap.nodes if n.parent == roots["shared"].root)
    assert shared_top.head == [0, 1, 2] and shared_top.length == 4 and shared_top.locks == 1
    assert shared_top.subtree_tokens == 14 and shared_top.subtree_nodes == 4
    for node in snap.nodes:  # parents first
        assert node.parent in by_id or node.parent in {ns.root for ns in snap.namespaces}

    # The path ends at the leaf that eviction really takes next.
    victim = by_id[snap.eviction_path[-1]]
    assert victim.subtree_nodes == 1 and victim.locks == 0
    assert by_id[snap.eviction_path[0]].parent in {ns.root for ns in snap.namespaces}
    freed = cache.evict(1).tolist()
    assert len(freed) == victim.length
    assert victim.id not in {n.id for n in cache.snapshot(100, 3, label, {None}).nodes}

    mine = cache.snapshot(100, 3, label, shown={None, "alice-secret"})
    alice = next(ns for ns in mine.namespaces if ns.label == "hashed 12")
    assert alice.tokens_shown and [n.head for n in mine.nodes if n.parent == alice.root] == [[7, 8, 9]]
    cache.lock_handle(locked, unlock=True)


def test_snapshot_bound_keeps_the_largest_branches_and_counts_the_rest() -> None:
    cache = RadixPrefixCache("cpu")
    for branch in range(20):  # one shared token, then 20 branches of 1..20 tokens
        cache.insert_prefix(
            ids([3] + [100 + branch] * (branch + 1)), ids(range(1000 * branch, 1000 * branch + branch + 2))
        )
    snap = cache.snapshot(5, 4, label, shown={None})
    assert snap.total_nodes == 21 and len(snap.nodes) == 5
    top = snap.nodes[0]
    assert top.length == 1 and top.subtree_nodes == 21 and top.subtree_tokens == 1 + sum(range(1, 21))
    children = [n for n in snap.nodes if n.parent == top.id]
    # The eviction path comes first (the oldest branch, 1 token), then the biggest branches.
    assert sorted(n.length for n in children) == [1, 18, 19, 20]
    with pytest.raises(ValueError, match="max_nodes"):
        cache.snapshot(0, 4, label, shown={None})
    assert NaivePrefixCache("cpu").snapshot(5, 4, label, shown={None}) is None  # it keeps no tree


# ---- the server: page, assets, the JSON endpoint ---------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("web")
    folder = build_tiny_model("llama", root / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(folder))
    srv = start_server(root, "--model", str(folder))
    yield srv
    assert stop_server(srv) == 0, srv.log.read_text()[-3000:]


def radix(server: Server, salt: str | None = None, **params: Any) -> dict[str, Any]:
    headers = {**AUTH, **({"X-Cache-Salt": salt} if salt is not None else {})}
    response = httpx.get(server.url + "/debug/radix", params=params, headers=headers, timeout=WAIT_S)
    assert response.status_code == 200, response.text
    return response.json()


def greedy_chat(server: Server, messages: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, **extra}
    response = server.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_page_is_open_and_the_data_needs_the_key(server: Server) -> None:
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'data-api-key-required="true"' in page.text and "/static/app.js" in page.text
    for name, kind in [("app.js", "text/javascript"), ("style.css", "text/css")]:
        asset = httpx.get(f"{server.url}/static/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
    assert httpx.get(server.url + "/static/nothing.js").status_code == 404
    assert httpx.get(server.url + "/debug/radix").status_code == 401
    assert httpx.get(server.url + "/debug/radix", headers={"Authorization": "Bearer wrong"}).status_code == 401
    for params, param in [({"max_nodes": 0}, "max_nodes"), ({"max_nodes": "x"}, "max_nodes"),
                          ({"head_tokens": 257}, "head_tokens")]:  # fmt: skip
        response = httpx.get(server.url + "/debug/radix", params=params, headers=AUTH)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    assert f"web page (chat, and the radix cache drawn live): {server.url}/" in server.log.read_text()


def test_salted_branches_show_counts_and_locks_but_no_text(server: Server) -> None:
    """Alice's request (cache_salt) while it decodes: the others see its namespace as a hash, its
    nodes' lengths and locks and its request, never its text or its salt; Alice sees her text."""
    salt, words = "alice-salt-123", "w401 w402 w403 w404 w405"
    body = {"messages": [{"role": "user", "content": words}], "max_tokens": 400, "temperature": 0,
            "stream": True, "cache_salt": salt}  # fmt: skip
    started, stop = threading.Event(), threading.Event()

    def stream() -> None:
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=WAIT_S) as r:
            for _ in r.iter_lines():
                started.set()
                if stop.is_set():
                    return  # closing the stream aborts the request

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        assert started.wait(WAIT_S)
        deadline = time.monotonic() + WAIT_S
        report = radix(server)
        while [r["state"] for r in report["requests"]] != ["decode"]:
            assert time.monotonic() < deadline, f"the request never showed as decoding: {report['requests']}"
            time.sleep(0.05)
            report = radix(server)
        mine = radix(server, salt=salt)
    finally:
        stop.set()
        thread.join(WAIT_S)
    text = json.dumps(report)
    assert salt not in text and "w401" not in text and "w402" not in text
    (request,) = report["requests"]
    assert request["prompt_tokens"] == 5 and request["max_tokens"] == 400
    alice = next(ns for ns in report["tree"]["namespaces"] if ns["label"] == request["namespace"])
    assert alice["label"] != "shared" and not alice["tokens_shown"] and alice["tokens"] >= 5
    nodes = [n for n in report["tree"]["nodes"] if n["parent"] == alice["root"]]
    assert nodes and all(n["text"] is None for n in nodes)
    assert [n["locks"] for n in nodes] == [1]  # its prompt, cached and locked while it decodes
    mine_ns = next(ns for ns in mine["tree"]["namespaces"] if ns["root"] == alice["root"])
    assert mine_ns["tokens_shown"]
    assert any(n["text"].startswith(words) for n in mine["tree"]["nodes"] if n["parent"] == alice["root"])
    server.assert_idle_balanced()


# ---- the page in Chromium ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if shutil.which(p) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


def wait(driver: Any, condition: Any, what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(lambda d: condition(d), what)


def console_errors(driver: Any) -> list[dict[str, Any]]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def by_id(driver: Any, element_id: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def open_page(driver: Any, server: Server) -> None:
    driver.get(server.url + "/")
    driver.execute_script("sessionStorage.clear()")  # the key of an earlier test's visit
    driver.refresh()
    wait(driver, lambda d: by_id(d, "key-dialog").get_attribute("open") is not None, "the API key dialog")
    by_id(driver, "key-input").send_keys(API_KEY)
    by_id(driver, "key-save").click()
    wait(driver, lambda d: by_id(d, "model-name").text, "the model's name from /v1/models")
    set_field(driver, "temperature", "0")
    set_field(driver, "max-tokens", "8")


def set_field(driver: Any, element_id: str, value: str) -> None:
    field = by_id(driver, element_id)
    field.clear()
    field.send_keys(value)


def send(driver: Any, text: str) -> tuple[str, str]:
    """Types a message, sends it, waits for the streamed answer; returns its text and its meta line."""
    before = len(meta_lines(driver))
    by_id(driver, "prompt").send_keys(text)
    by_id(driver, "send").click()
    wait(driver, lambda d: len(meta_lines(d)) > before and meta_lines(d)[-1], "the answer's meta line")
    answer = driver.find_elements("css selector", ".message.assistant .bubble")[-1].text
    return answer, meta_lines(driver)[-1]


def meta_lines(driver: Any) -> list[str]:
    return [m.text for m in driver.find_elements("css selector", ".message.assistant .meta")]


def shown_tree(driver: Any) -> dict[str, Any]:
    """The tree the Cache view last drew: waits for a fresh poll, then reads the page's own copy."""
    wait(driver, lambda d: d.execute_script("return !cacheView.loading"), "the poll in flight")
    driver.execute_script("cacheView.tree = null; cacheView.refresh();")
    wait(
        driver,
        lambda d: d.execute_script("return cacheView.tree !== null && !cacheView.loading"),
        "a /debug/radix poll",
    )
    script = """const t = cacheView.tree;
      return {total: t.total_nodes, nodes: [...t.byId.values()].filter((n) => !n.namespace)
        .map((n) => ({id: n.id, text: n.text, parent: n.parentNode.namespace ? null : n.parentNode.id}))};"""
    return driver.execute_script(script)


def path_texts(tree: dict[str, Any]) -> list[str]:
    """Each node's text with its ancestors' before it: the cached sequence it ends."""
    by_id = {n["id"]: n for n in tree["nodes"]}

    def full(node: dict[str, Any]) -> str:
        return node["text"] if node["parent"] is None else f"{full(by_id[node['parent']])} {node['text']}"

    return [full(n) for n in tree["nodes"]]


def common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_chat_streams_and_the_tree_shows_the_shared_prefix(browser: Any, server: Server) -> None:
    assert server.post("/flush_cache").status_code == 200
    open_page(browser, server)
    first = "w10 w11 w12 w13 w14 w15"
    answer, meta = send(browser, first)
    # The speed needs the text in more than one event; the tiny model's decode can fit in the first one's
    # wake, and then the page leaves it out.
    shown = r"6 prompt tokens · 0 cached · 8 generated( · [\d.]+ tokens/s)? · first token \d+ ms · finish: length"
    assert answer and re.fullmatch(shown, meta), meta

    by_id(browser, "tab-cache").click()
    tree = shown_tree(browser)
    (top,) = [n for n in tree["nodes"] if n["parent"] is None]
    assert top["text"] == first  # the prompt, then what was generated below it
    (cached_turn,) = [t for t in path_texts(tree) if len(t) == max(map(len, path_texts(tree)))]
    nodes_before = tree["total"]

    by_id(browser, "tab-chat").click()
    second = "w20 w21"
    answer2, meta2 = send(browser, second)
    # Served from the cache: as much of the second prompt as matches the first turn's cached tokens
    # (the page's text drops special tokens, the tree's keeps them), and at most all but its last token.
    prompt2 = f"{first} {answer} {second}".split()
    cached = min(common_prefix(cached_turn.split(), prompt2), len(prompt2) - 1)
    assert cached >= len(first.split())
    assert re.search(rf"{len(prompt2)} prompt tokens · {cached} cached · 8 generated", meta2), meta2

    by_id(browser, "tab-cache").click()
    tree = shown_tree(browser)
    assert tree["total"] > nodes_before
    (top,) = [n for n in tree["nodes"] if n["parent"] is None]  # the shared prefix, unchanged
    assert top["text"] == first
    assert any(t.startswith(first) and second in t for t in path_texts(tree))  # the second turn below it
    assert by_id(browser, "tree-summary").text.startswith(f"{tree['total']} nodes in the cache")
    assert console_errors(browser) == []

    # What the page showed is the whole answer, as the API gives it.
    history = [{"role": "user", "content": first}]
    assert answer == greedy_chat(server, history)["choices"][0]["message"]["content"]
    history += [{"role": "assistant", "content": answer}, {"role": "user", "content": second}]
    assert answer2 == greedy_chat(server, history)["choices"][0]["message"]["content"]
    server.assert_idle_balanced()


def test_stop_frees_the_request_and_regenerate_replaces_the_answer(browser: Any, server: Server) -> None:
    open_page(browser, server)
    set_field(browser, "max-tokens", "1000")
    by_id(browser, "prompt").send_keys("w40 w41 w42")
    by_id(browser, "send").click()
    wait(browser, lambda d: d.find_elements("css selector", ".message.streaming .bubble")[0].text, "streamed text")
    by_id(browser, "stop").click()
    meta = wait(browser, lambda d: d.find_element("css selector", ".message.assistant .meta").text, "the meta line")
    assert meta.endswith("stopped"), meta
    server.assert_idle_balanced()  # the stopped request was aborted and its KV freed
    set_field(browser, "max-tokens", "8")
    by_id(browser, "regenerate").click()
    wait(browser, lambda d: "generated" in d.find_element("css selector", ".message.assistant .meta").text, "an answer")
    answers = browser.find_elements("css selector", ".message.assistant")
    assert len(answers) == 1 and "8 generated" in answers[0].text  # replaced, not added
    assert console_errors(browser) == []


def test_the_page_shows_no_foreign_text_under_cache_salt(browser: Any, server: Server) -> None:
    foreign = "w300 w301 w302 w303"
    greedy_chat(server, [{"role": "user", "content": foreign}], cache_salt="tenant-a")
    open_page(browser, server)
    set_field(browser, "cache-salt", "tenant-b")
    own = "w310 w311 w312"
    send(browser, own)
    by_id(browser, "tab-cache").click()
    tree = shown_tree(browser)
    texts = [n["text"] for n in tree["nodes"] if n["text"] is not None]
    assert any(t.startswith(own) for t in texts)  # its own salted branch, with text
    assert not any("w300" in t or "w301" in t for t in texts)
    assert None in [n["text"] for n in tree["nodes"]]  # tenant-a's branch: there, without text
    labels = browser.execute_script("return cacheView.tree.namespaces.map((ns) => ns.label)")
    assert "shared" in labels and not any("tenant" in x for x in labels)
    assert "w300" not in browser.page_source
    assert console_errors(browser) == []


def test_a_10000_node_tree_draws_fast(browser: Any, server: Server) -> None:
    open_page(browser, server)
    by_id(browser, "tab-cache").click()
    browser.execute_script("document.querySelector('#live').checked = false; clearTimeout(cacheView.timer);")
    wait(browser, lambda d: d.execute_script("return !cacheView.loading"), "the last poll")
    # A random recursive tree (each node below a random earlier one), shaped like /debug/radix's.
    script = """
      let seed = 1;
      const random = () => (seed = (seed * 16807) % 2147483647) / 2147483647;
      const nodes = [];
      for (let i = 0; i < 10000; i++) {
        const parent = i < 20 ? -1 : Math.floor(random() * i);
        nodes.push({id: i + 1, parent: parent < 0 ? 0 : parent + 1, length: 1 + Math.floor(random() * 60),
                    text: `w${i} w${i + 1}`, locks: i % 97 === 0 ? 1 : 0, age: Math.floor(random() * 500)});
      }
      for (const n of nodes) { n.subtree_tokens = n.length; n.subtree_nodes = 1; }
      for (let i = nodes.length - 1; i >= 20; i--) {
        const p = nodes[nodes[i].parent - 1];
        p.subtree_tokens += nodes[i].subtree_tokens; p.subtree_nodes += nodes[i].subtree_nodes;
      }
      const tokens = nodes.slice(0, 20).reduce((s, n) => s + n.subtree_tokens, 0);
      const tree = {namespaces: [{root: 0, label: "shared", tokens_shown: true, tokens, nodes: 10000}],
                    nodes, total_nodes: 10000, eviction_path: [1]};
      const ms = cacheView.show(tree);
      cacheView.selected = 1; cacheView.zoom(1);
      return ms;"""
    draw_ms = browser.execute_script(script)
    print(f"\n10,000-node tree: linked and drawn in {draw_ms:.0f} ms")
    assert draw_ms < DRAW_BOUND_MS
    assert by_id(browser, "tree-summary").text.startswith("10000 nodes in the cache, 10000 sent")
    assert browser.execute_script("return cacheView.rects.length") > 1  # zoomed into node 1's subtree
    assert console_errors(browser) == []


def test_a_thinking_models_reasoning_shows_above_its_answer(browser: Any, tmp_path: Path) -> None:
    ask = "w10 w11 w12 w13"
    build_thinking_model(tmp_path / "thinking", [{"role": "user", "content": ask}], 3, 8)
    srv = start_server(tmp_path, "--model", str(tmp_path / "thinking"))
    try:
        open_page(browser, srv)
        answer, meta = send(browser, ask)
        assert "8 generated" in meta, meta
        message = greedy_chat(srv, [{"role": "user", "content": ask}])["choices"][0]["message"]
        assert answer == message["content"] and message["reasoning_content"]
        thought = browser.find_elements("css selector", ".message.assistant .thought")[-1]
        assert thought.get_attribute("open") is None  # folded once the answer came
        thought.find_element("css selector", "summary").click()
        assert thought.find_element("css selector", "div").text == message["reasoning_content"]
        assert len(message["reasoning_content"].split()) == 3
        assert console_errors(browser) == []
    finally:
        assert stop_server(srv) == 0, srv.log.read_text()[-3000:]
