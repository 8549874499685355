/* Live refresh: every 10 s, fetch the page's live region (?fragment=live) and swap it in.
 * When the analysis version in the region changes, announce it (charts.js redraws).
 * Pauses while the tab is hidden, while someone is using a control inside the region, and while
 * rows are ticked for a bulk action (input[data-hold]). */
(function () {
  "use strict";
  var PERIOD_MS = 10000;
  var region = document.getElementById("live");
  if (!region || !region.dataset.live) return;
  var url = region.dataset.live;
  url += (url.indexOf("?") >= 0 ? "&" : "?") + "fragment=live";
  function version(root) {
    var el = root.querySelector("[data-version]");
    return el ? el.getAttribute("data-version") : null;
  }
  var current = version(region);
  var busy = false;
  function tick() {
    if (busy || document.hidden) return;
    var active = document.activeElement;
    if (active && region.contains(active) && /SELECT|INPUT|TEXTAREA/.test(active.tagName)) return;
    // a selection for a bulk action is kept until it is used or cleared
    if (region.querySelector("input[data-hold]:checked")) return;
    busy = true;
    fetch(url, {credentials: "same-origin", headers: {"X-Requested-With": "fetch"}})
      .then(function (r) {
        if (r.redirected || !r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) {
        region.innerHTML = html;
        region.removeAttribute("data-stale");
        var v = version(region);
        if (v && v !== current) {
          current = v;
          document.dispatchEvent(new CustomEvent("rd:version", {detail: v}));
        }
      })
      .catch(function () { region.setAttribute("data-stale", "true"); })
      .finally(function () { busy = false; });
  }
  setInterval(tick, PERIOD_MS);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) tick(); });
})();
