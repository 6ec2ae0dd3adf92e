// notifyq dashboard: keep relative times current, send the CSRF token with htmx requests,
// hold a live list still while the user has ticked rows in it, and copy ids in one click.
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
        target.querySelector("input[type=checkbox]:checked, details[open], input.copy-field")) {
      event.preventDefault();  // a refresh would drop the selection, or close what is open
    }
  });

  // The clipboard needs a secure context (https, or this machine): elsewhere the id is shown
  // selected in a field beside the button, for Ctrl+C.
  function showField(button, text) {
    let field = button.nextElementSibling;
    if (!field || !field.classList.contains("copy-field")) {
      field = document.createElement("input");
      field.className = "copy-field mono";
      field.readOnly = true;
      field.value = text;
      field.setAttribute("aria-label", "Id to copy");
      button.after(field);
    }
    field.focus();
    field.select();
  }

  document.addEventListener("click", function (event) {
    const button = event.target.closest("button[data-copy]");
    if (!button) return;
    const text = button.getAttribute("data-copy");
    if (!navigator.clipboard || !window.isSecureContext) {
      showField(button, text);
      return;
    }
    navigator.clipboard.writeText(text).then(function () {
      button.setAttribute("data-copied", "");
      setTimeout(function () { button.removeAttribute("data-copied"); }, 2000);
    }, function () { showField(button, text); });
  });

  document.addEventListener("change", function (event) {
    if (event.target.id !== "select-all") return;
    for (const box of document.querySelectorAll('tbody#rows input[name="id"]')) {
      box.checked = event.target.checked;
    }
  });

  document.addEventListener("htmx:afterSwap", function (event) {
    refreshTimes(event.detail.target.parentNode || document);
  });
})();
