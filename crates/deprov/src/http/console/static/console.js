// deprov console: refreshes every element with data-live="<fragment URL>" every two seconds by
// fetching the fragment (server-rendered, escaped HTML) and replacing the element's content.
// A session that ended sends the person to the login page; a failed fetch marks the element stale.
(function () {
  "use strict";
  var EVERY_MS = 2000;
  function poll(el) {
    var url = el.getAttribute("data-live");
    function tick() {
      fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } })
        .then(function (r) {
          if (r.redirected && new URL(r.url).pathname === "/ui/login") {
            window.location.assign("/ui/login");
            return null;
          }
          if (!r.ok) {
            throw new Error("HTTP " + r.status);
          }
          return r.text();
        })
        .then(function (html) {
          if (html !== null) {
            el.innerHTML = html;
            el.removeAttribute("data-stale");
          }
        })
        .catch(function () {
          el.setAttribute("data-stale", "true");
        })
        .finally(function () {
          window.setTimeout(tick, EVERY_MS);
        });
    }
    window.setTimeout(tick, EVERY_MS);
  }
  document.querySelectorAll("[data-live]").forEach(poll);
})();
