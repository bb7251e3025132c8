"""The static site's search in headless Chromium (bench/journal.py, item 4): the site's own
search page (the sharded index, wiki/search_index.py) against a one-file page that reads the
whole `search.json` and scans it (the site's search before the shards: the baseline, served
from the same site in the same run). Prints the bytes each fetched (raw and gzip) and the time
from navigation to the first answer, then to a second query on the same page."""

from __future__ import annotations

import gzip
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--no-first-run", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]
FLAT = "/_bench_flat_search.html"
FLAT_HTML = r"""<!doctype html><html><head><meta charset="utf-8"></head><body>
<p id="status"></p><ul id="results"></ul><script>
let entries = null;
async function run(q){
  if(!entries){ entries = await (await fetch('search.json')).json(); }
  const terms = q.toLowerCase().split(/\s+/).filter(Boolean), out = [];
  for (const e of entries){
    const hay = (e.t + ' ' + e.s).toLowerCase(); let score = 0;
    for (const t of terms){ if (hay.includes(t)) score += (e.t.toLowerCase().includes(t) ? 2 : 1); }
    if (score > 0) out.push({u:e.u, t:e.t, score:score/terms.length});
  }
  out.sort((a,b)=>b.score-a.score || a.u.localeCompare(b.u));
  const ul = document.getElementById('results');
  ul.innerHTML = out.slice(0,30).map(r=>'<li>'+r.u+'</li>').join('');
  const st = document.getElementById('status');
  st.textContent = out.length + ' results'; st.setAttribute('data-done', '1');
}
run(new URLSearchParams(location.search).get('q'));
</script></body></html>"""
RESOURCES = """return performance.getEntriesByType('resource').map(
  e => [new URL(e.name).pathname, e.encodedBodySize]);"""


class _Handler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:  # noqa: N802
        if self.path.split("?")[0] == FLAT:
            data = FLAT_HTML.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        super().do_GET()


def _browser(profile: Path) -> Any:
    from selenium import webdriver

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "chromium"
    for f in [*FLAGS, f"--user-data-dir={profile}"]:
        opts.add_argument(f)
    return webdriver.Chrome(options=opts, service=webdriver.ChromeService(
        shutil.which("chromedriver") or "chromedriver"))


def _first_answer(drv: Any, url: str, site: Path) -> tuple[float, int, int, str]:
    """Seconds from navigation to the answer, bytes fetched (raw, gzip), status line."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    t = time.perf_counter()
    drv.get(url)
    WebDriverWait(drv, 120, poll_frequency=0.01).until(
        EC.presence_of_element_located((By.CSS_SELECTOR, "#status[data-done]")))
    secs = time.perf_counter() - t
    raw = gz = 0
    for path, _ in drv.execute_script(RESOURCES):
        f = site / path.lstrip("/")
        if f.is_file() and f.suffix == ".json":
            data = f.read_bytes()
            raw, gz = raw + len(data), gz + len(gzip.compress(data, 6))
    return secs, raw, gz, drv.find_element(By.ID, "status").text


def _again(drv: Any, q: str) -> float:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    t = time.perf_counter()
    drv.execute_script("document.getElementById('status').removeAttribute('data-done');"
                       "run(arguments[0]);", q)
    WebDriverWait(drv, 120, poll_frequency=0.01).until(
        EC.presence_of_element_located((By.CSS_SELECTOR, "#status[data-done]")))
    return time.perf_counter() - t


def index_sizes(site: Path) -> dict[str, int]:
    flat = (site / "search.json").read_bytes()
    shards = [f.read_bytes() for f in (site / "search").rglob("*.json")]
    return {"search_json": len(flat), "search_json_gz": len(gzip.compress(flat, 6)),
            "shard_files": len(shards), "shards_total": sum(map(len, shards)),
            "largest_shard": max(map(len, shards), default=0),
            "largest_shard_gz": max((len(gzip.compress(s, 6)) for s in shards), default=0)}


def search_in_browser(site: Path, query: str, echo: Callable[[str], None] = print) -> None:
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        echo("browser search: skipped (no chromium / chromedriver)")
        return
    sizes = index_sizes(site)
    echo(f"search index: search.json {sizes['search_json']:,} B ({sizes['search_json_gz']:,} "
         f"gzip); sharded: {sizes['shard_files']} files, {sizes['shards_total']:,} B in all, "
         f"largest {sizes['largest_shard']:,} B ({sizes['largest_shard_gz']:,} gzip)")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Handler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-chrome-"))
    from urllib.parse import quote

    try:
        for name, page in (("one-file search.json (before)", FLAT),
                           ("sharded (search.html)", "/search.html")):
            drv = _browser(tmp / name.split()[0])  # a fresh profile: nothing cached
            try:
                secs, raw, gz, status = _first_answer(drv, f"{base}{page}?q={quote(query)}",
                                                      site)
                again = _again(drv, "throughput gate H20")
                echo(f"browser search, {name}: first answer {secs * 1e3:.0f} ms after "
                     f"navigation, {raw:,} B of index fetched ({gz:,} gzip); a second query "
                     f"on the page {again * 1e3:.0f} ms; {status!r}")
            finally:
                drv.quit()
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(tmp, ignore_errors=True)
