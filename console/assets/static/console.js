// capstan console: live updates without a framework. A live region names a
// server-sent event stream (data-live) and the URL of its own HTML
// (data-part); on "changed" it fetches the part and patches in place.
// Elements are matched by id and replaced only when their data-v differs,
// so a comment being typed in one card survives another card's update. Countdowns tick locally.
"use strict";

(function () {
  // patchChildren makes oldBox's element children look like newBox's.
  // Elements are matched by id (or, without one, by position among those
  // without); a match is kept when unchanged (same data-v, or an equal node),
  // patched recursively when it holds versioned children, else replaced.
  function patchChildren(oldBox, newBox) {
    const byId = new Map(), plain = [];
    for (const el of Array.from(oldBox.children)) {
      if (el.id) byId.set(el.id, el); else plain.push(el);
    }
    let prev = null, p = 0;
    for (const el of Array.from(newBox.children)) {
      let old = el.id ? byId.get(el.id) : plain[p++];
      if (old && el.id) byId.delete(el.id);
      if (old && !el.id) plain[p - 1] = null;
      let keep = el;
      if (old) {
        if (el.dataset.v !== undefined) {
          keep = old.dataset.v === el.dataset.v ? old : el;
        } else if (old.isEqualNode(el)) {
          keep = old;
        } else if (el.querySelector("[data-v]") && old.tagName === el.tagName) {
          patchChildren(old, el);
          keep = old;
        }
        if (keep !== old) old.replaceWith(keep);
      }
      const at = prev ? prev.nextElementSibling : oldBox.firstElementChild;
      if (keep !== at) oldBox.insertBefore(keep, at);
      prev = keep;
    }
    for (const el of byId.values()) el.remove();
    for (const el of plain) if (el) el.remove();
  }

  function patch(region, html) {
    const tpl = document.createElement("template");
    tpl.innerHTML = html;
    patchChildren(region, tpl.content);
    tick();
  }

  // showProgress shows a handler's progress report in the region's
  // progress card, unless the card shows a later one already (the page as
  // rendered carries the record's, which may lag what came live).
  function showProgress(region, p) {
    const card = region.querySelector("#exec-progress");
    if (!card || !p) return;
    const shownAttempt = Number(card.dataset.attempt || 0), shownAt = Date.parse(card.dataset.at || "");
    if (p.attempt < shownAttempt || (p.attempt === shownAttempt && Date.parse(p.at) < shownAt)) return;
    card.dataset.attempt = String(p.attempt);
    card.dataset.at = p.at;
    const bar = card.querySelector("progress");
    if (p.total > 0) {
      bar.max = p.total;
      bar.value = Math.min(p.done, p.total);
    } else {
      bar.removeAttribute("value"); // not known: indeterminate
    }
    card.querySelector(".progress-text").textContent = p.text;
    const at = card.querySelector("time");
    at.setAttribute("datetime", p.at);
    at.textContent = p.atText;
    card.hidden = false;
  }

  function live(region) {
    let busy = false, again = false, src = null, progress = null;
    async function refresh() {
      if (busy) { again = true; return; }
      busy = true;
      try {
        const r = await fetch(region.dataset.part, { credentials: "same-origin", headers: { "Accept": "text/html" } });
        if (r.status === 401) { location.reload(); return; }
        if (r.ok) {
          patch(region, await r.text());
          showProgress(region, progress);
        }
      } finally {
        busy = false;
        if (again) { again = false; refresh(); }
      }
    }
    function connect() {
      src = new EventSource(region.dataset.live);
      src.addEventListener("changed", refresh);
      src.addEventListener("progress", (e) => {
        try { progress = JSON.parse(e.data); } catch (_) { return; }
        showProgress(region, progress);
      });
      src.addEventListener("open", () => document.body.classList.remove("offline"));
      src.addEventListener("error", () => document.body.classList.add("offline"));
      src.addEventListener("broken", () => { src.close(); setTimeout(connect, 2000); });
    }
    connect();
  }

  function fmt(ms) {
    const s = Math.max(0, Math.floor(ms / 1000));
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    const two = (n) => String(n).padStart(2, "0");
    return (h ? h + ":" + two(m) : m) + ":" + two(r);
  }

  function tick() {
    const now = Date.now();
    for (const t of document.querySelectorAll("time.countdown")) {
      const left = Date.parse(t.getAttribute("datetime")) - now;
      const card = t.closest(".approval");
      if (left <= 0) {
        t.textContent = "expired";
        t.classList.add("expired");
        if (card) for (const b of card.querySelectorAll("form button")) b.disabled = true;
      } else {
        t.textContent = "in " + fmt(left);
        t.classList.toggle("soon", left < 60000);
      }
    }
  }

  // Copy buttons copy an id whole.
  document.addEventListener("click", async (e) => {
    const b = e.target.closest("button[data-copy]");
    if (!b) return;
    try {
      await navigator.clipboard.writeText(b.dataset.copy);
      b.textContent = "Copied";
    } catch (_) {
      const sel = window.getSelection(), el = document.getElementById("exec-id");
      if (el) { const r = document.createRange(); r.selectNodeContents(el); sel.removeAllRanges(); sel.addRange(r); }
      b.textContent = "Selected: copy it";
    }
    setTimeout(() => { b.textContent = "Copy id"; }, 1500);
  });

  document.addEventListener("DOMContentLoaded", () => {
    for (const r of document.querySelectorAll("[data-live]")) live(r);
    tick();
    setInterval(tick, 1000);
    // Local times next to UTC stamps, once.
    for (const t of document.querySelectorAll("time[datetime]:not(.countdown)")) {
      if (!t.title) t.title = new Date(t.getAttribute("datetime")).toString();
    }
  });
})();
