// lattice ui: follow a run's events live, and refresh list pages. The page
// works without this script (reload it); everything it inserts is text
// (textContent), never markup.
"use strict";

(function () {
  const fmt = (ms) => (ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) : "-");
  // someone is filling in a form of the page: never redraw it under them
  const editing = (root) => {
    const active = document.activeElement;
    if (active && root.contains(active) && active.matches("input, textarea, select")) return true;
    const chosen = (s) => Math.max(0, Array.from(s.options).findIndex((o) => o.defaultSelected));
    return Array.from(root.querySelectorAll("input, textarea, select")).some((e) =>
      e.tagName === "SELECT" ? e.selectedIndex !== chosen(e)
        : e.type === "radio" || e.type === "checkbox" ? e.checked !== e.defaultChecked
        : e.type !== "hidden" && e.value !== e.defaultValue);
  };

  async function fetchPage() {
    const response = await fetch(window.location.href, { credentials: "same-origin", cache: "no-store" });
    if (!response.ok) return null;
    return new DOMParser().parseFromString(await response.text(), "text/html");
  }

  function replaceById(fresh, ids) {
    for (const id of ids) {
      const now = document.getElementById(id);
      const next = fresh.getElementById(id);
      if (now && next) now.replaceWith(document.importNode(next, true));
    }
  }

  // list pages: <main data-refresh="SECONDS"> is fetched again that often, unless a form is being filled in
  const main = document.querySelector("main[data-refresh]");
  if (main) {
    const seconds = Math.max(2, parseInt(main.dataset.refresh, 10) || 5);
    setInterval(async () => {
      if (editing(main) || document.hidden) return;
      const fresh = await fetchPage();
      const next = fresh && fresh.querySelector("main");
      if (next && !editing(main)) main.replaceChildren(...Array.from(next.childNodes, (n) => document.importNode(n, true)));
    }, seconds * 1000);
  }

  // a run's page: its events as server-sent events; the summary, segments and steps are redrawn after each burst
  const table = document.getElementById("events");
  if (!table || table.dataset.finished === "true" || !window.EventSource) return;
  const body = table.querySelector("tbody");
  let timer = null;
  const redraw = () => {
    clearTimeout(timer);
    timer = setTimeout(async () => {
      const fresh = await fetchPage();
      if (fresh) replaceById(fresh, ["run-status", "summary", "waits", "segments", "steps"]);
    }, 400);
  };
  const source = new EventSource(table.dataset.stream + "?after=" + encodeURIComponent(table.dataset.last));
  source.onmessage = (message) => {
    const row = JSON.parse(message.data);
    const tr = document.createElement("tr");
    tr.className = "fresh kind-" + String(row.kind).replace(/:/g, "-");
    for (const text of [fmt(row.at_ms), row.source, row.kind, row.summary]) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.appendChild(td);
    }
    tr.lastChild.className = "text";
    body.appendChild(tr);
    table.dataset.last = row.id;
    redraw();
  };
  source.addEventListener("end", () => {
    source.close();
    const live = document.getElementById("live");
    if (live) live.textContent = "the run has finished";
    const cancel = document.getElementById("cancel");
    if (cancel) cancel.closest("form").remove();
    redraw();
  });
})();
