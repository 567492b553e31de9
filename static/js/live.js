// Live regions: an element with data-live-url is re-rendered from that URL (an HTML partial) every
// data-live-every milliseconds. Polling backs off while the tab is hidden and stops once the element
// carries data-live-done (a job that reached a final state); with data-live-reload, the page reloads then.
(function () {
  "use strict";
  const HIDDEN_FACTOR = 6;
  const MAX_BACKOFF = 60000;

  function watch(region) {
    const url = region.dataset.liveUrl;
    const every = parseInt(region.dataset.liveEvery || "5000", 10);
    let failures = 0;

    async function refresh() {
      if (region.hasAttribute("data-live-done")) return;
      try {
        const response = await fetch(url, { headers: { "X-Requested-With": "fetch" }, credentials: "same-origin" });
        if (!response.ok) throw new Error(response.status);
        const html = await response.text();
        const openLogs = region.querySelectorAll("details[open]").length > 0;
        region.innerHTML = html;
        if (openLogs) region.querySelectorAll("details.log").forEach((d) => d.setAttribute("open", ""));
        region.querySelectorAll(".log pre").forEach((pre) => { pre.scrollTop = pre.scrollHeight; });
        const final = region.querySelector("[data-final]");
        if (final) region.setAttribute("data-live-done", "");
        // A region whose job's end changes the rest of the page (a model's state, its buttons) reloads it.
        if (final && region.hasAttribute("data-live-reload")) window.location.reload();
        failures = 0;
      } catch (error) {
        failures += 1;
      }
      schedule();
    }

    function schedule() {
      if (region.hasAttribute("data-live-done")) return;
      let delay = every * Math.pow(2, Math.min(failures, 5));
      if (document.hidden) delay *= HIDDEN_FACTOR;
      setTimeout(refresh, Math.min(delay, MAX_BACKOFF));
    }

    schedule();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live-url]").forEach(watch);
  });
})();
