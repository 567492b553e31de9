// Renders every [data-plotly] element from the JSON figure inside it (a <script type="application/json"> that
// Django's json_script wrote), with the plotly.js served from our static files. Live regions replace their
// content, so new chart elements are picked up by a MutationObserver.
(function () {
  "use strict";

  function render(element) {
    if (element.dataset.rendered || typeof Plotly === "undefined") return;
    const source = element.querySelector("script[type='application/json']");
    if (!source) return;
    const figure = JSON.parse(source.textContent);
    element.dataset.rendered = "1";
    const target = document.createElement("div");
    element.appendChild(target);
    Plotly.newPlot(target, figure.data, figure.layout, { responsive: true, displaylogo: false });
  }

  function renderAll() {
    document.querySelectorAll("[data-plotly]").forEach(render);
  }

  document.addEventListener("DOMContentLoaded", function () {
    renderAll();
    new MutationObserver(renderAll).observe(document.body, { childList: true, subtree: true });
  });
})();
