"""The static site's search in headless Chromium (bench/journal.py, item 4): the site's own
search page (the sharded index, wiki/search_index.py) against a one-file page that reads the
whole `search.json` and scans it (the site's search before the shards: the baseline, served
from the same site in the same run). Prints the bytes each fetched (raw and gzip) and the time
from navigation to the first answer, then to a second query on the same page."""

from __future__ import annotations

import gzip
import itertools
import shutil
import tempfile
import threading
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
  st.textContent = out.length + ' results';
  st.setAttribute('data-done', String(Math.round(performance.now())));
}
run(new URLSearchParams(location.search).get('q'));
</script></body></html>"""
# Chrome's network emulation: a 20 ms, 10 Mbit/s link (bytes/s), served uncompressed as
# python's http.server does (gzip sizes are printed beside).
LINK = {"offline": False, "latency": 20, "download_throughput": 1_250_000,
        "upload_throughput": 1_250_000}
LINK_SAID = "a 20 ms, 10 Mbit/s link"
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
    """Seconds from navigation start to the answer on the page (the page's own clock), bytes
    fetched (raw, gzip), status line."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    drv.get(url)
    WebDriverWait(drv, 300, poll_frequency=0.01).until(
        EC.presence_of_element_located((By.CSS_SELECTOR, "#status[data-done]")))
    secs = float(drv.find_element(By.ID, "status").get_attribute("data-done")) / 1e3
    raw = gz = 0
    for path, _ in drv.execute_script(RESOURCES):
        f = site / path.lstrip("/")
        if f.is_file() and f.suffix in (".json", ".js"):  # the flat file; the shards (scripts)
            data = f.read_bytes()
            raw, gz = raw + len(data), gz + len(gzip.compress(data, 6))
    return secs, raw, gz, drv.find_element(By.ID, "status").text


def _again(drv: Any, q: str) -> float:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    t0 = drv.execute_script("document.getElementById('status').removeAttribute('data-done');"
                            "const t0 = performance.now(); run(arguments[0]); return t0;", q)
    WebDriverWait(drv, 300, poll_frequency=0.01).until(
        EC.presence_of_element_located((By.CSS_SELECTOR, "#status[data-done]")))
    return (float(drv.find_element(By.ID, "status").get_attribute("data-done")) - t0) / 1e3


def index_sizes(site: Path) -> dict[str, int]:
    flat = (site / "search.json").read_bytes()
    shards = [f.read_bytes() for f in (site / "search").rglob("*.js")]
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
        for (name, page), link in itertools.product(
                (("one-file search.json (before)", FLAT), ("sharded (search.html)",
                                                           "/search.html")),
                ("localhost", LINK)):
            drv = _browser(tmp / f"{page.strip('/')}-{link is LINK}")  # a fresh profile
            try:
                if link is LINK:
                    drv.set_network_conditions(**LINK)
                    name = f"{name} over {LINK_SAID}"
                secs, raw, gz, status = _first_answer(drv, f"{base}{page}?q={quote(query)}",
                                                      site)
                again = _again(drv, "throughput gate H20")
                echo(f"browser search, {name}: first answer {secs * 1e3:.0f} ms after "
                     f"navigation start, {raw:,} B of index fetched ({gz:,} gzip); a second "
                     f"query on the page {again * 1e3:.0f} ms; {status!r}")
            finally:
                drv.quit()
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(tmp, ignore_errors=True)
