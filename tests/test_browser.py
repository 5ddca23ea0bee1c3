"""The labeling pages in a real headless Chromium: clicks and keys end up as rows in SQLite.

Needs Debian's ``chromium`` and ``chromium-driver`` (``tests/install_browser.sh``, which the
README's test command and ``.ci/run`` call). Set ``RLHF_JAX_SCREENSHOTS=DIR`` to keep
screenshots of both pages (the README's come from here).
"""
import http.server
import os
import re
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from rlhf_jax.feedback.clips import write_clip
from rlhf_jax.feedback.config import PeopleConfig
from rlhf_jax.feedback.store import STORE_FILE, LabelStore
from rlhf_jax.feedback.webapp import create_app, listen

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                 reason="needs chromium and chromedriver: run tests/install_browser.sh")]
FRAMES, FPS = 20, 10.0
INSTRUCTION = "Prefer the clip where the white square stays nearer the middle."


def moving_square(offset: int) -> np.ndarray:
    """A clip's frames: a white square sliding right (a real video, so the page must play it)."""
    frames = np.zeros((FRAMES, 96, 128, 3), np.uint8)
    frames[...] = (30, 40, 70)
    for t in range(FRAMES):
        x = (offset + 4 * t) % 112
        frames[t, 40:56, x:x + 16] = 255
    return frames


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # Headless and offline: no sandbox as root, no GPU, no calls home (refused on closed networks).
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--autoplay-policy=no-user-gesture-required", "--window-size=1280,900",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture
def site(tmp_path):
    """A run with four comparisons and one 20-frame episode, served on a free local port.
    Yields its address, the run directory, and (method, path, Origin) of every request the
    server has had."""
    import uvicorn

    store = LabelStore(tmp_path / STORE_FILE)
    (tmp_path / "clips").mkdir()
    for query in range(4):
        for side in range(2):
            write_clip(moving_square(37 * query + 50 * side), tmp_path / "clips" / f"q{query}_{side}.mp4", FPS)
        store.add_query(query, "compare", [f"q{query}_0.mp4", f"q{query}_1.mp4"], f"q{query}.npz", FRAMES, FPS)
    write_clip(moving_square(0), tmp_path / "clips" / "q4_0.mp4", FPS)
    store.add_query(4, "annotate", ["q4_0.mp4"], "q4.npz", FRAMES, FPS)

    listener = listen("127.0.0.1", 0)
    port = listener.getsockname()[1]
    app = create_app(tmp_path, PeopleConfig(instruction=INSTRUCTION), port=port)
    requests = []

    async def recorded(scope, receive, send):
        if scope["type"] == "http":
            requests.append((scope["method"], scope["path"], dict(scope["headers"]).get(b"origin", b"").decode()))
        await app(scope, receive, send)

    server = uvicorn.Server(uvicorn.Config(recorded, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started, "the label server")
    yield f"http://127.0.0.1:{port}", tmp_path, requests
    server.should_exit = True
    thread.join(10)
    listener.close()


def rows(run_dir: Path, sql: str):
    with sqlite3.connect(run_dir / STORE_FILE) as db:
        return db.execute(sql).fetchall()


def wait_for(condition, what: str, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def screenshot(driver, name: str) -> None:
    folder = os.environ.get("RLHF_JAX_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / name))


def playing(driver, video_id: str) -> bool:
    """The clip decoded and is playing: the browser can play our H.264 files."""
    return driver.execute_script(
        f"const v = document.getElementById('{video_id}');"
        "return v.readyState >= 2 && !v.error && v.currentTime > 0 && Math.abs(v.duration - arguments[0]) < 0.15;",
        FRAMES / FPS)


@pytest.mark.slow
def test_the_compare_page_answers_with_a_click_and_with_each_key(browser, site):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    url, run_dir, _ = site
    browser.get(f"{url}/compare")
    assert INSTRUCTION in browser.find_element(By.ID, "instruction").text
    answers = lambda: rows(run_dir, "SELECT query_id, choice FROM answers ORDER BY query_id")
    shown = lambda: browser.execute_script("return document.getElementById('left').getAttribute('src')")

    wait_for(lambda: playing(browser, "left") and playing(browser, "right"), "both clips to play")
    wait_for(lambda: "0 answered · 4 waiting for you" in browser.find_element(By.ID, "counter").text, "the counter")
    screenshot(browser, "compare.png")
    browser.find_element(By.CSS_SELECTOR, "[data-choice=left]").click()
    wait_for(lambda: answers() == [(0, "left")], "the click's answer")
    body = browser.find_element(By.TAG_NAME, "body")
    for query, (key, choice) in enumerate([(Keys.ARROW_RIGHT, "right"), (Keys.ARROW_UP, "tie"),
                                           (Keys.ARROW_DOWN, "cant_tell")], start=1):
        wait_for(lambda: shown() == f"/clips/q{query}_0.mp4", f"query {query} on screen")
        body.send_keys(key)
        wait_for(lambda: len(answers()) == query + 1, f"the answer to query {query}")
    assert answers() == [(0, "left"), (1, "right"), (2, "tie"), (3, "cant_tell")]
    (seconds,), = rows(run_dir, "SELECT MIN(seconds) FROM answers")
    assert seconds > 0  # how long each answer took is kept
    wait_for(lambda: browser.find_element(By.ID, "empty").is_displayed(), "the 'no clips waiting' state")
    assert "refreshes itself" in browser.find_element(By.ID, "empty").text

    # A query asked while the page sits empty appears without a reload.
    write_clip(moving_square(3), run_dir / "clips" / "q5_0.mp4", FPS)
    write_clip(moving_square(9), run_dir / "clips" / "q5_1.mp4", FPS)
    LabelStore(run_dir / STORE_FILE).add_query(5, "compare", ["q5_0.mp4", "q5_1.mp4"], "q5.npz", FRAMES, FPS)
    wait_for(lambda: shown() == "/clips/q5_0.mp4", "the new query to appear")


def test_the_annotate_page_marks_moments_removes_one_and_submits(browser, site):
    from selenium.webdriver.common.by import By

    url, run_dir, _ = site
    browser.get(f"{url}/annotate")
    # It plays by itself (it used not to), and can be stopped at any frame.
    wait_for(lambda: browser.execute_script("const v = document.getElementById('episode');"
                                            "return v.played.length > 0 && v.played.end(0) > 0"),
             "the episode to play by itself")
    frame = lambda: int(browser.find_element(By.ID, "frame").text)
    press = lambda key: browser.find_element(By.TAG_NAME, "body").send_keys(key)
    drag_to = lambda frame: browser.execute_script(
        "const s = document.getElementById('scrub'); s.value = arguments[0]; s.dispatchEvent(new Event('input'));",
        frame)
    from selenium.webdriver.common.keys import Keys

    drag_to(0)  # pauses it at the first frame
    wait_for(lambda: frame() == 0 and browser.execute_script("return document.getElementById('episode').paused"),
             "frame 0, paused")
    for _ in range(3):
        press(Keys.ARROW_RIGHT)  # one frame on
    wait_for(lambda: frame() == 3, "frame 3")
    press("p")  # progress at frame 3
    drag_to(12)  # drag the timeline to frame 12
    wait_for(lambda: frame() == 12, "frame 12")
    press("r")  # regress at frame 12
    press(Keys.ARROW_LEFT)
    wait_for(lambda: frame() == 11, "frame 11")
    browser.find_element(By.ID, "progress").click()  # a mark by button, removed below
    ticks = lambda: [(int(t.get_attribute("data-frame")), t.get_attribute("class"))
                     for t in browser.find_elements(By.CSS_SELECTOR, "#ticks .tick")]
    assert ticks() == [(3, "tick progress"), (11, "tick progress"), (12, "tick regress")]
    screenshot(browser, "annotate.png")
    browser.find_element(By.CSS_SELECTOR, "#ticks .tick[data-frame='11']").click()  # removed from the timeline
    assert ticks() == [(3, "tick progress"), (12, "tick regress")]
    assert rows(run_dir, "SELECT * FROM answers") == []  # nothing is sent before submitting
    press(Keys.ENTER)
    wait_for(lambda: rows(run_dir, "SELECT * FROM answers"), "the episode's answer")
    assert rows(run_dir, "SELECT query_id, step, sign FROM marks ORDER BY step") == [(4, 3, 1), (4, 12, -1)]
    assert rows(run_dir, "SELECT query_id, choice FROM answers") == [(4, "marked")]
    wait_for(lambda: browser.find_element(By.ID, "empty").is_displayed(), "the 'no episodes waiting' state")


@pytest.mark.slow
def test_the_counter_tells_what_waits_for_you_from_what_someone_else_holds(browser, site):
    from selenium.webdriver.common.by import By

    url, run_dir, requests = site
    LabelStore(run_dir / STORE_FILE).next_query("compare", "bob")  # bob's page shows query 0
    browser.get(f"{url}/compare")
    counter = lambda: browser.find_element(By.ID, "counter").text
    wait_for(lambda: "held" in counter(), "the counter")
    shown = re.fullmatch(r"0 answered · 3 waiting for you · 1 held by someone else: bob \(expires in (\d+) s\)",
                         counter())
    assert shown and 0 < int(shown.group(1)) <= 20, counter()  # people.heartbeat_timeout_s, unless bob's page renews
    # This page renews its own hold (every 5 s by default), and the server accepts the renewal.
    wait_for(lambda: rows(run_dir, "SELECT seen_at > assigned_at FROM queries WHERE id = 1") == [(1,)],
             "the page to renew its hold", timeout=12)
    assert ("POST", "/api/queries/1/hold", url) in requests


# A page of another site (here: another local port) that tries, on its own, every way a page
# can send a request to the label server without asking it first, and a preflighted one.
OTHER_SITE = """<!doctype html>
<title>another site</title>
<iframe name="sink"></iframe>
<form id="form" method="POST" enctype="text/plain" target="sink" action="TARGET/api/queries/0/answer">
  <input name='{"choice": "left", "who": "mallory", "x": "' value='"}'>
</form>
<p id="done"></p>
<script>
const target = "TARGET", body = JSON.stringify({choice: "left", who: "mallory"});
document.getElementById("form").submit();
Promise.allSettled([
  fetch(`${target}/api/queries/0/answer`, {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body}),
  fetch(`${target}/api/queries/1/answer`, {method: "POST", headers: {"Content-Type": "application/json"}, body}),
  fetch(`${target}/compare`).then((response) => response.text()),  // the page, for its secret
]).then((results) => { document.getElementById("done").textContent = results.map((r) => r.status).join(" "); });
</script>
"""


@pytest.fixture
def other_site(site):
    """``OTHER_SITE`` served from another loopback port; yields its address."""
    page = OTHER_SITE.replace("TARGET", site[0]).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(10)


def test_a_page_of_another_origin_cannot_answer_and_the_real_page_still_can(browser, site, other_site):
    from selenium.webdriver.common.by import By

    url, run_dir, requests = site
    browser.get(f"{other_site}/")
    wait_for(lambda: browser.find_element(By.ID, "done").text, "the other site's requests")
    # The browser did send them (so it is the server that refuses): the form and the no-cors
    # fetch as they were, the JSON one as a preflight that is refused in its turn.
    sent = lambda: sorted((method, path) for method, path, origin in requests if origin == other_site)
    wait_for(lambda: len(sent()) >= 4, "the other site's requests to arrive")
    assert sent() == [("GET", "/compare"), ("OPTIONS", "/api/queries/1/answer"),
                      ("POST", "/api/queries/0/answer"), ("POST", "/api/queries/0/answer")]
    assert browser.find_element(By.ID, "done").text == "fulfilled rejected rejected"  # nothing readable came back
    assert rows(run_dir, "SELECT * FROM answers") == []

    browser.get(f"{url}/compare")
    wait_for(lambda: browser.execute_script("return document.getElementById('left').getAttribute('src')")
             == "/clips/q0_0.mp4", "query 0 on the real page")
    browser.find_element(By.CSS_SELECTOR, "[data-choice=left]").click()
    wait_for(lambda: rows(run_dir, "SELECT query_id, choice FROM answers") == [(0, "left")], "the real page's answer")
