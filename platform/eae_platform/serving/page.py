"""The web page at /: paste text, see its linked mentions highlighted with title and score;
ask a question, see the ranked answers. Plain HTML and fetch(), no external assets (it must
work on a cluster without internet). ?text=...&question=... fill the boxes and run at once.
Until the model answers ready, the line under the heading says so (#info, data-state loading,
ready or error), asking /readyz every second."""

import html

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
<p><small id="info" data-state="loading">loading model...</small></p>
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
    // The API's offsets count code points (Python's); a JS string indexes UTF-16 units, which
    // differ after an emoji: slice the text's code points instead.
    const chars = Array.from(text);
    let html = "", at = 0;
    for (const m of data.mentions) {
      html += esc(chars.slice(at, m.start).join(""));
      html += '<mark class="mention" data-entity-id="' + m.entity_id + '" title="' + esc(label(m)) + ' (' + fmt(m.score, 3) + ')">'
        + esc(m.text) + '<span class="ent">' + esc(label(m)) + '</span><span class="score">' + fmt(m.score, 2) + '</span></mark>';
      at = m.end;
    }
    out.innerHTML = html + esc(chars.slice(at).join("")) + '<br><small>' + data.mentions.length + ' mentions</small>';
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
function show(state, text) {
  $("info").dataset.state = state;
  $("info").className = state === "error" ? "error" : "";
  $("info").textContent = text;
}
function describe() {
  fetch("readyz").then((r) => r.json()).then((d) => {
    if (d.ready) {
      show("ready", d.model.model + " - " + d.model.entities + " entities, " + d.model.index.kind + " index on " + d.model.index.device);
    } else if (d.loading === false) {
      show("error", "the model failed to load: " + d.error);
    } else {
      show("loading", d.loading ? "loading model... " + Math.round(d.loading_for_s) + " s" : "waiting for a model replica: " + d.error);
      setTimeout(describe, 1000);
    }
  }).catch(() => { show("loading", "waiting for the server..."); setTimeout(describe, 1000); });
}
describe();
const params = new URLSearchParams(location.search);
if (params.get("text")) { $("text").value = params.get("text"); link(); }
if (params.get("question")) { $("question").value = params.get("question"); ask(); }
</script></body></html>
"""


def entity_page(entity: dict) -> str:
    """GET /entity/{id} for a browser: the entity's title, where it comes from and its aliases."""
    title = html.escape(entity["title"] or f"entity {entity['entity_id']}")
    source = {"wikipedia": "Wikipedia", "synthetic": "a synthetic world (eae data synth)",
              "added": "added through /v1/entities"}.get(entity["source"], "unknown")
    aliases = ", ".join(html.escape(a) for a in entity["aliases"]) or "none known"
    link = f'<p><a href="{html.escape(entity["wikipedia_url"])}">Wikipedia</a></p>' if entity.get("wikipedia_url") else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title></head>'
            f'<body style="font: 15px/1.5 system-ui, sans-serif; margin: 2em auto; max-width: 60em">'
            f'<h1>{title}</h1><p>entity {entity["entity_id"]}; title from {source}</p>'
            f'<p>aliases: {aliases}</p>{link}</body></html>')
