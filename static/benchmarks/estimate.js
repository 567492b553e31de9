// Keeps a ladder's or sweep's time estimate in step with its form: steps × (engine start + repeats × requests ×
// seconds per request), with the figures the page measured on this host ([data-estimate] attributes).
(function () {
  "use strict";

  function words(seconds) {
    const minutes = Math.ceil(seconds / 60);
    if (minutes < 60) return "about " + minutes + " min";
    return "about " + Math.floor(minutes / 60) + " h " + String(minutes % 60).padStart(2, "0") + " min";
  }

  function number(form, name, fallback) {
    const field = form.querySelector("[name='" + name + "']");
    const value = field ? parseFloat(field.value) : NaN;
    return isNaN(value) ? fallback : value;
  }

  function update(box) {
    const form = box.closest("form");
    const start = parseFloat(box.dataset.engineStart), perRequest = parseFloat(box.dataset.perRequest);
    const stop = parseFloat(box.dataset.stop);
    let steps = parseInt(box.dataset.steps, 10);
    const values = form.querySelector("[name='values']");
    if (values) steps = Math.max(values.value.split(/[ ,]+/).filter(Boolean).length, 1);
    const requests = number(form, "requests", 0) + number(form, "warmup_requests", 0);
    const repeats = number(form, "repeats", 1);
    const total = steps * (start + stop + repeats * requests * perRequest);
    box.querySelector("[data-estimate-total]").textContent = words(total);
    box.querySelector("[data-estimate-steps]").textContent = steps;
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-estimate]").forEach(function (box) {
      const form = box.closest("form");
      form.addEventListener("input", function () { update(box); });
      update(box);
    });
  });
})();
