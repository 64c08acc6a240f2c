// trioq dashboard: the only script of its pages (the Content-Security-Policy allows no inline one).
"use strict";

// A form with data-confirm asks before it posts (Retry, Cancel, Pause, Resume).
document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form.getAttribute && form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

// The overview's "auto-refresh" box: reload every 5 s while it is ticked (remembered per browser).
document.addEventListener("DOMContentLoaded", function () {
  var box = document.getElementById("auto-refresh");
  if (!box) {
    return;
  }
  var remembered = false;
  try {
    remembered = window.localStorage.getItem("trioq-auto-refresh") === "1";
  } catch (e) {
    remembered = false;
  }
  box.checked = remembered;
  var timer = null;
  function arm() {
    if (timer !== null) {
      window.clearTimeout(timer);
      timer = null;
    }
    if (box.checked) {
      timer = window.setTimeout(function () { window.location.reload(); }, 5000);
    }
  }
  box.addEventListener("change", function () {
    try {
      window.localStorage.setItem("trioq-auto-refresh", box.checked ? "1" : "0");
    } catch (e) {
      // storage refused (private mode): the box still works for this page
    }
    arm();
  });
  arm();
});
