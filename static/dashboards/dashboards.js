// Dashboards: draw the figures the page carries (JSON built by plotly in Python), then refresh figures, cards and
// tables from the data URL every data-every ms without reloading the page. Polling slows down while the tab is
// hidden and backs off after failures (the same rules as live.js).
(function () {
  "use strict";
  const HIDDEN_FACTOR = 6;
  const MAX_BACKOFF = 60000;
  const CONFIG = { displaylogo: false, responsive: true };

  function draw(figures) {
    Object.entries(figures).forEach(([name, figure]) => {
      const node = document.getElementById("figure-" + name);
      if (node) Plotly.react(node, figure.data, figure.layout, CONFIG);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    const holder = document.getElementById("dash-figures");
    const initial = document.getElementById("dash-initial");
    if (!holder || !initial || typeof Plotly === "undefined") return;
    draw(JSON.parse(initial.textContent));
    const url = holder.dataset.url;
    const every = parseInt(holder.dataset.every || "5000", 10);
    const status = document.getElementById("dash-status");
    let failures = 0;
    let refreshes = 0;

    async function refresh() {
      try {
        const response = await fetch(url, { headers: { "X-Requested-With": "fetch" }, credentials: "same-origin" });
        if (!response.ok) throw new Error(response.status);
        const data = await response.json();
        draw(data.figures);
        document.getElementById("dash-tables").innerHTML = data.tables;
        document.getElementById("dash-cards").innerHTML = data.cards;
        failures = 0;
        refreshes += 1;
        holder.dataset.refreshes = String(refreshes);
        if (status) status.textContent = "live · updated " + new Date().toLocaleTimeString();
      } catch (error) {
        failures += 1;
        if (status) status.textContent = "live · update failed, retrying";
      }
      schedule();
    }

    function schedule() {
      let delay = every * Math.pow(2, Math.min(failures, 5));
      if (document.hidden) delay *= HIDDEN_FACTOR;
      setTimeout(refresh, Math.min(delay, MAX_BACKOFF));
    }

    schedule();
  });
})();
