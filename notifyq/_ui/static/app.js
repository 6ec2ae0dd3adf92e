// notifyq dashboard: keep relative times current, send the CSRF token with htmx requests,
// and hold a live list still while the user has ticked rows in it.
(function () {
  "use strict";

  function span(seconds) {
    const units = [["d", 86400], ["h", 3600], ["min", 60]];
    for (const [unit, size] of units) {
      if (seconds >= size) return Math.floor(seconds / size) + " " + unit;
    }
    return Math.floor(seconds) + " s";
  }

  function relative(iso) {
    const delta = (Date.now() - Date.parse(iso)) / 1000;
    if (Math.abs(delta) < 1) return "just now";
    return delta >= 0 ? span(delta) + " ago" : "in " + span(-delta);
  }

  function refreshTimes(root) {
    for (const el of (root || document).querySelectorAll("time[datetime]")) {
      el.textContent = relative(el.getAttribute("datetime"));
    }
  }

  // A <details class="fold"> is open on wide screens and folded on a phone (its summary
  // shows only there, see app.css), so what it holds does not push the content off screen.
  const phone = window.matchMedia("(max-width: 600px)");
  function fold() {
    for (const el of document.querySelectorAll("details.fold")) el.open = !phone.matches;
  }
  phone.addEventListener("change", fold);

  document.addEventListener("DOMContentLoaded", function () {
    refreshTimes(document);
    setInterval(refreshTimes, 5000);
    fold();
  });

  document.addEventListener("htmx:configRequest", function (event) {
    const meta = document.querySelector('meta[name="csrf-token"]');
    if (meta) event.detail.headers["X-CSRF-Token"] = meta.content;
  });

  document.addEventListener("htmx:beforeRequest", function (event) {
    const target = event.detail.elt;
    if (target && target.hasAttribute("data-live") &&
        target.querySelector("input[type=checkbox]:checked, details[open]")) {
      event.preventDefault();  // a refresh would drop the selection or close what is open
    }
  });

  document.addEventListener("htmx:afterSwap", function (event) {
    refreshTimes(event.detail.target.parentNode || document);
  });
})();
