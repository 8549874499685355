/* Live refresh: fetch the page's live region (?fragment=live) and swap it in, every 10 s, every
 * minute or never: the refresh choice above the region (off / 10 s / 1 min), remembered per
 * browser and kept in the URL (?refresh=off|10s|1m, so a link refreshes as its sender's did).
 * When the analysis version in the region changes, announce it (charts.js redraws).
 * Pauses while the tab is hidden, while someone is using a control inside the region, and while
 * rows are ticked for a bulk action (input[data-hold]). */
(function () {
  "use strict";
  var CHOICES = {"off": 0, "10s": 10000, "1m": 60000};
  var LABELS = {"off": "off", "10s": "every 10 s", "1m": "every minute"};
  var KEY = "rd:refresh";
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
    if (busy || document.hidden || !CHOICES[choice]) return;
    var active = document.activeElement;
    if (active && region.contains(active) && /SELECT|INPUT|TEXTAREA/.test(active.tagName)) return;
    // a selection for a bulk action is kept until it is used or cleared
    if (document.querySelector("input[data-hold]:checked")) return;
    busy = true;
    fetch(url, {credentials: "same-origin", headers: {"X-Requested-With": "fetch"}})
      .then(function (r) {
        if (r.redirected || !r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) {
        region.innerHTML = html;
        region.removeAttribute("data-stale");
        document.dispatchEvent(new CustomEvent("rd:refreshed"));
        var v = version(region);
        if (v && v !== current) {
          current = v;
          document.dispatchEvent(new CustomEvent("rd:version", {detail: v}));
        }
      })
      .catch(function () { region.setAttribute("data-stale", "true"); })
      .finally(function () { busy = false; });
  }

  var params = new URLSearchParams(window.location.search);
  var choice = params.get("refresh"), saved = null;
  try { saved = window.localStorage.getItem(KEY); } catch (e) { saved = null; }
  if (!(choice in CHOICES)) choice = saved in CHOICES ? saved : "10s";
  var timer = null;
  function schedule() {
    if (timer) clearInterval(timer);
    timer = CHOICES[choice] ? setInterval(tick, CHOICES[choice]) : null;
    region.dataset.refresh = choice;
  }

  // the control: above the live region, right-aligned
  var bar = document.createElement("div");
  bar.className = "refresh-choice";
  var label = document.createElement("label");
  label.textContent = "Refresh ";
  var select = document.createElement("select");
  select.name = "refresh";
  Object.keys(CHOICES).forEach(function (key) {
    var opt = document.createElement("option");
    opt.value = key;
    opt.textContent = LABELS[key];
    opt.selected = key === choice;
    select.appendChild(opt);
  });
  label.appendChild(select);
  bar.appendChild(label);
  region.parentNode.insertBefore(bar, region);
  select.addEventListener("change", function () {
    choice = select.value;
    try { window.localStorage.setItem(KEY, choice); } catch (e) { /* private mode */ }
    if (window.history && window.URL) {
      var here = new URL(window.location.href);
      if (choice === "10s") here.searchParams.delete("refresh");
      else here.searchParams.set("refresh", choice);
      window.history.replaceState(window.history.state, "", here.toString());
    }
    schedule();
    if (CHOICES[choice]) tick();
  });

  schedule();
  document.addEventListener("visibilitychange", function () { if (!document.hidden) tick(); });
  window.rdLive = {choice: function () { return choice; }};  // for tests and the console
})();
