// dockhand dashboard: the only script besides htmx (CSP allows no inline script).
// - theme toggle: cookie dh_theme=dark|light, class on <html> (the server renders it too);
// - timezone toggle: cookie dh_tz=<IANA name from Intl> or utc; the server renders times in it;
// - keys: "/" focuses the search box, "j"/"k" move the selected table row (Enter opens its
//   first link), "r" refreshes the main content (htmx) or reloads the page;
// - live refresh: the topbar selector sets cookie dh_refresh=<seconds> (0 = off; unset = the
//   page's default, 5 s on the overview, off on lists); a tick is skipped while rows are checked,
//   a form field has focus, or the tab is hidden.
(function () {
  "use strict";

  var base = document.documentElement.getAttribute("data-base") || "/";

  function setCookie(name, value) {
    document.cookie = name + "=" + encodeURIComponent(value) +
      "; Path=" + base + "; Max-Age=31536000; SameSite=Strict";
  }

  function prefersDark() {
    return window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
  }

  function toggleTheme() {
    var root = document.documentElement;
    var dark = root.classList.contains("dark") ||
      (!root.classList.contains("light") && prefersDark());
    var next = dark ? "light" : "dark";
    root.classList.remove("dark", "light");
    root.classList.add(next);
    setCookie("dh_theme", next);
  }

  function localZone() {
    try {
      return Intl.DateTimeFormat().resolvedOptions().timeZone || "utc";
    } catch (e) {
      return "utc";
    }
  }

  function toggleZone() {
    var current = document.documentElement.getAttribute("data-tz") || "utc";
    setCookie("dh_tz", current === "utc" ? localZone() : "utc");
    refresh();
  }

  function refresh() {
    var main = document.getElementById("dh-main");
    if (window.htmx && main) {
      window.htmx.ajax("GET", window.location.pathname + window.location.search,
        { target: "#dh-main", swap: "innerHTML" });
    } else {
      window.location.reload();
    }
  }

  function rows() {
    var table = document.querySelector("table.rows");
    return table ? Array.prototype.slice.call(table.querySelectorAll("tbody tr")) : [];
  }

  function moveSelection(step) {
    var all = rows();
    if (all.length === 0) { return; }
    var at = all.findIndex(function (r) { return r.classList.contains("selected"); });
    var next = at < 0 ? (step > 0 ? 0 : all.length - 1) : Math.min(all.length - 1, Math.max(0, at + step));
    if (at >= 0) { all[at].classList.remove("selected"); }
    all[next].classList.add("selected");
    all[next].scrollIntoView({ block: "nearest" });
  }

  function openSelection() {
    var sel = document.querySelector("table.rows tbody tr.selected a[href]");
    if (sel) { sel.click(); return true; }
    return false;
  }

  function typing(target) {
    var tag = target && target.tagName;
    return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" ||
      (target && target.isContentEditable);
  }

  document.addEventListener("keydown", function (e) {
    if (e.ctrlKey || e.metaKey || e.altKey || typing(e.target)) { return; }
    switch (e.key) {
      case "/": {
        var search = document.querySelector("input[type=search]");
        if (search) { e.preventDefault(); search.focus(); }
        break;
      }
      case "j": moveSelection(1); break;
      case "k": moveSelection(-1); break;
      case "Enter": if (openSelection()) { e.preventDefault(); } break;
      case "r": e.preventDefault(); refresh(); break;
      default: break;
    }
  });

  document.addEventListener("click", function (e) {
    var t = e.target && e.target.closest ? e.target.closest("[data-toggle]") : null;
    if (!t) { return; }
    if (t.getAttribute("data-toggle") === "theme") { toggleTheme(); }
    if (t.getAttribute("data-toggle") === "tz") { toggleZone(); }
  });

  var timer = null;

  function busy() {
    var main = document.getElementById("dh-main");
    var a = document.activeElement;
    var editing = typing(a) && !(a.hasAttribute && a.hasAttribute("data-refresh-select"));
    return document.hidden || editing ||
      (main && main.querySelector("input[type=checkbox]:checked"));
  }

  function startRefresh(seconds) {
    if (timer) { window.clearInterval(timer); timer = null; }
    if (seconds > 0) {
      timer = window.setInterval(function () { if (!busy()) { refresh(); } }, seconds * 1000);
    }
  }

  document.addEventListener("change", function (e) {
    var t = e.target;
    if (t && t.hasAttribute && t.hasAttribute("data-refresh-select")) {
      var seconds = parseInt(t.value, 10) || 0;
      setCookie("dh_refresh", String(seconds));
      startRefresh(seconds);
    }
  });

  // Buttons that only work with script are hidden in the markup until it runs.
  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("[data-toggle], [data-refresh]"),
      function (b) { b.hidden = false; });
    var select = document.querySelector("[data-refresh-select]");
    startRefresh(select ? parseInt(select.value, 10) || 0 : 0);
  });
})();
