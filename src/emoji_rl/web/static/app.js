// The play-web page. Everything a person or a model typed reaches the page through textContent,
// never as markup, so it is always shown as text.
"use strict";

const $ = (id) => document.getElementById(id);
let config = null;
let round = null; // {round_id, turn, max_turns} of the guess round on screen
let sendRound = null;
let alphabet = null;

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

async function api(path, body) {
  const options = body === undefined ? {} : {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  };
  const response = await fetch(path, options);
  let data;
  try { data = await response.json(); } catch { data = { error: `the server answered ${response.status}` }; }
  if (!response.ok) throw new Error(data.error || `the server answered ${response.status}`);
  return data;
}

// Poll a model job until it is done, showing its place in the queue; the page never blocks on it.
async function waitFor(job, progressId) {
  const progress = $(progressId), text = $(progressId + "-text");
  progress.hidden = false;
  const initial = text.textContent;
  try {
    for (;;) {
      const status = await api(`/api/job?id=${encodeURIComponent(job)}`);
      if (status.state === "done") return status.result;
      if (status.state === "error") throw new Error(status.error);
      text.textContent = status.ahead > 0 ? `${initial} (${status.ahead} ahead of you)` : initial;
      await new Promise((r) => setTimeout(r, 400));
    }
  } finally {
    text.textContent = initial;
    progress.hidden = true;
  }
}

// Run an action with its button disabled until the action's requests are answered: a second click
// meanwhile (a double click, an impatient one) sends nothing, since a disabled button fires no click.
// `keep` leaves it disabled after success (a form that was answered).
async function busy(id, action, keep = false) {
  const button = $(id);
  if (button.disabled) return;
  button.disabled = true;
  showError("");
  let ok = false;
  try {
    await action();
    ok = true;
  } catch (err) {
    showError(err.message);
  } finally {
    button.disabled = keep && ok;
  }
}

function player() {
  const name = $("player").value.trim();
  localStorage.setItem("player", name);
  return name;
}

function addTurn(emoji) {
  const li = document.createElement("li");
  li.textContent = emoji;
  $("guess-turns").appendChild(li);
}

function showTurn(result) {
  round = { round_id: result.round_id, turn: result.turn, max_turns: result.max_turns };
  addTurn(result.emoji);
  $("guess-turn").textContent = result.turn;
  $("guess-max").textContent = result.max_turns;
  $("guess-text").value = "";
  $("guess-form").hidden = false;
  $("guess-submit").disabled = false;
  $("guess-text").focus();
}

const newGuessRound = () => busy("guess-new", async () => {
  $("guess-turns").replaceChildren();
  $("guess-form").hidden = true;
  $("guess-result").hidden = true;
  const { job } = await api("/api/guess/start", { player: player() });
  showTurn(await waitFor(job, "guess-progress"));
});

function submitGuess(event) {
  event.preventDefault();
  const text = $("guess-text").value;
  if (!text.trim()) return showError("Your guess is empty: type something first.");
  if (text.length > config.max_text_chars) {
    return showError(`Your guess is too long: at most ${config.max_text_chars} characters.`);
  }
  return busy("guess-submit", async () => {
    const r = await api("/api/guess/answer", { round_id: round.round_id, turn: round.turn, text });
    const guess = document.createElement("span");
    guess.className = "guess";
    guess.textContent = `you: ${r.guess} (${r.similarity.toFixed(2)})`;
    $("guess-turns").lastElementChild.appendChild(guess);
    $("guess-form").hidden = true;
    $("guess-target").textContent = r.target;
    $("guess-score").textContent = r.similarity.toFixed(2);
    $("guess-judge").textContent = r.judge_guess;
    $("guess-judge-score").textContent = r.judge_similarity.toFixed(2);
    $("guess-next").hidden = !r.can_continue;
    $("guess-result").hidden = false;
  }, true);
}

const nextTurn = () => busy("guess-next", async () => {
  const { job } = await api("/api/guess/next", { round_id: round.round_id, turn: round.turn });
  $("guess-result").hidden = true;
  showTurn(await waitFor(job, "guess-progress"));
});

function renderPicker() {
  const query = $("send-search").value.trim().toLowerCase();
  const matches = alphabet.filter(([, name]) => !query || name.includes(query)).slice(0, 120);
  $("picker").replaceChildren(...matches.map(([emoji, name]) => {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = emoji;
    b.title = name;
    b.addEventListener("click", () => {
      const current = $("send-emoji").value.trim();
      $("send-emoji").value = current ? `${current} ${emoji}` : emoji;
    });
    return b;
  }));
}

const newSendRound = () => busy("send-new", async () => {
  $("send-result").hidden = true;
  if (!alphabet) alphabet = await api("/api/alphabet");
  sendRound = await api("/api/send/start", { player: player() });
  $("send-target").textContent = sendRound.target;
  $("send-target-line").hidden = false;
  $("send-emoji").value = "";
  $("send-form").hidden = false;
  $("send-submit").disabled = false;
  renderPicker();
});

function submitSend(event) {
  event.preventDefault();
  return busy("send-submit", async () => {
    const { job } = await api("/api/send/answer", { round_id: sendRound.round_id, emoji: $("send-emoji").value });
    const r = await waitFor(job, "send-progress");
    $("send-sent").textContent = r.emoji;
    $("send-judge").textContent = r.judge_guess;
    $("send-score").textContent = r.similarity.toFixed(2);
    $("send-result").hidden = false;
    $("send-form").hidden = true;
  }, true);
}

async function showBoard() {
  try {
    const rows = await api("/api/leaderboard");
    $("board-rows").replaceChildren(...rows.map((row) => {
      const tr = document.createElement("tr");
      for (const value of [row.name, row.kind, row.score.toFixed(3), row.rounds]) {
        const td = document.createElement("td");
        td.textContent = value;
        tr.appendChild(td);
      }
      return tr;
    }));
  } catch (err) {
    showError(err.message);
  }
}

function selectTab(name) {
  for (const tab of ["guess", "send", "board"]) {
    $(tab).hidden = tab !== name;
    $(`tab-${tab}`).setAttribute("aria-pressed", String(tab === name));
  }
  showError("");
  if (name === "board") showBoard();
}

window.addEventListener("DOMContentLoaded", async () => {
  $("player").value = localStorage.getItem("player") || "";
  config = await api("/api/config");
  $("guess-text").maxLength = config.max_text_chars;
  $("guess-new").addEventListener("click", newGuessRound);
  $("guess-form").addEventListener("submit", submitGuess);
  $("guess-next").addEventListener("click", nextTurn);
  $("send-new").addEventListener("click", newSendRound);
  $("send-form").addEventListener("submit", submitSend);
  $("send-search").addEventListener("input", renderPicker);
  $("send-back").addEventListener("click", () => {
    const parts = $("send-emoji").value.trim().split(" ");
    parts.pop();
    $("send-emoji").value = parts.join(" ");
  });
  for (const tab of ["guess", "send", "board"]) $(`tab-${tab}`).addEventListener("click", () => selectTab(tab));
  document.body.dataset.ready = "true"; // the buttons work from here on (browser tests wait for it)
});
