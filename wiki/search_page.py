# ruff: noqa: E501  (an HTML/JS page kept verbatim)
"""The search page of the static site (text search over search.json, merged with
`/api/search` semantic results when served by `forge wiki serve`)."""

SEARCH_HTML = r"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Search · infer-forge journal</title>
<style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:1em auto;padding:0 1em}
nav a{margin-right:1em}.kind{color:#888;font-size:12px;margin-left:.5em}
.snip{color:#555;font-size:13px}li{margin:.4em 0}</style></head><body>
<nav><a href="index.html">Home</a><a href="log.html">Log</a></nav>
<h1>Search</h1>
<form id="f"><input id="q" name="q" size="50" placeholder="e.g. DeepGEMM H20 token match">
<button id="go" type="submit">Search</button></form>
<p id="status"></p><ul id="results"></ul>
<script>
// Text search over the prebuilt search.json; when served by `forge wiki serve`,
// semantic results from /api/search are merged in (marked "semantic").
let entries = null;
function esc(s){return String(s).replace(/[&<>"']/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));}
// Results link only to pages of this site: a relative page path (no scheme, no //, no ..).
const PAGE = /^(?:[a-z0-9~][a-z0-9._~-]*\/)*[a-z0-9~][a-z0-9._~-]*\.html$/;
async function loadIndex(){ if(!entries){ entries = await (await fetch('search.json')).json(); } return entries; }
function textSearch(q, es){
  const terms = q.toLowerCase().split(/\s+/).filter(Boolean);
  const out = [];
  for (const e of es){
    const hay = (e.t + ' ' + e.s).toLowerCase();
    let score = 0;
    for (const t of terms){ if (hay.includes(t)) score += (e.t.toLowerCase().includes(t) ? 2 : 1); }
    if (score > 0) out.push({u:e.u, t:e.t, k:e.k, s:e.s, score:score/terms.length, how:'text'});
  }
  out.sort((a,b)=>b.score-a.score || a.u.localeCompare(b.u));
  return out.slice(0, 30);
}
async function semantic(q){
  try { const r = await fetch('/api/search?k=10&q=' + encodeURIComponent(q));
        if (!r.ok) return []; const j = await r.json();
        return j.results.map(x=>({u:x.url, t:x.title, k:x.kind, s:x.text, score:x.score, how:'semantic'})); }
  catch(e){ return []; }
}
async function run(q){
  const st = document.getElementById('status'), ul = document.getElementById('results');
  st.textContent = 'searching…'; ul.innerHTML = '';
  const [es, sem] = await Promise.all([loadIndex(), semantic(q)]);
  const seen = new Set(), rows = [];
  for (const r of sem.concat(textSearch(q, es))){ if(PAGE.test(String(r.u)) && !seen.has(r.u)){ seen.add(r.u); rows.push(r);} }
  ul.innerHTML = rows.map(r=>'<li><a href="'+esc(r.u)+'">'+esc(r.t)+'</a><span class="kind">'+esc(r.k)+' · '+r.how+'</span><div class="snip">'+esc(String(r.s).slice(0,200))+'</div></li>').join('');
  st.textContent = rows.length + ' results for "' + q + '"';
  st.setAttribute('data-done', '1');
}
document.getElementById('f').addEventListener('submit', ev=>{ev.preventDefault(); const q=document.getElementById('q').value; history.replaceState(null,'','?q='+encodeURIComponent(q)); run(q);});
const q0 = new URLSearchParams(location.search).get('q');
if (q0){ document.getElementById('q').value = q0; run(q0); }
</script></body></html>
"""
