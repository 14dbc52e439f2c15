// The runs list refreshes itself every 2 s; while runs are ticked for a bulk action it does not,
// so the ticks are not swapped away.
document.addEventListener("htmx:beforeRequest", function (event) {
  var rows = document.getElementById("rows");
  if (rows && event.detail.elt === rows && rows.querySelector("input[name=run]:checked")) {
    event.preventDefault();
  }
});
