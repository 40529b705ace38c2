"""The web page at /: paste text, see its linked mentions highlighted with title and score;
ask a question, see the ranked answers. Plain HTML and fetch(), no external assets (it must
work on a cluster without internet). ?text=...&question=... fill the boxes and run at once."""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Entities as Experts</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body { font: 15px/1.5 system-ui, sans-serif; margin: 2em auto; max-width: 60em; padding: 0 1em; color: #222; }
 textarea, input[type=text] { width: 100%; box-sizing: border-box; font: inherit; padding: .4em; }
 textarea { height: 7em; }
 button { font: inherit; padding: .3em 1.2em; margin: .4em 0; }
 #linked { line-height: 2.6; padding: .6em; border: 1px solid #ddd; min-height: 2em; white-space: pre-wrap; }
 mark { background: #e3ecff; border-radius: 4px; padding: .1em .25em; }
 mark .ent { font-size: 70%; font-weight: 600; color: #1a47a8; margin-left: .35em; }
 mark .score { font-size: 65%; color: #666; margin-left: .25em; }
 .error { color: #b00020; }
 ol { padding-left: 1.5em; }
 small { color: #666; }
</style></head><body>
<h1>Entities as Experts</h1>
<p><small id="info">loading model description...</small></p>
<h2>Link entities</h2>
<textarea id="text" placeholder="Paste text here"></textarea>
<button id="link">Link</button>
<div id="linked"></div>
<h2>Ask a question</h2>
<input type="text" id="question" placeholder="Where was Ada Lovelace born?">
<button id="ask">Ask</button>
<div id="answers"></div>
<script>
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const fmt = (x, digits) => (x === null || x === undefined ? "-" : x.toFixed(digits));
const label = (x) => x.title !== null && x.title !== undefined ? x.title : "entity " + x.entity_id;
async function post(path, body) {
  const r = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
  const data = await r.json();
  if (!r.ok) throw new Error(data.error || r.statusText);
  return data;
}
async function link() {
  const text = $("text").value, out = $("linked");
  out.dataset.state = "busy";
  try {
    const data = await post("v1/link", {text: text});
    let html = "", at = 0;
    for (const m of data.mentions) {
      html += esc(text.slice(at, m.start));
      html += '<mark class="mention" data-entity-id="' + m.entity_id + '" title="' + esc(label(m)) + ' (' + fmt(m.score, 3) + ')">'
        + esc(m.text) + '<span class="ent">' + esc(label(m)) + '</span><span class="score">' + fmt(m.score, 2) + '</span></mark>';
      at = m.end;
    }
    out.innerHTML = html + esc(text.slice(at)) + '<br><small>' + data.mentions.length + ' mentions</small>';
    out.dataset.state = "done";
  } catch (e) { out.innerHTML = '<span class="error">' + esc(e.message) + '</span>'; out.dataset.state = "error"; }
}
async function ask() {
  const out = $("answers");
  out.dataset.state = "busy";
  try {
    const data = await post("v1/answer", {question: $("question").value, top_k: 5});
    const entities = data.question_entities.map((m) => esc(m.text) + " &rarr; " + esc(label(m))).join("; ");
    out.innerHTML = '<ol>' + data.answers.map((a) => '<li class="answer">' + esc(label(a)) + ' <small>' + fmt(a.score, 3) + '</small></li>').join("")
      + '</ol><small>entities in the question: ' + (entities || "none") + '</small>';
    out.dataset.state = "done";
  } catch (e) { out.innerHTML = '<span class="error">' + esc(e.message) + '</span>'; out.dataset.state = "error"; }
}
$("link").onclick = link;
$("ask").onclick = ask;
// Ask until a replica answers ready: the one that answers may still be loading its model
// (at start, or a replacement after a replica died); a load error is final.
function describe() {
  fetch("readyz").then((r) => r.json()).then((d) => {
    $("info").textContent = d.ready ? d.model.model + " - " + d.model.entities + " entities, " + d.model.index.kind + " index on " + d.model.index.device : "model not ready: " + (d.error || "loading");
    if (!d.ready && d.loading !== false) setTimeout(describe, 2000);
  }).catch(() => setTimeout(describe, 2000));
}
describe();
const params = new URLSearchParams(location.search);
if (params.get("text")) { $("text").value = params.get("text"); link(); }
if (params.get("question")) { $("question").value = params.get("question"); ask(); }
</script></body></html>
"""
