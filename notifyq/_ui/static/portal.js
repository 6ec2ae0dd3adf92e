// notifyq customer portal: sign in with a link. The link's code is in the address's fragment,
// which browsers never send to a server (so it is in no log); move it into the form, take it
// out of the address bar and the history, and post the form once.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    const form = document.getElementById("link-form");
    const code = decodeURIComponent(window.location.hash.replace(/^#/, ""));
    if (!form || !code) return;
    history.replaceState(null, "", window.location.pathname);
    document.getElementById("link-code").value = code;
    form.submit();
  });
})();
