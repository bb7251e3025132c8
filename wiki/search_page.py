# ruff: noqa: E501  (an HTML/JS page kept verbatim)
"""The search page of the static site: text search over the sharded index under `search/`
(search_index.py; each shard a script, so it works from `file://` too), merged with
`/api/search` semantic results when served by `forge wiki serve`; the site's header and
stylesheet (page.py `shell`)."""

from __future__ import annotations

from .page import shell

BODY = r"""<h1>Search</h1>
<form id="f"><input id="q" name="q" size="50" placeholder="e.g. DeepGEMM H20 token match">
<button id="go" type="submit">Search</button></form>
<p id="status"></p><ul id="results"></ul>
"""

SCRIPT = r"""<script>
// Text search over the prebuilt index; when served by `forge wiki serve`,
// semantic results from /api/search are merged in (marked "semantic").
// The text index is sharded (wiki/search_index.py): meta, then one token shard per query
// term and the doc shards of the results shown, each loaded once. Each shard is a script
// (`forgeSearch(name, data)`), not a fetched JSON file: a browser loads scripts from
// file:// pages too, where fetch() is refused, so search works on the built files as well
// as under `forge wiki serve`. A loaded script element is removed again.
let meta = null, shardNames = null;
const files = new Map(), waiting = new Map();
window.forgeSearch = (name, data)=>{ const w = waiting.get(name); if (w){ waiting.delete(name); w(data); } };
function esc(s){return String(s).replace(/[&<>"']/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));}
// Results link only to pages of this site: a relative page path (no scheme, no //, no ..).
const PAGE = /^(?:[a-z0-9~][a-z0-9._~-]*\/)*[a-z0-9~][a-z0-9._~-]*\.html$/;
function load(name){
  if (!files.has(name)) files.set(name, new Promise((resolve, reject)=>{
    const el = document.createElement('script'), src = 'search/' + name + '.js';
    waiting.set(name, resolve);
    el.onload = ()=>{ el.remove(); if (waiting.delete(name)) reject(new Error(src + ': no data')); };
    el.onerror = ()=>{ el.remove(); waiting.delete(name); reject(new Error(src + ': not found')); };
    el.src = src; document.head.appendChild(el);
  }).catch(e=>{ files.delete(name); throw e; }));  // a failed load is tried again next time
  return files.get(name);
}
// A snippet ends at a word, marked when cut.
function snip(s){ if (s.length <= 200) return s; const c = s.slice(0, 200), i = c.lastIndexOf(' '); return (i > 120 ? c.slice(0, i) : c) + '…'; }
function hex(s){ return Array.from(new TextEncoder().encode(s), b=>b.toString(16).padStart(2,'0')).join(''); }
async function textSearch(q){
  if (!meta){ meta = await load('meta'); shardNames = new Set(meta.shards); }
  const terms = [...new Set(q.toLowerCase().split(/[^\p{L}\p{N}]+/u).filter(Boolean))];
  const score = new Map();
  await Promise.all(terms.map(async t=>{
    const cps = Array.from(t), name = hex(cps.slice(0,2).join(''));
    if (!shardNames.has(name)) return;
    const shard = await load('t/'+name), best = new Map();
    for (const tok of Object.keys(shard)){
      if (cps.length < 2 ? tok !== t : !tok.startsWith(t)) continue;
      for (const c of shard[tok]){ const d = Math.floor(c/2), w = (c%2) ? 2 : 1; if ((best.get(d)||0) < w) best.set(d, w); }
    }
    for (const [d,w] of best) score.set(d, (score.get(d)||0) + w);
  }));
  const top = [...score].sort((a,b)=>b[1]-a[1] || a[0]-b[0]).slice(0, 30);
  const shards = await Promise.all([...new Set(top.map(([d])=>Math.floor(d/meta.per)))]
    .map(async n=>[n, await load('d/'+n)]));
  const docs = new Map(shards);
  return top.map(([d,s])=>{ const e = docs.get(Math.floor(d/meta.per))[d%meta.per];
    return {u:e[0], t:e[1], k:e[2], s:e[3], score:s/terms.length, how:'text'}; });
}
async function semantic(q){
  if (location.protocol === 'file:') return [];  // opened from the files: no server to ask
  try { const r = await fetch('/api/search?k=10&q=' + encodeURIComponent(q));
        if (!r.ok) return []; const j = await r.json();
        return j.results.map(x=>({u:x.url, t:x.title, k:x.kind, s:x.text, score:x.score, how:'semantic'})); }
  catch(e){ return []; }
}
async function run(q){
  const st = document.getElementById('status'), ul = document.getElementById('results');
  st.textContent = 'searching…'; ul.innerHTML = '';
  let err = null;
  const [texts, sem] = await Promise.all([textSearch(q).catch(e=>{ err = e; return []; }), semantic(q)]);
  const seen = new Set(), rows = [];
  for (const r of sem.concat(texts)){ if(PAGE.test(String(r.u)) && !seen.has(r.u)){ seen.add(r.u); rows.push(r);} }
  ul.innerHTML = rows.map(r=>'<li><a href="'+esc(r.u)+'">'+esc(r.t)+'</a><span class="kind">'+esc(r.k)+' · '+r.how+'</span><div class="snip">'+esc(snip(String(r.s)))+'</div></li>').join('');
  st.textContent = rows.length + (rows.length === 1 ? ' result' : ' results') + ' for "' + q + '"' + (err ? ' (text index unavailable: ' + err.message + ')' : '');
  st.setAttribute('data-done', String(Math.round(performance.now())));  // ms since navigation
}
document.getElementById('f').addEventListener('submit', ev=>{ev.preventDefault(); const q=document.getElementById('q').value; try { history.replaceState(null,'','?q='+encodeURIComponent(q)); } catch(e){}  /* file://: may be refused */ run(q);});
const q0 = new URLSearchParams(location.search).get('q');
if (q0){ document.getElementById('q').value = q0; run(q0); }
</script>"""


def search_html(nav: list[tuple[str, str]]) -> str:
    """The search page (at the site's root) with the site's navigation."""
    return shell("Search", BODY, nav, "", SCRIPT)
