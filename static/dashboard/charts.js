/* Draw the run page's Plotly figures from the JSON the server embedded (already downsampled),
 * and redraw them from charts.json when live.js reports a new analysis version.
 *
 * One time range for every time chart (figures with time_axis): the range picker (last 1 h /
 * 6 h / 24 h / all, remembered per browser and kept in the URL: ?range=6h, or ?from=&to= for a
 * zoom) and a zoom or pan in any time chart set it for all of them. Hovering a time chart shows
 * the same moment in the others (a shared crosshair). Each time chart's y axis is scaled to the points inside the range; the TSLRC limit line
 * is drawn only when it lies inside that y range, else a note names it.
 * Titles are drawn in the page (h3), not by Plotly, so the mode bar never covers them; on a
 * phone the mode bar is hidden (the range picker zooms). */
(function () {
  "use strict";
  var script = document.currentScript;
  var chartsUrl = script && script.dataset.chartsUrl;
  var RANGE_KEY = "rd:range";
  var HOURS = {"1h": 1, "6h": 6, "24h": 24};
  var state = {figures: {}, range: null, choice: "all", syncing: false};

  function phone() { return window.innerWidth < 640; }
  function config() {
    return {responsive: true, displaylogo: false, displayModeBar: phone() ? false : "hover",
            modeBarButtonsToRemove: ["lasso2d", "select2d", "toImage", "autoScale2d"]};
  }
  /* A time of a date axis as epoch ms: RFC 3339 with a zone, or Plotly's zoned-less
   * "YYYY-MM-DD HH:MM:SS.sss" (the axis is in UTC). */
  function ms(x) {
    if (typeof x === "number") return x;
    var s = String(x);
    if (/([zZ]|[+-]\d\d:?\d\d)$/.test(s)) return Date.parse(s);
    return Date.parse(s.replace(" ", "T") + "Z");
  }
  function iso(t) { return new Date(t).toISOString(); }

  /* The whole run: the union of the time charts' server ranges (first event to now or end). */
  function fullRange() {
    var lo = null, hi = null;
    Object.keys(state.figures).forEach(function (name) {
      var fig = state.figures[name];
      var r = fig.time_axis && fig.layout.xaxis && fig.layout.xaxis.range;
      if (!r) return;
      lo = lo === null ? ms(r[0]) : Math.min(lo, ms(r[0]));
      hi = hi === null ? ms(r[1]) : Math.max(hi, ms(r[1]));
    });
    return lo === null ? null : [lo, hi];
  }
  function chosenRange(choice) {
    var all = fullRange();
    if (!all || !HOURS[choice]) return all;
    return [Math.max(all[0], all[1] - HOURS[choice] * 3600e3), all[1]];
  }

  /* y range [0, top] of the points of fig's traces (limit line excluded) inside [x0, x1]. */
  function yRange(fig, range) {
    var top = 0, bottom = 0, any = false;
    fig.data.forEach(function (t) {
      if (t.meta === "limit" || !t.x || !t.y) return;
      for (var i = 0; i < t.x.length; i++) {
        var y = t.y[i];
        if (y === null || y === undefined) continue;
        var x = ms(t.x[i]);
        if (range && (x < range[0] || x > range[1])) continue;
        any = true;
        if (y > top) top = y;
        if (y < bottom) bottom = y;
      }
    });
    if (!any) return null;
    return [bottom, top > 0 ? top * 1.08 : 1];
  }

  /* Layout changes for fig under the shared range: x range, y range, limit line in view or not. */
  function rangeUpdate(fig, range) {
    var upd = {}, y = yRange(fig, range);
    if (range) upd["xaxis.range"] = [iso(range[0]), iso(range[1])];
    if (y) upd["yaxis.range"] = y;
    if (fig.limit) {
      var inView = !y || fig.limit.y <= y[1];
      upd.annotations = inView ? [] : [fig.limit.note];
      upd.limitVisible = inView;
    }
    return upd;
  }
  function applyRange(el, fig, range) {
    var upd = rangeUpdate(fig, range);
    if (fig.limit) {
      var idx = fig.data.map(function (t, i) { return t.meta === "limit" ? i : -1; })
        .filter(function (i) { return i >= 0; });
      if (idx.length) Plotly.restyle(el, {visible: upd.limitVisible}, idx);
      delete upd.limitVisible;
    }
    return Plotly.relayout(el, upd);
  }

  /* The time range in the page's URL (a link or a reload shows the same range): ?range=1h|6h|
   * 24h|all, or ?from=...&to=... (RFC 3339, UTC) for a zoom. */
  function rangeToUrl(range, choice) {
    if (!window.history || !window.URL) return;
    var url = new URL(window.location.href);
    url.searchParams.delete("range"); url.searchParams.delete("from"); url.searchParams.delete("to");
    if (choice === "zoom" && range) {
      url.searchParams.set("from", iso(range[0]).slice(0, 19) + "Z");
      url.searchParams.set("to", iso(range[1]).slice(0, 19) + "Z");
    } else if (choice && choice !== "all") {
      url.searchParams.set("range", choice);
    }
    window.history.replaceState(window.history.state, "", url.toString());
  }
  function rangeFromUrl() {
    var q = new URLSearchParams(window.location.search);
    var from = q.get("from"), to = q.get("to"), choice = q.get("range");
    if (from && to && !isNaN(ms(from)) && !isNaN(ms(to)) && ms(from) < ms(to)) {
      return {choice: "zoom", range: [ms(from), ms(to)]};
    }
    if (choice && (HOURS[choice] || choice === "all")) return {choice: choice, range: null};
    return null;
  }

  function setRange(range, choice, from) {
    state.range = range;
    state.choice = choice;
    rangeToUrl(range, choice);
    document.querySelectorAll("[data-range]").forEach(function (b) {
      b.setAttribute("aria-pressed", b.dataset.range === choice ? "true" : "false");
    });
    var note = document.getElementById("range-note");
    if (note) note.textContent = choice === "zoom" && range
      ? "Zoomed: " + iso(range[0]).slice(0, 19).replace("T", " ") + " to " +
        iso(range[1]).slice(0, 19).replace("T", " ") + " UTC" : "";
    state.syncing = true;
    var jobs = [];
    document.querySelectorAll(".plot[data-figure]").forEach(function (el) {
      var fig = state.figures[el.dataset.figure];
      if (!fig || !fig.time_axis || el === from && choice !== "zoom") return;
      jobs.push(applyRange(el, fig, range));
    });
    Promise.all(jobs).then(function () { state.syncing = false; },
                           function () { state.syncing = false; });
  }

  function onRelayout(el, ev) {
    if (state.syncing || !ev) return;
    if (ev["xaxis.autorange"]) { setRange(chosenRange("all"), "all"); return; }
    var r0 = ev["xaxis.range[0]"], r1 = ev["xaxis.range[1]"];
    if (ev["xaxis.range"]) { r0 = ev["xaxis.range"][0]; r1 = ev["xaxis.range"][1]; }
    if (r0 === undefined || r1 === undefined) return;
    setRange([ms(r0), ms(r1)], "zoom", el);
  }

  function title(el, text) {
    var h = el.previousElementSibling;
    if (!h || !h.classList.contains("chart-title")) {
      h = document.createElement("h3");
      h.className = "chart-title";
      el.parentNode.insertBefore(h, el);
    }
    h.textContent = text || "";
  }

  function layoutFor(fig) {
    var layout = Object.assign({}, fig.layout, {autosize: true});
    layout.title = {text: ""};
    layout.margin = Object.assign({}, layout.margin, {t: 12});
    layout.xaxis = Object.assign({}, layout.xaxis, {automargin: true});
    layout.yaxis = Object.assign({}, layout.yaxis, {automargin: true});
    // the legend sits at the bottom of the chart's own box: Plotly makes room for it however
    // many rows it wraps into, so it never covers the tick labels nor spills onto the next card
    layout.legend = Object.assign({}, layout.legend, {orientation: "h", x: 0, xanchor: "left",
                                                      y: 0, yanchor: "bottom", yref: "container"});
    if (phone()) {
      layout.margin = Object.assign({}, layout.margin, {l: 8, r: 8});
      layout.legend.font = {size: 11};
      layout.height = (layout.height || 320) + 60;
      layout.xaxis.nticks = 4;
    }
    if (fig.time_axis) {
      // the crosshair: a spike line across the plot at the hovered time, in every time chart
      layout.xaxis.showspikes = true;
      layout.xaxis.spikemode = "across";
      layout.xaxis.spikesnap = "cursor";
      layout.xaxis.spikethickness = 1;
      layout.xaxis.spikedash = "dot";
      layout.xaxis.spikecolor = "#57606a";
      layout.hovermode = "x";
      var range = state.range || chosenRange(state.choice);
      var upd = rangeUpdate(fig, range);
      if (upd["xaxis.range"]) layout.xaxis.range = upd["xaxis.range"];
      if (upd["yaxis.range"]) layout.yaxis.range = upd["yaxis.range"];
      if (upd.annotations !== undefined) {
        layout.annotations = upd.annotations;
        fig.data.forEach(function (t) { if (t.meta === "limit") t.visible = upd.limitVisible; });
      }
    }
    return layout;
  }

  var lastPayload = null, drawnPhone = null;
  /* Shared crosshair (Grafana's): hovering a time chart shows the same moment in every other
   * time chart, its spike line and values. */
  var hovering = false, pending = null;
  function crossAt(other, x) {
    var fig = state.figures[other.dataset.figure];
    var base = ((fig && fig.layout.shapes) || []).slice();
    if (x !== null) {
      base.push({type: "line", name: "crosshair", xref: "x", yref: "paper", x0: x, x1: x,
                 y0: 0, y1: 1, layer: "above",
                 line: {color: "#57606a", width: 1, dash: "dot"}});
    }
    return Plotly.relayout(other, {shapes: base});
  }
  function shareCross(el, x) {
    document.querySelectorAll(".plot[data-figure]").forEach(function (other) {
      var fig = state.figures[other.dataset.figure];
      if (other === el || !fig || !fig.time_axis || !other.data) return;
      state.syncing = true;
      crossAt(other, x).then(function () { state.syncing = false; },
                             function () { state.syncing = false; });
      if (x !== null) {  // its values at that moment, where it has points there
        try { Plotly.Fx.hover(other, {xval: x}, "xy"); } catch (e) { /* not drawn yet */ }
      }
    });
  }
  function shareHover(el, ev) {
    if (hovering || !ev || !ev.points || !ev.points.length) return;
    var x = ev.points[0].x;
    if (pending === null) {
      window.requestAnimationFrame(function () {
        var at = pending;
        pending = null;
        hovering = true;
        shareCross(el, at);
        state.crosshair = at;
        hovering = false;
      });
    }
    pending = x;
  }
  function shareUnhover(el) {
    if (hovering) return;
    state.crosshair = null;
    shareCross(el, null);
    document.querySelectorAll(".plot[data-figure]").forEach(function (other) {
      if (other !== el && other.data) { try { Plotly.Fx.unhover(other); } catch (e) { /* */ } }
    });
  }

  function draw(payload, first) {
    lastPayload = payload;
    drawnPhone = phone();
    state.figures = (payload && payload.figures) || {};
    if (state.choice !== "zoom") state.range = chosenRange(state.choice);
    document.querySelectorAll(".plot[data-figure]").forEach(function (el) {
      var fig = state.figures[el.dataset.figure];
      if (!fig) return;
      title(el, fig.layout.title && fig.layout.title.text);
      (first ? Plotly.newPlot : Plotly.react)(el, fig.data, layoutFor(fig), config())
        .then(function () {
          if (first && fig.time_axis) {
            el.on("plotly_relayout", function (ev) { onRelayout(el, ev); });
            el.on("plotly_hover", function (ev) { shareHover(el, ev); });
            el.on("plotly_unhover", function () { shareUnhover(el); });
          }
        });
      el.classList.toggle("is-empty", !!fig.empty);
    });
  }

  var saved = null;
  try { saved = window.localStorage.getItem(RANGE_KEY); } catch (e) { saved = null; }
  if (saved && (HOURS[saved] || saved === "all")) state.choice = saved;
  var linked = rangeFromUrl();  // a link's range wins over the browser's last choice
  if (linked) { state.choice = linked.choice; state.range = linked.range; }
  document.querySelectorAll("[data-range]").forEach(function (b) {
    b.addEventListener("click", function () {
      try { window.localStorage.setItem(RANGE_KEY, b.dataset.range); } catch (e) { /* private */ }
      setRange(chosenRange(b.dataset.range), b.dataset.range);
    });
  });
  var embedded = document.getElementById("figures-data");
  function start() {
    if (!embedded || !window.Plotly) return;
    draw(JSON.parse(embedded.textContent), true);
    setRange(state.choice === "zoom" ? state.range : chosenRange(state.choice), state.choice);
    document.documentElement.dataset.charts = "drawn";
  }
  /* plotly.js (1.1 MB with brotli, 4.8 MB to parse) is fetched once the page has loaded: the
   * answers, tables and alerts are on screen at once, the charts follow. */
  var plotlySrc = script && script.dataset.plotly;
  function fetchPlotly() {
    if (window.Plotly || !plotlySrc) { start(); return; }
    var tag = document.createElement("script");
    tag.src = plotlySrc;
    tag.onload = start;
    document.head.appendChild(tag);
  }
  if (embedded) {
    if (document.readyState === "complete") fetchPlotly();
    else window.addEventListener("load", fetchPlotly);
  }
  // crossing the phone breakpoint (a rotated phone, a resized window) lays the charts out again
  window.addEventListener("resize", function () {
    if (lastPayload && phone() !== drawnPhone) draw(lastPayload, false);
  });
  document.addEventListener("rd:version", function () {
    if (!chartsUrl || !window.Plotly) return;
    fetch(chartsUrl, {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (payload) { if (payload) draw(payload, false); });
  });
  window.rdCharts = state;  // for tests and the console: the shared range and the figures
  window.rdTime = ms;
})();
