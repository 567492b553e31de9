// Parts of a form that apply to some choices only: an element with data-when-field="NAME" and
// data-when-values="a b" is shown only while the form's field NAME holds one of those values. Without
// JavaScript every part shows; the server ignores what does not apply (a channel's pool fields, for one).
(function () {
  "use strict";

  function follow(part) {
    const form = part.closest("form");
    const field = form && form.elements.namedItem(part.dataset.whenField);
    if (!field) return;
    const values = part.dataset.whenValues.split(" ");
    const update = () => { part.hidden = !values.includes(field.value); };
    field.addEventListener("change", update);
    update();
  }

  document.querySelectorAll("[data-when-field]").forEach(follow);
})();
