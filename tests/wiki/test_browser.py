"""A real browser on the served journal: headless Chromium (Debian `chromium` +
`chromium-driver`, driven by selenium) opens `forge wiki serve`, follows
index → task → decision, and runs a search that returns the planted decision page.
Then a journal whose every user-text field carries script and foreign links (planted through
the CLI, tests/helpers/hostile.py): no page runs any of it or links off the site."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, need
from tests.helpers.hostile import build_hostile
from tests.helpers.index_ledger import build

pytestmark = pytest.mark.slow

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--no-first-run", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]


def _serve(home, tmp_path, *flags: str):
    env = {**os.environ, "FORGE_HOME": str(home)}
    errlog = (tmp_path / "serve.err").open("w")  # a file, not a pipe nobody drains
    p = subprocess.Popen([sys.executable, "-m", "infer_forge.cli", "wiki", "serve",
                          "--port", "0", *flags], stdout=subprocess.PIPE, stderr=errlog,
                         text=True, env=env, cwd=str(REPO))
    return p, errlog


def _stop(p, errlog) -> None:
    p.terminate()
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    errlog.close()


def _url(p, tmp_path) -> str:
    for line in p.stdout:  # the server prints its address once it listens
        if line.startswith("serving "):
            return line.split()[1].rsplit("/", 1)[0]
    raise AssertionError((tmp_path / "serve.err").read_text())


def _browser(tmp_path):
    chromium, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    need(chromium is not None and driver_bin is not None,
         "headless Chromium and chromedriver (apt-get install chromium chromium-driver)")
    try:
        from selenium import webdriver
    except ImportError:
        need(False, "selenium (pip install selenium; in the dev extra)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for f in [*FLAGS, f"--user-data-dir={tmp_path / 'chrome'}"]:
        opts.add_argument(f)
    return webdriver.Chrome(options=opts, service=webdriver.ChromeService(driver_bin))


@pytest.fixture
def server(workspace, tmp_path):
    planted = build(workspace)
    p, errlog = _serve(workspace.home, tmp_path)
    try:
        yield _url(p, tmp_path), planted
    finally:
        _stop(p, errlog)


def test_browse_index_task_decision_and_search(server, tmp_path):
    url, planted = server
    dec_id = planted["decisions"]["deepgemm-moe-h20"]
    drv = _browser(tmp_path)
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        wait = WebDriverWait(drv, 30)
        drv.get(url + "/")
        assert drv.find_element(By.TAG_NAME, "h1").text == "infer-forge journal"
        drv.find_element(By.XPATH, "//a[@href='tasks/deepgemm-moe-h20.html']").click()
        wait.until(EC.url_contains("/tasks/deepgemm-moe-h20.html"))
        assert drv.find_element(By.TAG_NAME, "h1").text == "deepgemm-moe-h20"
        assert "token_match" in drv.find_element(By.TAG_NAME, "body").text
        drv.find_element(By.XPATH, f"//a[contains(@href, 'rejected-{dec_id}')]").click()
        wait.until(EC.url_contains(f"rejected-{dec_id}"))
        body = drv.find_element(By.TAG_NAME, "body").text
        assert drv.find_element(By.TAG_NAME, "h1").text.startswith("Rejected:")
        assert "token match 0.61 < 0.99" in body and "VerificationRecorded" in body
        # Search from the page's own box: semantic (/api/search) merged with text results.
        box = drv.find_element(By.NAME, "q")
        box.send_keys("why was the mixture-of-experts kernel path refused on H20")
        box.submit()
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#status[data-done]")))
        links = [a.get_attribute("href") for a in
                 drv.find_elements(By.CSS_SELECTOR, "#results a")]
        assert any(f"decisions/deepgemm-moe-h20-rejected-{dec_id}.html" in h for h in links)
        kinds = drv.find_element(By.ID, "results").text
        assert "semantic" in kinds and "text" in kinds
    finally:
        drv.quit()


# What each page reports: did planted script run, which elements carry event handlers,
# how many scripts, where links and forms lead.
PAGE_STATE = """return {pwned: typeof window.__pwned !== 'undefined',
  handlers: [...document.querySelectorAll('*')].flatMap(e => [...e.attributes]
     .filter(a => a.name.toLowerCase().startsWith('on')).map(a => e.tagName + ' ' + a.name)),
  scripts: document.scripts.length,
  hrefs: [...document.querySelectorAll('[href]')].map(e => e.href || e.getAttribute('href')),
  actions: [...document.querySelectorAll('form')].map(f => f.action),
  text: document.body ? document.body.innerText : ''};"""


def test_planted_script_runs_nowhere_and_links_stay_on_the_site(workspace, tmp_path):
    build_hostile(workspace.home, tmp_path / "specs")
    site = workspace.home / "site"
    pages = sorted(f.relative_to(site).as_posix() for f in site.rglob("*.html"))
    assert len(pages) > 15
    p, errlog = _serve(workspace.home, tmp_path, "--no-build", "--no-embeddings")
    try:
        url = _url(p, tmp_path)
        drv = _browser(tmp_path)
        try:
            from selenium.webdriver.common.by import By
            from selenium.webdriver.support import expected_conditions as EC
            from selenium.webdriver.support.ui import WebDriverWait

            seen = ""
            for rel in pages:
                drv.get(f"{url}/{rel}")
                st = drv.execute_script(PAGE_STATE)
                assert not st["pwned"], rel
                assert st["handlers"] == [], (rel, st["handlers"])
                assert st["scripts"] == (1 if rel == "search.html" else 0), rel
                for h in st["hrefs"] + st["actions"]:
                    assert h.startswith(url + "/"), (rel, h)  # same origin, no scheme trick
                seen += st["text"]
            # The planted text is on the pages, as text.
            for shown in ("fld-reason", "fld-candidate", "fld-goal", "fld-graph-title",
                          "[[javascript:window.__pwned=1;//|x]]", "<img src=x onerror="):
                assert shown in seen, shown
            # The search page renders titles and snippets that carry the payloads.
            drv.get(f"{url}/search.html?q=fld")
            WebDriverWait(drv, 30).until(
                EC.presence_of_element_located((By.CSS_SELECTOR, "#status[data-done]")))
            st = drv.execute_script(PAGE_STATE)
            assert "fld-title" in st["text"] and not st["pwned"] and st["handlers"] == []
            assert all(h.startswith(url + "/") for h in st["hrefs"]), st["hrefs"]
        finally:
            drv.quit()
    finally:
        _stop(p, errlog)
