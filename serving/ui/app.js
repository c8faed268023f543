// The EDJE search page: plain JavaScript over the app's HTTP API, no build step, nothing outside this origin.
"use strict";

// Every API path the page calls (tests/test_search_page.py checks each against the app's routes).
const ROUTES = {
  info: "v1/info",
  search: "v1/search",
  addImage: "v1/images",
  thumbnail: "v1/images/{image_id}/thumbnail",
};
// The page is served at <app>/ui/, so the API is one level up, whatever prefix the app is mounted under.
const API_ROOT = new URL("../", window.location.href);
const TOKEN_KEY = "edje.token";
const THUMB_PARALLEL = 6;
// The example in the empty query box: any catalogue's words (the page serves whatever tables it is given).
const QUERY_EXAMPLE = "describe the image, e.g. a small red apple left of a big dog";

const state = { picked: null, info: null, maxTopK: 1000, thumbs: new Map(), last: null, searching: false };
const $ = (sel) => document.querySelector(sel);

class AuthError extends Error {}

// ------------------------------------------------------------------------------------------------ HTTP
function routeUrl(name, params = {}) {
  let path = ROUTES[name];
  for (const [key, value] of Object.entries(params)) path = path.replace(`{${key}}`, encodeURIComponent(value));
  return new URL(path, API_ROOT);
}

async function api(name, { params, body } = {}) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers["Authorization"] = `Bearer ${token}`;
  const init = { method: body === undefined ? "GET" : "POST", headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(routeUrl(name, params), init);
  if (res.status === 401) {
    askToken(token ? "The server refused this token." : "This server asks for a bearer token.");
    throw new AuthError("missing or wrong bearer token");
  }
  if (!res.ok) throw new Error(await errorText(res));
  return res;
}

async function errorText(res) {
  try {
    const body = await res.json();
    const detail = body.message || (typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail));
    return `${res.status}: ${detail}`;
  } catch (_) {
    return `${res.status} ${res.statusText}`;
  }
}

// ------------------------------------------------------------------------------------------ thumbnails
// <img> cannot send an Authorization header: thumbnails are fetched with the token and shown as blob: urls.
const queue = [];
let active = 0;

function thumbnail(id) {
  if (!state.thumbs.has(id)) {
    state.thumbs.set(id, new Promise((resolve) => { queue.push({ id, resolve }); pump(); }));
  }
  return state.thumbs.get(id);
}

function pump() {
  while (active < THUMB_PARALLEL && queue.length) {
    const { id, resolve } = queue.shift();
    active += 1;
    api("thumbnail", { params: { image_id: id } })
      .then((res) => res.blob())
      .then((blob) => resolve(URL.createObjectURL(blob)))
      .catch(() => { state.thumbs.delete(id); resolve(null); })  // retried at the next render (a new token, say)
      .finally(() => { active -= 1; pump(); });
  }
}

function fillThumb(holder, id) {
  thumbnail(id).then((src) => {
    holder.classList.remove("loading");
    if (!src) { holder.classList.add("missing"); holder.textContent = "no image"; return; }
    const img = document.createElement("img");
    img.src = src;
    img.alt = id;
    img.decoding = "async";
    holder.replaceChildren(img);
  });
}

// ------------------------------------------------------------------------------------------ rendering
function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

const fmt = (x, digits = 3) => (x === undefined || x === null ? "–" : Number(x).toFixed(digits));

function card(item, rank, kind, expected) {
  const li = el("li", "card");
  li.dataset.id = item.image_id;
  li.tabIndex = 0;
  li.title = `${item.image_id}: click to search from this image`;
  if (item.image_id === expected) li.classList.add("expected");

  const holder = el("div", "thumb");
  holder.append(el("span", "rank", `#${rank}`));
  if (item.image_id === expected) holder.append(el("span", "badge", "✓ caption"));
  const frame = el("div", "frame loading");
  holder.append(frame);
  fillThumb(frame, item.image_id);
  li.append(holder, el("code", "id", item.image_id));

  const scores = el("div", "scores");
  li.append(scores);
  if (kind === "first") {
    scores.append(el("span", "score", `cos ${fmt(item.first_stage_score)}`));
  } else {
    const rel = Math.max(0, Math.min(1, item.relevance_score));
    const bar = el("span", "bar");
    const fill = el("span", "fill");
    fill.style.width = `${(rel * 100).toFixed(1)}%`;  // CSSOM, allowed by the page's style-src 'self'
    bar.append(fill);
    bar.title = `calibrated relevance ${fmt(item.relevance_score)}`;
    scores.append(bar, el("span", "rel", fmt(item.relevance_score, 2)));
    const sub = el("div", "scores sub");
    sub.append(el("span", "score", `score ${fmt(item.ranking_score, 2)}`));
    const moved = (item.first_stage_rank || rank) - rank;
    sub.append(el("span", moved > 0 ? "up" : moved < 0 ? "down" : "same",
      moved > 0 ? `▲${moved}` : moved < 0 ? `▼${-moved}` : "="));
    li.append(sub);
  }
  hookCard(li);
  return li;
}

function hookCard(li) {
  const id = li.dataset.id;
  li.addEventListener("click", () => pick(id));
  li.addEventListener("keydown", (ev) => { if (ev.key === "Enter") pick(id); });
  // The same image in the other column lights up: where did it come from, where did it go.
  li.addEventListener("mouseenter", () => highlight(id, true));
  li.addEventListener("mouseleave", () => highlight(id, false));
}

function highlight(id, on) {
  for (const node of document.querySelectorAll(".card")) {
    if (node.dataset.id === id) node.classList.toggle("twin", on);
  }
}

function render(data, request, ms) {
  const expected = data.expected_image_id || null;
  const first = data.first_stage || [...data.results].sort((a, b) => b.first_stage_score - a.first_stage_score);
  $("#first-stage").replaceChildren(...first.map((item, i) => card(item, i + 1, "first", expected)));
  const note = $("#reranked-note");
  if (data.reranked) {
    $("#reranked").replaceChildren(...data.results.map((item, i) => card(item, i + 1, "reranked", expected)));
    note.hidden = true;
  } else {
    $("#reranked").replaceChildren();
    note.textContent = "An image alone has no text to rerank against: the first-stage order is the answer. "
      + "Add a query saying how the results should differ from it.";
    note.hidden = false;
  }
  const parts = [];
  const what = request.image ? (request.query ? `image ${request.image} + “${request.query}”` : `image ${request.image}`)
    : `“${request.query}”`;
  parts.push(`${what}: ${first.length} candidates${data.reranked ? " reranked" : ""} in ${Math.round(ms)} ms`);
  if (expected) {
    const at = (list) => list.findIndex((x) => x.image_id === expected) + 1;
    const a = at(first);
    const b = data.reranked ? at(data.results) : 0;
    parts.push(`the caption's image ${expected}: ${a ? `first stage #${a}` : "not in the first stage's top k"}`
      + (data.reranked ? ` → ${b ? `reranked #${b}` : "not shown"}` : ""));
  }
  setSummary(parts.join(" · "));
}

function setSummary(text, error = false) {
  const node = $("#summary");
  node.textContent = text;
  node.classList.toggle("error", error);
}

// ------------------------------------------------------------------------------------------ actions
async function search() {
  const query = $("#query").value.trim();
  if (!query && !state.picked) { setSummary("Type a query, or click an image to search from it."); return; }
  const topK = Math.max(1, Math.min(state.maxTopK, parseInt($("#top-k").value, 10) || 12));
  const body = { top_k: topK, return_first_stage: true };
  if (query) body.query = query;
  if (state.picked) {
    body.image = state.picked;
    body.image_weight = parseFloat($("#image-weight").value);
  }
  state.last = body;
  busy(true);
  const started = performance.now();
  try {
    const res = await api("search", { body });
    render(await res.json(), body, performance.now() - started);
  } catch (e) {
    if (!(e instanceof AuthError)) setSummary(`Search failed: ${e.message}`, true);
  } finally {
    busy(false);
  }
}

function busy(on) {
  state.searching = on;
  const button = $("#search-button");
  button.disabled = on;
  button.textContent = on ? "Searching…" : "Search";
  document.body.classList.toggle("busy", on);
}

function pick(id) {
  state.picked = id;
  $("#picked").hidden = false;
  $("#weight-row").hidden = false;
  $("#picked-id").textContent = id;
  const holder = $("#picked-thumb");
  holder.replaceChildren();
  holder.className = "picked-thumb loading";
  fillThumb(holder, id);
  const query = $("#query");
  query.placeholder = "how should the results differ? e.g. it is red, or there are two";
  query.focus();
  query.select();
  setSummary(`Searching from image ${id}: type how the results should differ from it (or nothing), then Search.`);
}

function unpick() {
  state.picked = null;
  $("#picked").hidden = true;
  $("#weight-row").hidden = true;
  $("#query").placeholder = QUERY_EXAMPLE;
}

async function addImage(ev) {
  ev.preventDefault();
  const url = $("#add-url").value.trim();
  const file = $("#add-file").files[0];
  const id = $("#add-id").value.trim();
  const status = $("#add-status");
  status.classList.remove("error");
  if (!url && !file) { status.textContent = "Give an image url or choose a file."; return; }
  const body = {};
  if (id) body.id = id;
  if (file) body.image = await readDataUrl(file); else body.url = url;  // a data: url is accepted as base64
  $("#add-button").disabled = true;
  status.textContent = "Encoding…";
  try {
    const res = await api("addImage", { body });
    const added = await res.json();
    status.textContent = `Added ${added.id}; the corpus holds ${added.corpus_size} images.`;
    $("#add-form").reset();
    if (state.info) showCorpus(state.info, added.corpus_size);
    state.thumbs.delete(added.id);
    pick(added.id);
    await search();  // searchable at once: its neighbours, or the query applied to it
  } catch (e) {
    if (!(e instanceof AuthError)) { status.textContent = `Not added: ${e.message}`; status.classList.add("error"); }
  } finally {
    $("#add-button").disabled = false;
  }
}

function readDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function loadInfo() {
  try {
    const info = await (await api("info")).json();
    state.info = info;
    state.maxTopK = (info.limits && info.limits.max_top_k) || state.maxTopK;
    $("#top-k").max = String(state.maxTopK);
    showCorpus(info, info.corpus_size);
    const live = info.live_images && info.live_images.enabled;
    $("#add-form").hidden = !live;
    if (!live) $("#add-status").textContent = "Adding images is off on this server (it has no live_dir).";
    return true;
  } catch (e) {
    if (!(e instanceof AuthError)) $("#corpus").textContent = `cannot reach the API: ${e.message}`;
    return false;
  }
}

function showCorpus(info, size) {
  const rule = info.ranking && info.ranking.rule ? ` · ${info.ranking.rule}` : "";
  $("#corpus").textContent = `${info.model} · ${Number(size).toLocaleString()} images${rule}`;
  $("#corpus").title = rule.slice(3);
}

// ------------------------------------------------------------------------------------------ token
function askToken(reason) {
  const dialog = $("#token-dialog");
  $("#token-reason").textContent = reason;
  $("#token-input").value = sessionStorage.getItem(TOKEN_KEY) || "";
  if (!dialog.open) dialog.showModal();
  $("#token-input").focus();
}

async function tokenSaved(ev) {
  ev.preventDefault();
  const value = $("#token-input").value.trim();
  if (value) sessionStorage.setItem(TOKEN_KEY, value); else sessionStorage.removeItem(TOKEN_KEY);
  $("#token-dialog").close();
  state.thumbs.clear();
  if (await loadInfo() && state.last) await search();
}

// ------------------------------------------------------------------------------------------ start
function start() {
  $("#query").placeholder = QUERY_EXAMPLE;
  $("#search-form").addEventListener("submit", (ev) => { ev.preventDefault(); search(); });
  $("#query").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); search(); }  // Shift+Enter: a new line
  });
  $("#picked-clear").addEventListener("click", unpick);
  $("#image-weight").addEventListener("input", (ev) => { $("#image-weight-value").value = Number(ev.target.value).toFixed(2); });
  $("#add-form").addEventListener("submit", addImage);
  $("#token-button").addEventListener("click", () => askToken("The bearer token this server was started with."));
  $("#token-form").addEventListener("submit", tokenSaved);
  $("#token-cancel").addEventListener("click", () => $("#token-dialog").close());
  $("#token-clear").addEventListener("click", () => { $("#token-input").value = ""; });
  // ?q=... opens the page on a search (the quickstart prints such a link).
  const q = new URLSearchParams(window.location.search).get("q");
  if (q) $("#query").value = q;
  loadInfo().then((ok) => { if (ok && q) search(); });
}

document.addEventListener("DOMContentLoaded", start);
