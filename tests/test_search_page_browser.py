"""The search page (GET /ui) driven by headless Chromium against a served sample world, on each world kind with its
shipped reranker: the token prompt, both columns' thumbnails, the reranked order against POST /v1/search, and an
image added by url from the page.

Needs Debian's chromium and chromium-driver (.ci/run installs them) and selenium (the dev extra); skips without.
With --write-screenshots it writes docs/search_page.png (the shapes world) and docs/search_page_open.png (the open
world, the README's screenshot); without, the screenshots go to the test's temporary folder.
"""
from __future__ import annotations

import functools
import os
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from world_serving import CHECKPOINT

from edje.jobs.quickstart_worlds import WORLD_PRESETS
from edje.serving.config import DeploymentResources, ServeConfig
from edje.serving.startup import StartupConfig

os.environ.update(StartupConfig().env())

TOKEN = "browser-token"
TOP_K = 10
REPO = Path(__file__).resolve().parent.parent
# world kind -> (its served checkpoint, where its screenshot goes)
CASES = {"shapes": (CHECKPOINT, REPO / "docs" / "search_page.png"),
         "open": (str(REPO / WORLD_PRESETS["open"].checkpoint), REPO / "docs" / "search_page_open.png")}
WAIT_S = 180  # a search on 2 busy cores, first call included (the reranker warms up)


def _binaries():
    """Chromium and its driver on PATH, or skip naming what is missing."""
    pytest.importorskip("selenium", reason="selenium is not installed (pip install -e '.[dev]')")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("no chromium/chromedriver on PATH: apt-get install -y chromium chromium-driver (.ci/run does)")
    return browser, driver


@pytest.fixture(scope="module", params=sorted(CASES))
def kind(request):
    """The world kind of this round of the test."""
    return request.param


@pytest.fixture(scope="module")
def world(kind, tmp_path_factory):
    """16 test images; thumbnails come from the image folder, the table's stored urls are dead."""
    from world_serving import encode_world

    root = tmp_path_factory.mktemp(f"browser-world-{kind}")
    return encode_world(root, 47, 16, "http://127.0.0.1:9", checkpoint=CASES[kind][0], kind=kind)


@pytest.fixture(scope="module")
def image_server(world):
    """The world's images over a loopback http.server: the page adds one by url."""
    handler = functools.partial(_QuietHandler, directory=str(world.images))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="module")
def served(ray_local, kind, world, tmp_path_factory):
    from world_serving import serving

    cfg = ServeConfig(checkpoint=CASES[kind][0], token_tables=(world.table,), caption_sources=(world.annotations,),
                      ui=True, image_dir=str(world.images), live_dir=str(tmp_path_factory.mktemp("browser-live")),
                      auth_token=TOKEN, image_url_allow=("loopback",),  # the test's own image server
                      reranker=DeploymentResources(num_cpus=0.25))
    with serving(("edje", "/", cfg), token=TOKEN) as (url, http):
        yield url, http


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = _binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,800"):
        options.add_argument(arg)
    # The Debian driver matches the Debian browser: no Selenium Manager, nothing downloaded.
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    # The viewport itself 1280x800 (the window size includes no chrome in headless, but pin it for the screenshot).
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False})
    yield driver
    driver.quit()


def _wait(driver, what, fn, timeout=WAIT_S):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(lambda d: fn(d))
    except TimeoutException:
        summary = driver.execute_script("return document.querySelector('#summary').textContent")
        raise AssertionError(f"timed out waiting for {what}; summary: {summary!r}") from None


# Ids of a column's cards whose thumbnail has decoded (a blob: url, fetched with the token); null while any is not.
_LOADED = """
const cards = [...document.querySelectorAll(arguments[0] + ' > li.card')];
if (cards.some((li) => li.dataset.stale)) return null;
const ok = cards.filter((li) => { const img = li.querySelector('img'); return img && img.complete && img.naturalWidth > 0; });
return ok.length === cards.length ? cards.map((li) => li.dataset.id) : null;
"""


def _column(driver, name, n=None):
    """The ids shown in column `name` (first-stage | reranked) once every thumbnail has loaded (n of them)."""
    def ready(d):
        ids = d.execute_script(_LOADED, f"#{name}")
        return ids if ids and (n is None or len(ids) == n) else None

    return _wait(driver, f"{n or 'all'} loaded thumbnails in #{name}", ready)


def _mark_stale(driver):
    """Tag the cards shown now, so that a wait sees only the next render's."""
    driver.execute_script("document.querySelectorAll('li.card').forEach((li) => { li.dataset.stale = '1'; });")


def _search(driver, query):
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.ID, "query")
    box.clear()
    box.send_keys(query)
    _wait(driver, "the search button", lambda d: d.find_element(By.ID, "search-button").is_enabled())
    _mark_stale(driver)
    driver.find_element(By.ID, "search-button").click()


@pytest.mark.slow
def test_the_page_in_chromium(browser, kind, served, world, image_server, request, tmp_path):  # browser first: a skip starts no Ray
    from selenium.webdriver.common.by import By

    url, http = served
    d = browser
    d.get(url + "/ui")
    dialog = lambda: d.execute_script("return document.querySelector('#token-dialog').open")
    # No token: the page asks for one at once (GET /v1/info is refused); a search asks again and shows nothing.
    _wait(d, "the token prompt", lambda _: dialog())
    d.find_element(By.ID, "token-cancel").click()
    assert not dialog()
    top_k = d.find_element(By.ID, "top-k")
    top_k.clear()
    top_k.send_keys(str(TOP_K))
    caption = world.captions[5]
    _search(d, caption)
    _wait(d, "the token prompt after a search", lambda _: dialog())
    assert "asks for a bearer token" in d.find_element(By.ID, "token-reason").text
    assert d.find_elements(By.CSS_SELECTOR, "#first-stage li, #reranked li") == []

    # The token: saved in sessionStorage, and the search it interrupted runs again with it.
    d.find_element(By.ID, "token-input").send_keys(TOKEN)
    d.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()
    assert not dialog() and d.execute_script("return sessionStorage.getItem('edje.token')") == TOKEN
    _column(d, "reranked", TOP_K)
    # And a search from the button, token in hand: ten thumbnails a column, the reranked order the API's.
    _search(d, caption)
    first = _column(d, "first-stage", TOP_K)
    shown = _column(d, "reranked", TOP_K)
    body = http.post(url + "/v1/search", json={"query": caption, "top_k": TOP_K, "return_first_stage": True},
                     timeout=120).json()
    assert shown == [x["image_id"] for x in body["results"]]
    assert first == [x["image_id"] for x in body["first_stage"]]
    expected = d.find_elements(By.CSS_SELECTOR, "#reranked li.expected")
    if world.image_ids[5] in shown:  # the caption's own image is marked where shown
        assert [li.get_attribute("data-id") for li in expected] == [world.image_ids[5]]
    screenshot = CASES[kind][1]
    if not request.config.getoption("--write-screenshots"):
        screenshot = tmp_path / screenshot.name
    d.save_screenshot(str(screenshot))
    from PIL import Image

    assert Image.open(screenshot).size == (1280, 800)
    # the header stays a slim bar: the results, not the chrome, fill a 1280 x 800 screen
    assert d.execute_script("return document.querySelector('header').getBoundingClientRect().height") <= 80

    # An image by url from the test's loopback server: a copy of a corpus image, under a new id.
    source = world.image_ids[3]
    d.find_element(By.ID, "query").clear()  # the page's search from the new image is then by the image alone
    _mark_stale(d)
    d.find_element(By.ID, "add-url").send_keys(f"{image_server}/{source}.jpg")
    d.find_element(By.ID, "add-id").send_keys("copy-3")
    d.find_element(By.ID, "add-button").click()
    _wait(d, "the added image", lambda _: "Added copy-3" in d.find_element(By.ID, "add-status").text)
    # The page searches from the new image at once (an image alone: first stage only); its twin comes first.
    assert d.find_element(By.ID, "picked-id").text == "copy-3"
    assert _column(d, "first-stage")[0] == source
    # And the new image is found from the page: searching from its twin, the copy comes first.
    _mark_stale(d)
    d.find_element(By.CSS_SELECTOR, f'#first-stage li.card[data-id="{source}"]').click()
    _wait(d, "the twin picked", lambda _: d.find_element(By.ID, "picked-id").text == source)
    d.find_element(By.ID, "search-button").click()
    found = _column(d, "first-stage")
    assert found[0] == "copy-3", found
    assert d.find_element(By.CSS_SELECTOR, '#first-stage li.card[data-id="copy-3"] img').get_attribute(
        "src").startswith("blob:")
