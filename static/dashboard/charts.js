/* Draw the run page's Plotly figures from the JSON the server embedded (already downsampled),
 * and redraw them from charts.json when live.js reports a new analysis version. */
(function () {
  "use strict";
  var script = document.currentScript;
  var chartsUrl = script && script.dataset.chartsUrl;
  var config = {responsive: true, displaylogo: false,
                modeBarButtonsToRemove: ["lasso2d", "select2d", "toImage"]};
  function draw(payload, first) {
    var figures = (payload && payload.figures) || {};
    document.querySelectorAll(".plot[data-figure]").forEach(function (el) {
      var fig = figures[el.dataset.figure];
      if (!fig) return;
      var layout = Object.assign({}, fig.layout, {autosize: true});
      if (window.innerWidth < 640) {
        layout.margin = Object.assign({}, layout.margin, {l: 44, r: 8});
        layout.title = Object.assign({}, layout.title, {font: {size: 13}});
        layout.legend = Object.assign({}, layout.legend, {y: -0.32});
        layout.height = (layout.height || 320) + 40;
      }
      (first ? Plotly.newPlot : Plotly.react)(el, fig.data, layout, config);
      el.classList.toggle("is-empty", !!fig.empty);
    });
  }
  var embedded = document.getElementById("figures-data");
  if (embedded && window.Plotly) draw(JSON.parse(embedded.textContent), true);
  document.addEventListener("rd:version", function () {
    if (!chartsUrl) return;
    fetch(chartsUrl, {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (payload) { if (payload) draw(payload, false); });
  });
})();
