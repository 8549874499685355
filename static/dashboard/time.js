/* Times and wide tables on every page.
 * - Every <time class="ts" datetime="..."> shows UTC (as rendered by the server); with "local
 *   time" on (the footer's toggle, remembered per browser in localStorage), the browser's local
 *   time is shown beside it.
 * - A .table-wrap wider than its box gets .scrolls, and a "scroll sideways" hint after it.
 * Both are re-applied when live.js swaps a live region in. */
(function () {
  "use strict";
  var KEY = "rd:localtime";
  function localOn() {
    try { return window.localStorage.getItem(KEY) !== "0"; } catch (e) { return true; }
  }
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function localText(d, withDate) {
    var t = pad(d.getHours()) + ":" + pad(d.getMinutes());
    var date = d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate());
    var zone = "";
    try {
      zone = new Intl.DateTimeFormat(undefined, {timeZoneName: "short"})
        .formatToParts(d).filter(function (p) { return p.type === "timeZoneName"; })
        .map(function (p) { return p.value; })[0] || "local";
    } catch (e) { zone = "local"; }
    return (withDate ? date + " " : "") + t + " " + zone;
  }
  function times(root) {
    var on = localOn();
    (root || document).querySelectorAll("time.ts[datetime]").forEach(function (el) {
      var span = el.querySelector(".local");
      if (!on) { if (span) span.remove(); return; }
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d.getTime()) || d.getTimezoneOffset() === 0) return;  // local is UTC here
      if (!span) {
        span = document.createElement("span");
        span.className = "local";
        el.appendChild(span);
      }
      span.textContent = " (" + localText(d, el.dataset.date === "1") + ")";
    });
    var utcHere = new Date().getTimezoneOffset() === 0;
    document.querySelectorAll("[data-time-toggle]").forEach(function (b) {
      b.hidden = utcHere;  // the browser's local time is UTC: nothing to show beside it
      b.textContent = on ? " (hide local time)" : " (show local time beside UTC)";
      b.setAttribute("aria-pressed", on ? "true" : "false");
    });
  }
  function tables(root) {
    (root || document).querySelectorAll(".table-wrap").forEach(function (w) {
      var wide = w.scrollWidth > w.clientWidth + 1;
      w.classList.toggle("scrolls", wide);
      var hint = w.nextElementSibling;
      if (!hint || !hint.classList.contains("scroll-hint")) {
        hint = document.createElement("p");
        hint.className = "scroll-hint";
        hint.textContent = "⇆ the table is wider than the screen: scroll it sideways";
        w.parentNode.insertBefore(hint, w.nextSibling);
      }
    });
  }
  function all() { times(); tables(); }
  document.addEventListener("click", function (ev) {
    var b = ev.target.closest && ev.target.closest("[data-time-toggle]");
    if (!b) return;
    try { window.localStorage.setItem(KEY, localOn() ? "0" : "1"); } catch (e) { /* private */ }
    times();
  });
  var live = document.getElementById("live");
  if (live && window.MutationObserver) {
    new MutationObserver(function () { all(); }).observe(live, {childList: true});
  }
  window.addEventListener("resize", function () { tables(); });
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", all);
  else all();
})();
