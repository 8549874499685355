/* Tables on a phone: below 640 px each row of a table becomes a card whose cells carry their
 * column's name (dashboard.css, "tables as cards"). This names every cell after its column header
 * (data-label), on load and after each live refresh (live.js sends rd:refreshed). */
(function () {
  "use strict";
  function label(root) {
    (root || document).querySelectorAll(".table-wrap table").forEach(function (t) {
      var heads = t.querySelectorAll("thead tr:last-child th");
      if (!heads.length) return;
      var names = Array.prototype.map.call(heads, function (th) {
        var copy = th.cloneNode(true);
        copy.querySelectorAll("a.def, .sr-only").forEach(function (d) { d.remove(); });
        return copy.textContent.replace(/\s+/g, " ").trim();
      });
      t.querySelectorAll("tbody tr").forEach(function (tr) {
        var i = 0;
        Array.prototype.forEach.call(tr.children, function (cell) {
          if (names[i] && !cell.hasAttribute("data-label")) cell.setAttribute("data-label", names[i]);
          i += cell.colSpan || 1;
        });
      });
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", function () { label(); });
  else label();
  document.addEventListener("rd:refreshed", function () { label(); });
})();
