"""The labeling pages in a real headless Chromium: clicks and keys end up as rows in SQLite.

Needs Debian's ``chromium`` and ``chromium-driver`` (``tests/install_browser.sh``, which the
README's test command and ``.ci/run`` call). Set ``RLHF_JAX_SCREENSHOTS=DIR`` to keep
screenshots of both pages (the README's come from here).
"""
import os
import shutil
import socket
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from rlhf_jax.feedback.clips import write_clip
from rlhf_jax.feedback.config import PeopleConfig
from rlhf_jax.feedback.store import STORE_FILE, LabelStore
from rlhf_jax.feedback.webapp import create_app

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                reason="needs chromium and chromedriver: run tests/install_browser.sh")
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
    """A run with four comparisons and one 20-frame episode, served on a free local port."""
    import uvicorn

    store = LabelStore(tmp_path / STORE_FILE)
    (tmp_path / "clips").mkdir()
    for query in range(4):
        for side in range(2):
            write_clip(moving_square(37 * query + 50 * side), tmp_path / "clips" / f"q{query}_{side}.mp4", FPS)
        store.add_query(query, "compare", [f"q{query}_0.mp4", f"q{query}_1.mp4"], f"q{query}.npz", FRAMES, FPS)
    write_clip(moving_square(0), tmp_path / "clips" / "q4_0.mp4", FPS)
    store.add_query(4, "annotate", ["q4_0.mp4"], "q4.npz", FRAMES, FPS)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = create_app(tmp_path, PeopleConfig(instruction=INSTRUCTION))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", tmp_path
    server.should_exit = True
    thread.join(10)


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


def test_the_compare_page_answers_with_a_click_and_with_each_key(browser, site):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    url, run_dir = site
    browser.get(f"{url}/compare")
    assert INSTRUCTION in browser.find_element(By.ID, "instruction").text
    answers = lambda: rows(run_dir, "SELECT query_id, choice FROM answers ORDER BY query_id")
    shown = lambda: browser.execute_script("return document.getElementById('left').getAttribute('src')")

    wait_for(lambda: playing(browser, "left") and playing(browser, "right"), "both clips to play")
    wait_for(lambda: "0 answered · 4 waiting" in browser.find_element(By.ID, "counter").text, "the counter")
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

    url, run_dir = site
    browser.get(f"{url}/annotate")
    wait_for(lambda: browser.execute_script("return document.getElementById('episode').readyState >= 2"),
             "the episode to load")
    frame = lambda: int(browser.find_element(By.ID, "frame").text)
    press = lambda key: browser.find_element(By.TAG_NAME, "body").send_keys(key)
    from selenium.webdriver.common.keys import Keys

    for _ in range(3):
        press(Keys.ARROW_RIGHT)  # one frame on
    wait_for(lambda: frame() == 3, "frame 3")
    press("p")  # progress at frame 3
    browser.execute_script("const s = document.getElementById('scrub'); s.value = 12;"
                           "s.dispatchEvent(new Event('input'));")  # drag the timeline to frame 12
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
