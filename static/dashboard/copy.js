/* Copy buttons: <button data-copy="#selector"> copies the text of that element to the clipboard
 * and says so on the button ("Copied" for 2 s); where the Clipboard API is refused (a page not
 * served over HTTPS nor from localhost), the text is selected so Ctrl+C copies it. */
(function () {
  "use strict";
  document.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-copy]");
    if (!button) return;
    var source = document.querySelector(button.getAttribute("data-copy"));
    if (!source) return;
    var label = button.querySelector("[data-copy-label]") || button;
    var text = source.textContent.trim();
    function say(word) {
      label.textContent = word;
      setTimeout(function () { label.textContent = "Copy"; }, 2000);
    }
    function selectIt() {
      var range = document.createRange();
      range.selectNodeContents(source);
      var sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      say("Selected: press Ctrl+C");
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { say("Copied"); }, selectIt);
    } else {
      selectIt();
    }
  });
})();
