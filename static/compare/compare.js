// The Compare page: one fetch() stream per column (NDJSON events), so a slow or failing column never holds up
// the others. Leaving the page aborts every stream; the server then cancels the upstream requests.
(function () {
  "use strict";

  const $ = (id) => document.getElementById(id);
  const readJSON = (id) => JSON.parse($(id).textContent);
  const config = readJSON("compare-config");
  const choices = readJSON("compare-choices");
  const defaults = readJSON("compare-defaults");
  const saved = readJSON("compare-saved");
  const form = $("compare-form");
  const columnsEl = $("columns");
  const errorEl = $("compare-error");
  const running = new Set(); // AbortControllers of open streams
  let conversation = config.conversation;
  let columns = []; // [{index, key, label, el}]

  function csrfToken() {
    const input = document.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  function showError(text) {
    errorEl.textContent = text;
    errorEl.hidden = !text;
  }

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  // --- column pickers ----------------------------------------------------------------------------------------
  function picker(value) {
    const select = el("select");
    select.setAttribute("aria-label", "Column");
    select.appendChild(new Option("(none)", ""));
    for (const choice of choices) {
      select.appendChild(new Option(choice.label + (choice.local ? " · local" : ""), choice.key));
    }
    select.value = value || "";
    select.addEventListener("change", () => layoutColumns(pickedKeys()));
    return select;
  }

  function pickedKeys() {
    const pickers = $("column-pickers");
    if (!pickers) return columns.map((c) => c.key);
    return Array.from(pickers.querySelectorAll("select")).map((s) => s.value).filter(Boolean);
  }

  function setupPickers() {
    const pickers = $("column-pickers");
    if (!pickers) return;
    const initial = saved ? saved.map((c) => c.key) : defaults;
    for (let i = 0; i < config.maxColumns; i++) {
      const select = picker(initial[i]);
      select.id = "column-" + i;
      if (saved) select.disabled = true;
      pickers.appendChild(select);
    }
    if (!choices.length) showError("This team has no enabled channel or route yet: add two on the Channels page.");
  }

  // --- columns -----------------------------------------------------------------------------------------------
  function labelFor(key) {
    const found = choices.find((c) => c.key === key);
    return found ? found.label : key;
  }

  function layoutColumns(keys, labels) {
    columnsEl.innerHTML = "";
    columns = keys.map((key, index) => {
      const node = el("article", "compare-column");
      node.dataset.column = index;
      const head = el("header", "column-head");
      head.appendChild(el("span", "label", labels ? labels[index] : labelFor(key)));
      const status = el("span", "pill", "idle");
      head.appendChild(status);
      const body = el("div", "column-body");
      const history = el("div", "history");
      history.style.display = "contents";
      body.appendChild(history);
      node.appendChild(head);
      node.appendChild(body);
      columnsEl.appendChild(node);
      return {index, key, label: labels ? labels[index] : labelFor(key), el: node, status, body, history};
    });
    columnsEl.style.setProperty("--columns", Math.max(columns.length, 1));
    refreshDiffChoices();
  }

  function setStatus(column, text, kind) {
    column.status.textContent = text;
    column.status.className = "pill " + (kind || "");
  }

  function fmt(value, unit, digits) {
    if (value === null || value === undefined || value === "") return "–";
    const number = typeof value === "number" ? value.toFixed(digits === undefined ? 0 : digits) : value;
    return unit ? number + " " + unit : String(number);
  }

  // A deployment's engine: its GPU's hourly price, shared out by the minute among the requests it served.
  function gpuCost(hourly) {
    return hourly ? "GPU " + hourly + "/h, by the minute" : "unknown: no GPU price";
  }

  function metricsList(metrics) {
    const dl = el("dl", "metrics");
    const rows = [
      ["TTFT", fmt(metrics.ttft_ms, "ms")], ["tokens/s", fmt(metrics.tokens_per_second, "", 1)],
      ["prompt", fmt(metrics.prompt_tokens)], ["completion", fmt(metrics.completion_tokens)],
      ["cached", fmt(metrics.cached_tokens)], ["latency", fmt(metrics.latency_ms, "ms")],
      ["cost", metrics.local_gpu ? gpuCost(metrics.gpu_hourly) : fmt(metrics.cost)],
    ];
    for (const [name, value] of rows) {
      const row = el("div");
      row.dataset.metric = name;
      row.appendChild(el("dt", "", name));
      row.appendChild(el("dd", "", value));
      dl.appendChild(row);
    }
    return dl;
  }

  function addMessage(column, message) {
    column.history.appendChild(el("div", "bubble " + message.role, message.content));
    if (message.role === "assistant" && message.metrics) {
      if (message.metrics.error) {
        column.history.appendChild(el("div", "diagnosis", message.metrics.error));
      } else if (Object.keys(message.metrics).length) {
        column.history.appendChild(metricsList(message.metrics));
      }
    }
  }

  // --- streams -----------------------------------------------------------------------------------------------
  async function post(url, data) {
    return fetch(url, {
      method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json", "X-CSRFToken": csrfToken()},
      body: JSON.stringify(data || {}),
    });
  }

  async function readEvents(response, onEvent) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let newline;
      while ((newline = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, newline).trim();
        buffer = buffer.slice(newline + 1);
        if (line) onEvent(JSON.parse(line));
      }
    }
  }

  async function errorText(response) {
    try {
      const data = await response.json();
      return data.error || response.statusText;
    } catch (e) {
      return "the server answered " + response.status;
    }
  }

  async function runStream(url, data, column, onEvent) {
    const controller = new AbortController();
    running.add(controller);
    try {
      const response = await fetch(url, {
        method: "POST", credentials: "same-origin", signal: controller.signal,
        headers: {"Content-Type": "application/json", "X-CSRFToken": csrfToken()}, body: JSON.stringify(data || {}),
      });
      if (!response.ok) throw new Error(await errorText(response));
      await readEvents(response, onEvent);
    } catch (error) {
      if (error.name !== "AbortError") {
        column.body.appendChild(el("div", "diagnosis", "This column could not stream: " + error.message));
        setStatus(column, "failed", "failed");
      }
    } finally {
      running.delete(controller);
      updateBusy();
    }
  }

  function streamReply(column, url) {
    const answer = el("div", "bubble assistant empty");
    column.history.appendChild(answer);
    setStatus(column, "waiting", "streaming");
    column.el.classList.remove("failed");
    return runStream(url, {}, column, (event) => {
      if (event.type === "delta") {
        answer.classList.remove("empty");
        answer.textContent += event.text;
        setStatus(column, "streaming", "streaming");
      } else if (event.type === "done") {
        answer.classList.remove("empty");
        if (!event.text && !event.ok) answer.remove();
        if (event.ok) {
          setStatus(column, "done", "done");
        } else {
          setStatus(column, "failed", "failed");
          column.el.classList.add("failed");
          column.history.appendChild(el("div", "diagnosis", event.diagnosis));
        }
        column.history.appendChild(metricsList(event.metrics));
      }
    });
  }

  function updateBusy() {
    const busy = running.size > 0;
    for (const id of ["send", "json-check", "cache-check"]) {
      if ($(id)) $(id).disabled = busy;
    }
  }

  function sampling() {
    return {temperature: $("temperature").value, top_p: $("top-p").value, max_tokens: $("max-tokens").value};
  }

  async function send(event) {
    event.preventDefault();
    showError("");
    const message = $("message").value;
    if (!message.trim()) {
      showError("Type a message first: an empty message is not sent.");
      return;
    }
    const keys = pickedKeys();
    const response = await post("/compare/send/", Object.assign({
      conversation: conversation, columns: keys, system_prompt: $("system-prompt").value, message: message,
    }, sampling()));
    if (!response.ok) {
      showError(await errorText(response));
      return;
    }
    const data = await response.json();
    if (!conversation) {
      conversation = data.conversation;
      history.replaceState(null, "", data.url);
      layoutColumns(keys, data.columns.map((c) => c.label));
      document.querySelectorAll("#column-pickers select").forEach((s) => { s.disabled = true; });
      $("system-prompt").readOnly = true;
      if ($("share-toggle")) $("share-toggle").hidden = false;
      listConversation(data);
    }
    $("message").value = "";
    data.columns.forEach((c) => {
      const column = columns[c.index];
      column.body.querySelectorAll(".check-result").forEach((n) => n.remove());
      column.history.appendChild(el("div", "bubble user", message));
      streamReply(column, c.stream_url);
    });
    updateBusy();
  }

  function listConversation(data) {
    // The new conversation joins the list at once (the server lists it on every later visit).
    const side = document.querySelector(".compare-side");
    let list = side.querySelector(".conversations");
    if (!list) {
      side.querySelectorAll("p").forEach((p) => p.remove());
      list = el("ul", "conversations");
      side.appendChild(list);
    }
    list.querySelectorAll("li.current").forEach((li) => li.classList.remove("current"));
    const item = el("li", "current");
    const link = el("a", "", data.title);
    link.href = data.url;
    item.appendChild(link);
    item.appendChild(el("span", "muted small", "just now"));
    list.prepend(item);
  }

  // --- checks ------------------------------------------------------------------------------------------------
  function checkBox(column, title) {
    column.body.querySelectorAll(".check-result").forEach((n) => n.remove());
    const box = el("div", "check-result");
    box.appendChild(el("strong", "", title));
    const line = el("div", "muted", "starting…");
    box.appendChild(line);
    column.body.appendChild(box);
    return {box, line};
  }

  function prepareChecks() {
    showError("");
    const keys = pickedKeys();
    if (keys.length < 1) {
      showError("Pick at least one column to check.");
      return null;
    }
    if (!conversation) layoutColumns(keys);
    return keys;
  }

  function jsonCheck() {
    const keys = prepareChecks();
    if (!keys) return;
    const message = $("message").value || (columns[0] && lastUserMessage()) || "";
    if (!message.trim()) {
      showError("Type the prompt to repeat in the message box first.");
      return;
    }
    const repeats = $("repeats").value;
    columns.forEach((column) => {
      const {box, line} = checkBox(column, "JSON check");
      setStatus(column, "checking", "streaming");
      let failed = 0;
      runStream("/compare/checks/json/", Object.assign({
        column: column.key, index: column.index, system_prompt: $("system-prompt").value, message: message,
        repeats: repeats,
      }, sampling()), column, (event) => {
        if (event.type === "attempt") {
          if (event.ok && !event.json_valid) failed += 1;
          line.textContent = event.number + " of " + repeats + " sent · " + failed + " did not parse" +
            (event.ok ? "" : " · error: " + event.diagnosis);
        } else if (event.type === "summary") {
          const failed = event.alarm || event.answered === 0;
          box.classList.add(failed ? "alarm" : "fine");
          line.textContent = "";
          box.appendChild(el("div", "rate", event.answered === 0 ? "no answer to check" :
            (event.failure_rate * 100).toFixed(1) + " % failed to parse"));
          box.appendChild(el("div", "", event.failures + " of " + event.answered + " answers are not JSON" +
            (event.errors ? "; " + event.errors + " requests failed" : "") + " · alarm line " +
            config.jsonAlarmPercent + " %" + (event.alarm ? ": above it" : "")));
          setStatus(column, event.answered === 0 ? "failed" : event.alarm ? "JSON alarm" : "JSON ok",
            failed ? "failed" : "done");
        }
      });
    });
    updateBusy();
  }

  function lastUserMessage() {
    const bubbles = columnsEl.querySelectorAll(".bubble.user");
    return bubbles.length ? bubbles[bubbles.length - 1].textContent : "";
  }

  function cacheCheck() {
    const keys = prepareChecks();
    if (!keys) return;
    columns.forEach((column) => {
      const {box, line} = checkBox(column, "Prefix-cache check");
      setStatus(column, "checking", "streaming");
      runStream("/compare/checks/prefix-cache/", {
        column: column.key, index: column.index, system_prompt: $("system-prompt").value,
      }, column, (event) => {
        if (event.type === "attempt") {
          line.textContent = "request " + event.number + ": TTFT " + fmt(event.metrics.ttft_ms, "ms");
        } else if (event.type === "summary") {
          line.textContent = "";
          if (!event.ok) {
            box.appendChild(el("div", "diagnosis", event.diagnosis));
            setStatus(column, "failed", "failed");
            return;
          }
          box.classList.add(event.dropped ? "fine" : "alarm");
          box.appendChild(el("div", "rate", fmt(event.first_ttft_ms, "ms") + " → " + fmt(event.second_ttft_ms, "ms") +
            " (" + (event.drop_percent === null ? "–" : (event.drop_percent > 0 ? "−" : "+") +
            Math.abs(event.drop_percent).toFixed(1) + " %") + ")"));
          box.appendChild(el("div", "muted", "TTFT first → second with the same system prompt" +
            (event.cached_tokens ? " · " + event.cached_tokens + " cached tokens reported" : "")));
          if (event.advice.length) {
            box.appendChild(el("div", "", "No clear drop. What to check:"));
            const list = el("ul");
            event.advice.forEach((text) => list.appendChild(el("li", "", text)));
            box.appendChild(list);
          }
          setStatus(column, event.dropped ? "cache works" : "no drop", event.dropped ? "done" : "failed");
        }
      });
    });
    updateBusy();
  }

  // --- diff and sharing --------------------------------------------------------------------------------------
  function refreshDiffChoices() {
    const card = $("diff-card");
    card.hidden = !conversation || columns.length < 2;
    for (const [id, initial] of [["diff-a", 0], ["diff-b", 1]]) {
      const select = $(id);
      select.innerHTML = "";
      columns.forEach((c) => select.appendChild(new Option(c.label, c.index)));
      select.value = initial;
    }
  }

  async function showDiff() {
    const url = "/compare/" + conversation + "/diff/?a=" + $("diff-a").value + "&b=" + $("diff-b").value;
    const response = await fetch(url, {credentials: "same-origin"});
    const target = $("diff");
    target.innerHTML = "";
    if (!response.ok) {
      target.appendChild(el("div", "diagnosis", await errorText(response)));
      return;
    }
    const data = await response.json();
    target.appendChild(el("p", "muted small", "Similarity " + (data.ratio * 100).toFixed(0) + " %: " +
      "red is only in " + data.first + ", green only in " + data.second + "."));
    const text = el("div");
    for (const [op, piece] of data.pieces) {
      text.appendChild(op === "equal" ? document.createTextNode(piece) : el(op === "insert" ? "ins" : "del", "", piece));
    }
    target.appendChild(text);
  }

  async function toggleShare() {
    const button = $("share-toggle");
    const shared = button.dataset.shared !== "true";
    const response = await post("/compare/" + conversation + "/share/", {shared: shared});
    if (!response.ok) {
      showError(await errorText(response));
      return;
    }
    button.dataset.shared = String(shared);
    button.textContent = shared ? "Shared with the team · Unshare" : "Share with the team";
  }

  // --- start -------------------------------------------------------------------------------------------------
  setupPickers();
  if (saved) {
    layoutColumns(saved.map((c) => c.key), saved.map((c) => c.label));
    saved.forEach((c) => c.messages.forEach((m) => addMessage(columns[c.index], m)));
  } else {
    layoutColumns(pickedKeys());
  }
  if (form) {
    form.addEventListener("submit", send);
    $("json-check").addEventListener("click", jsonCheck);
    $("cache-check").addEventListener("click", cacheCheck);
  }
  $("diff-show").addEventListener("click", showDiff);
  if ($("share-toggle")) $("share-toggle").addEventListener("click", toggleShare);
  // Closing or leaving the page ends every stream; the server cancels the upstream requests in turn.
  window.addEventListener("pagehide", () => running.forEach((controller) => controller.abort()));
})();
