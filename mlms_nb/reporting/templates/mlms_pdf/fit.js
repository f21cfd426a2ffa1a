/* mlms-nb: make every table fit the page width and write the table of contents.
   A table wider than the space it has is split into parts of whole columns, each repeating the key columns
   (pandas' index columns, else the first); a table that cannot be split (merged header cells) or a part still
   too wide is scaled down. Runs once, on load; window.__mlmsFit holds what it did and what still overflows. */
(function () {
  "use strict";

  function cellGrid(table) {
    const rows = [...table.rows];
    if (!rows.length) return null;
    const n = rows[0].cells.length;
    for (const row of rows) {
      if (row.cells.length !== n) return null;
      for (const cell of row.cells) if (cell.colSpan > 1 || cell.rowSpan > 1) return null;
    }
    return { rows, n };
  }

  function keyCount(table, grid) {
    const body = table.tBodies.length ? table.tBodies[0].rows : grid.rows;
    if (!body.length) return 1;
    let k = 0;
    for (const cell of body[0].cells) { if (cell.tagName === "TH" || cell.classList.contains("key")) k++; else break; }
    return Math.max(1, Math.min(k, grid.n - 1));
  }

  function splitTable(table, avail) {
    const grid = cellGrid(table);
    if (!grid || grid.n < 3) return 0;
    const keys = keyCount(table, grid);
    const widths = new Array(grid.n).fill(0);
    for (const row of grid.rows) [...row.cells].forEach((c, j) => { widths[j] = Math.max(widths[j], c.getBoundingClientRect().width); });
    const keyWidth = widths.slice(0, keys).reduce((a, b) => a + b, 0);
    const chunks = [];
    let cur = [], used = keyWidth;
    for (let j = keys; j < grid.n; j++) {
      if (cur.length && used + widths[j] > avail) { chunks.push(cur); cur = []; used = keyWidth; }
      cur.push(j); used += widths[j];
    }
    if (cur.length) chunks.push(cur);
    if (chunks.length < 2) return 0;
    let anchor = table;
    chunks.forEach((cols, i) => {
      const keep = new Set([...Array(keys).keys(), ...cols]);
      const part = table.cloneNode(true);
      for (const row of part.rows) for (let j = row.cells.length - 1; j >= 0; j--) if (!keep.has(j)) row.deleteCell(j);
      part.classList.add("mlms-split-part");
      anchor.after(part);
      anchor = part;
      if (i < chunks.length - 1) {
        const cont = document.createElement("p");
        cont.className = "mlms-table-cont";
        cont.innerHTML = "<small>(table continues: more columns below, key columns repeated)</small>";
        anchor.after(cont);
        anchor = cont;
      }
    });
    table.remove();
    return chunks.length;
  }

  function scale(el, avail) {
    const w = el.getBoundingClientRect().width;
    if (w > avail + 1) { el.style.zoom = String(Math.max(0.3, avail / w)); return true; }
    return false;
  }

  function available(el, right) {
    return right - el.getBoundingClientRect().left;
  }

  // an output shorter than a third of the page is kept whole on its page; a taller one may break across pages
  // (print.css): the page's content height comes from the exporter's @page rule (--mlms-page-height)
  function keepShort(main) {
    const page = parseFloat(getComputedStyle(document.documentElement).getPropertyValue("--mlms-page-height")) || 1000;
    let kept = 0;
    for (const child of main.querySelectorAll(".jp-OutputArea-child")) {
      if (child.getBoundingClientRect().height < page / 3) { child.classList.add("mlms-keep"); kept++; }
    }
    return kept;
  }

  function toc(main) {
    const headings = [...main.querySelectorAll("h1, h2, h3")].filter(h => !h.closest("nav.mlms-toc") && h.textContent.trim());
    const title = headings.find(h => h.tagName === "H1");
    const items = headings.filter(h => h !== title);
    if (items.length < 2) return 0;
    const nav = document.createElement("nav");
    nav.className = "mlms-toc";
    nav.innerHTML = '<p class="mlms-toc-title">Contents</p>';
    const list = document.createElement("ol");
    let sub = null, last = null;
    items.forEach((h, i) => {
      if (!h.id) h.id = "mlms-section-" + i;
      const li = document.createElement("li");
      li.className = "level-" + h.tagName.substring(1);
      const a = document.createElement("a");
      a.href = "#" + h.id;
      a.textContent = h.textContent.replace(/¶\s*$/, "").trim();
      li.appendChild(a);
      if (h.tagName === "H3" && last) {  // sub-sections nest under their section, unnumbered
        if (!sub) { sub = document.createElement("ul"); last.appendChild(sub); }
        sub.appendChild(li);
      } else {
        list.appendChild(li);
        last = li;
        sub = null;
      }
    });
    nav.appendChild(list);
    const host = title ? (title.closest(".jp-Cell") || title) : null;
    if (host) {
      // after the title's cell, and after the paragraph that follows the title in the same output
      host.after(nav);
    } else {
      main.prepend(nav);
    }
    return items.length;
  }

  function fit() {
    if (window.__mlmsFit) return window.__mlmsFit;
    if (document.documentElement.dataset.mlmsFitted) {  // a page saved after fitting: already done
      window.__mlmsFit = { split: 0, scaled: 0, toc: 0, overflow: [], saved: true };
      return window.__mlmsFit;
    }
    const main = document.querySelector("main") || document.body;
    const right = main.getBoundingClientRect().right;
    const report = { split: 0, scaled: 0, toc: 0, overflow: [], width: Math.round(main.getBoundingClientRect().width) };
    for (const td of main.querySelectorAll("td")) {  // prose may wrap at its spaces; numbers and names may not
      const text = td.textContent.trim();
      if (text.length > 40 && /\s/.test(text)) td.classList.add("mlms-prose");
    }
    for (const table of [...main.querySelectorAll("table")]) {
      if (table.parentElement && table.parentElement.closest("table")) continue;  // nested tables go with their parent
      const avail = available(table, right);
      if (table.getBoundingClientRect().width <= avail + 1) continue;
      const parts = splitTable(table, avail);
      if (parts) { report.split++; continue; }
      if (scale(table, avail)) report.scaled++;
    }
    for (const part of [...main.querySelectorAll("table.mlms-split-part")]) {
      if (scale(part, available(part, right))) report.scaled++;
    }
    for (const el of [...main.querySelectorAll(".jp-OutputArea-output > *, .jp-InputArea, img, svg, canvas")]) {
      if (el.getBoundingClientRect().width > available(el, right) + 1 && !el.closest("table")) {
        if (scale(el, available(el, right))) report.scaled++;
      }
    }
    report.toc = toc(main);
    report.kept = keepShort(main);
    for (const el of main.querySelectorAll("*")) {
      const r = el.getBoundingClientRect();
      if (r.width > 0 && r.right > right + 2 && !el.closest("nav.mlms-toc")) {
        const parentOver = el.parentElement && el.parentElement.getBoundingClientRect().right > right + 2;
        if (!parentOver) report.overflow.push(el.tagName.toLowerCase() + (el.className ? "." + String(el.className).split(" ")[0] : "") + " by " + Math.round(r.right - right) + " px");
      }
    }
    document.documentElement.dataset.mlmsFitted = "1";
    window.__mlmsFit = report;
    return report;
  }

  window.mlmsFit = fit;
  if (document.readyState === "complete") fit(); else window.addEventListener("load", fit);
})();
