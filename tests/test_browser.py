"""A real browser on the served journal: headless Chromium (Debian `chromium` +
`chromium-driver`, driven by selenium) opens `forge wiki serve`, follows
index → task → decision, and runs a search that returns the planted decision page."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, need
from tests.index_ledger import build

pytestmark = pytest.mark.slow

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--no-first-run", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]


@pytest.fixture
def server(workspace, tmp_path):
    planted = build(workspace)
    env = {**os.environ, "FORGE_HOME": str(workspace.home)}
    errlog = (tmp_path / "serve.err").open("w")  # a file, not a pipe nobody drains
    p = subprocess.Popen([sys.executable, "-m", "infer_forge.cli", "wiki", "serve",
                          "--port", "0"], stdout=subprocess.PIPE, stderr=errlog,
                         text=True, env=env, cwd=str(REPO))
    try:
        url = None
        for line in p.stdout:  # the server prints its address once it listens
            if line.startswith("serving "):
                url = line.split()[1].rsplit("/", 1)[0]
                break
        assert url, (tmp_path / "serve.err").read_text()
        yield url, planted
    finally:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        errlog.close()


def test_browse_index_task_decision_and_search(server, tmp_path):
    chromium, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    need(chromium is not None and driver_bin is not None,
         "headless Chromium and chromedriver (apt-get install chromium chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as EC
        from selenium.webdriver.support.ui import WebDriverWait
    except ImportError:
        need(False, "selenium (pip install selenium; in the dev extra)")
    url, planted = server
    dec_id = planted["decisions"]["deepgemm-moe-h20"]
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for f in [*FLAGS, f"--user-data-dir={tmp_path / 'chrome'}"]:
        opts.add_argument(f)
    drv = webdriver.Chrome(options=opts, service=webdriver.ChromeService(driver_bin))
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
