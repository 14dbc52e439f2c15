// Copy buttons: a click on [data-copy] puts its value on the clipboard (works after htmx swaps,
// as the listener is on the document). Without JavaScript the buttons stay hidden (style.css).
(function () {
  "use strict";
  document.documentElement.classList.add("js");
  function fallback(text) {
    var field = document.createElement("textarea");
    field.value = text;
    field.setAttribute("readonly", "");
    field.className = "offscreen";
    document.body.appendChild(field);
    field.select();
    try { document.execCommand("copy"); } finally { document.body.removeChild(field); }
    return Promise.resolve();
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("[data-copy]");
    if (!button) return;
    event.preventDefault();
    var text = button.getAttribute("data-copy");
    var done = navigator.clipboard && window.isSecureContext
      ? navigator.clipboard.writeText(text) : fallback(text);
    done.then(function () {
      button.classList.add("copied");
      button.setAttribute("title", "Copied");
      setTimeout(function () { button.classList.remove("copied"); button.setAttribute("title", "Copy " + text); }, 1500);
    });
  });
})();
