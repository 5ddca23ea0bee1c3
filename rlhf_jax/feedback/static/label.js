// The labeling pages: ask the server for the next query, show it, send the answer.
"use strict";
const kind = document.body.dataset.kind;  // "compare" or "annotate"
// The run's secret, which the server asks of every request that changes anything: only
// its own pages hold it (another site's page cannot read them).
const secret = document.querySelector('meta[name="label-secret"]').content;
const renewSeconds = Number(document.body.dataset.renewS);  // how often to say a query is still on screen
const $ = (id) => document.getElementById(id);
const who = $("who");
who.value = localStorage.getItem("rlhf_jax_who") || "person-" + Math.random().toString(36).slice(2, 8);
who.addEventListener("change", () => localStorage.setItem("rlhf_jax_who", who.value.trim()));
localStorage.setItem("rlhf_jax_who", who.value);

let current = null;   // the query on screen
let shownAt = 0;      // when it appeared: the answer's "seconds"
let marks = new Map();  // annotate: frame -> +1 / -1

async function api(path, body) {
  // referrerPolicy: the server checks Origin, which the pages' no-referrer policy would blank
  // to "null" on a POST in browsers that follow the Fetch standard to the letter.
  const response = await fetch(path, body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json", "X-Label-Secret": secret},
    body: JSON.stringify(body), referrerPolicy: "same-origin"});
  if (!response.ok) throw new Error(`${path}: ${response.status} ${await response.text()}`);
  return response.json();
}

function showError(error) { $("error").textContent = String(error); $("error").hidden = false; }

// Why the person's last answer did not count, or why the query on screen may not: it stays up,
// past the next query, until an answer of theirs is stored ("" takes it down).
function tell(text) { $("notice").textContent = text; $("notice").hidden = text === ""; }

const name = () => who.value.trim() || "anonymous";

function showCounts(counts) {
  let text = `${counts.answered} answered · ${counts.for_you} waiting for you`;
  const held = counts.held_by_others;
  if (held.length > 0) {
    const holders = held.map((hold) => `${hold.who} (expires in ${Math.ceil(hold.expires_in_s)} s)`);
    text += ` · ${held.length} held by someone else: ${holders.join(", ")}`;
  }
  $("counter").textContent = text;
}

async function refreshCounts() {
  try {
    showCounts((await api(`/api/status?who=${encodeURIComponent(name())}`))[kind]);
  } catch (error) { showError(error); }
}

// Keep holding the query on screen; a closed page stops, and the query soon goes back to others.
async function renewHold() {
  if (current === null) return;
  try {
    const reply = await api(`/api/queries/${current.id}/hold`, {who: name()});
    if (!reply.held) {
      tell(`${kind === "compare" ? "These clips are" : "This episode is"} no longer yours: answered, or gone to ` +
           "someone else while your page was silent. If someone else answers first, your answer will not be stored.");
    }
  } catch (error) { showError(error); }
}

async function next() {
  try {
    const reply = await api("/api/next", {kind, who: name()});
    showCounts(reply);
    current = reply.query;
    $("error").hidden = true;
    $("query").hidden = current === null;
    $("empty").hidden = current !== null;
    if (current === null) { setTimeout(next, 3000); return; }
    shownAt = performance.now();
    if (kind === "compare") showPair(current); else showEpisode(current);
  } catch (error) { showError(error); setTimeout(next, 5000); }
}

async function send(path, body) {
  if (current === null) return;
  const query = current;
  current = null;  // a second key press before the next query arrives answers nothing
  try {
    const reply = await api(`/api/queries/${query.id}/${path}`,
                            {...body, who: name(), seconds: (performance.now() - shownAt) / 1000});
    const first = reply.answer.who === name() ? "you had answered it already" : `${reply.answer.who} answered it first`;
    tell(reply.stored ? "" : `Your answer was not stored: ${first}.`);
  } catch (error) { showError(error); }
  next();
}

// ---------------------------------------------------------------- compare page
function showPair(query) {
  $("left").src = query.clips[0];
  $("right").src = query.clips[1];
}

if (kind === "compare") {
  for (const button of document.querySelectorAll("[data-choice]")) {
    button.addEventListener("click", () => send("answer", {choice: button.dataset.choice}));
  }
  const keys = {ArrowLeft: "left", ArrowRight: "right", ArrowUp: "tie", ArrowDown: "cant_tell"};
  document.addEventListener("keydown", (event) => {
    if (event.target === who || !(event.key in keys)) return;
    event.preventDefault();
    send("answer", {choice: keys[event.key]});
  });
}

// --------------------------------------------------------------- annotate page
const video = $("episode");
const scrub = $("scrub");
const frameOf = () => current ? Math.min(current.frames - 1, Math.floor(video.currentTime * current.fps + 1e-3)) : 0;

function showEpisode(query) {
  marks = new Map();
  video.src = query.clips[0];
  scrub.max = query.frames - 1;
  scrub.value = 0;
  $("frames").textContent = query.frames;
  drawMarks();
}

function seek(frame) {
  if (!current) return;
  frame = Math.max(0, Math.min(current.frames - 1, frame));
  video.pause();
  video.currentTime = (frame + 0.5) / current.fps;  // the middle of the frame
  scrub.value = frame;
  $("frame").textContent = frame;
}

function mark(sign) {
  if (!current) return;
  marks.set(frameOf(), sign);
  drawMarks();
}

function drawMarks() {
  const ticks = $("ticks"), list = $("marks");
  ticks.replaceChildren();
  list.replaceChildren();
  const last = Math.max(1, (current ? current.frames : 1) - 1);
  for (const [frame, sign] of [...marks.entries()].sort((a, b) => a[0] - b[0])) {
    const name = sign > 0 ? "progress" : "regress";
    const remove = () => { marks.delete(frame); drawMarks(); };
    const tick = document.createElement("div");
    tick.className = `tick ${name}`;
    tick.style.left = `${(100 * frame) / last}%`;
    tick.title = `${name} at frame ${frame}: click to remove`;
    tick.dataset.frame = frame;
    tick.addEventListener("click", remove);
    ticks.append(tick);
    const item = document.createElement("li");
    item.className = name;
    item.textContent = `frame ${frame}: ${name}`;
    const button = document.createElement("button");
    button.textContent = "remove";
    button.addEventListener("click", remove);
    item.append(button);
    list.append(item);
  }
}

if (kind === "annotate") {
  video.addEventListener("timeupdate", () => { scrub.value = frameOf(); $("frame").textContent = frameOf(); });
  scrub.addEventListener("input", () => seek(Number(scrub.value)));
  $("play").addEventListener("click", () => (video.paused ? video.play() : video.pause()));
  $("progress").addEventListener("click", () => mark(+1));
  $("regress").addEventListener("click", () => mark(-1));
  $("submit").addEventListener("click", submitMarks);
  document.addEventListener("keydown", (event) => {
    if (event.target === who) return;
    const actions = {
      " ": () => (video.paused ? video.play() : video.pause()),
      p: () => mark(+1), P: () => mark(+1), "+": () => mark(+1),
      r: () => mark(-1), R: () => mark(-1), "-": () => mark(-1),
      ArrowLeft: () => seek(frameOf() - 1), ArrowRight: () => seek(frameOf() + 1),
      Enter: submitMarks,
    };
    if (!(event.key in actions)) return;
    event.preventDefault();
    actions[event.key]();
  });
}

function submitMarks() {
  send("marks", {marks: [...marks.entries()].map(([step, sign]) => ({step, sign}))});
}

setInterval(refreshCounts, 3000);
setInterval(renewHold, renewSeconds * 1000);
next();
