// The replay page's script (ui/share/page.py puts it inline and allows it by its hash). It draws
// every piece of text with textContent, never as markup.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("replay-data").textContent);
  var root = document.getElementById("replay");
  var frames = data.frames;
  var last = frames.length - 1;
  var MARK = { anchor: "\u2693", accepted: "\u2713", rejected: "\u2717", unverified: "\u00b7", bonus: "\u2605" };
  var WORD = {
    anchor: "anchor: the last token already kept (the draft's slot 0)",
    accepted: "accepted: the target chose the same token",
    rejected: "rejected: the first mismatch; the target's own token replaces it",
    unverified: "discarded unverified: it came after a mismatch",
    bonus: "bonus: the target's own token, free with the verify pass"
  };
  var ORIGIN = { accepted: "accepted draft token", bonus: "the target's own token", rejected: "rejected draft token" };
  var shown = 0;
  var timer = null;

  function $(id) { return document.getElementById(id); }
  function node(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function visible(t) {
    if (t === null || t === undefined) { return "\u2013"; }
    if (t === "") { return "\u2205"; }
    return String(t).replace(/ /g, "\u2423").replace(/\n/g, "\u23ce").replace(/\t/g, "\u21e5");
  }
  function fixed(p, digits) { return (typeof p === "number") ? p.toFixed(digits) : ""; }

  function slotView(label, text, verdict, extra) {
    var box = node("div", "slot");
    box.dataset.verdict = verdict;
    box.appendChild(node("span", "n", label));
    box.appendChild(node("span", "t", visible(text)));
    box.appendChild(node("span", "m", MARK[verdict]));
    box.appendChild(node("span", "p", extra || ""));
    return box;
  }

  function drawBlock(f) {
    var view = $("rp-draftview"), slots = $("rp-slots"), cost = $("rp-cost");
    view.replaceChildren();
    slots.replaceChildren();
    if (f.i === 0) {
      view.appendChild(node("span", "muted", "No block yet: the target reads the prompt first (prefill)."));
      cost.textContent = "";
      return;
    }
    var anchor = node("span", "cell", visible(f.anchor));
    anchor.dataset.role = "anchor";
    anchor.title = "slot 0: the anchor, the last token kept";
    view.appendChild(anchor);
    for (var j = 1; j < f.b; j++) {
      var mask = node("span", "cell", "MASK");
      mask.dataset.role = "mask";
      mask.title = "slot " + j + ": a mask the draft fills";
      view.appendChild(mask);
    }
    var a = slotView("anchor", f.anchor, "anchor", "");
    a.title = WORD.anchor;
    slots.appendChild(a);
    f.slots.forEach(function (s, k) {
      var probs = (s[2] !== null ? "q " + fixed(s[2], 2) : "") + (s[3] !== null ? " \u00b7 p " + fixed(s[3], 2) : "");
      var box = slotView("slot " + (k + 1), s[0], s[1], probs);
      var lines = [WORD[s[1]] || s[1]];
      if (s[4] && s[4].length) {
        lines.push("the draft's top " + s[4].length + ": " + s[4].map(function (c) { return visible(c[0]) + " " + fixed(c[1], 3); }).join(", "));
      }
      if (s[3] !== null) { lines.push("the target's probability of this token: " + fixed(s[3], 3)); }
      box.title = lines.join("\n");
      slots.appendChild(box);
    });
    if (f.bonus !== null) {
      slots.appendChild(node("span", "sep", "\u2192"));
      var b = slotView("bonus @" + (f.a + 1), f.bonus, "bonus", "");
      b.title = WORD.bonus;
      slots.appendChild(b);
    }
    cost.textContent = "draft " + fixed(f.draft_ms, 1) + " ms \u00b7 verify " + fixed(f.verify_ms, 1) + " ms" +
      (f.cache ? " \u00b7 " + f.cache : "") + (f.fb ? " \u00b7 fallback: " + f.fb : "");
  }

  // An earlier cycle's rejected drafts are left out unless the box is ticked: the reply then reads
  // as the target wrote it (a rejected line break would break its lines); the cycle shown keeps its own.
  function drawText(k) {
    var box = $("rp-text");
    var allRejected = $("rp-show-rejected").checked;
    box.dataset.rejected = allRejected ? "all" : "current";
    var frag = document.createDocumentFragment();
    for (var f = 0; f <= k; f++) {
      frames[f].tok.forEach(function (t) {
        if (t[1] === "rejected" && f < k && !allRejected) { return; }
        var span = node("span", "tok", t[0]);
        span.dataset.origin = t[1];
        span.dataset.cycle = String(f);
        if (t[3]) { span.dataset.extra = "true"; }
        if (f === k && k > 0) { span.classList.add("now"); }
        span.title = (f === 0 ? "prefill" : "cycle " + f + ", slot " + t[2]) + ": " + ORIGIN[t[1]] +
          (t[3] ? " (text the reply has beyond its stored cycles)" : "");
        frag.appendChild(span);
      });
    }
    box.replaceChildren(frag);
    var now = box.querySelector(".tok.now");
    if (now && timer !== null) { box.scrollTop = box.scrollHeight; }
  }

  function drawChart(k) {
    var bars = document.querySelectorAll("#rp-chart .bar");
    for (var i = 0; i < bars.length; i++) {
      var n = Number(bars[i].dataset.i);
      bars[i].classList.toggle("now", n === k);
      bars[i].classList.toggle("later", n > k);
    }
  }

  function drawSpeed(f, k) {
    var out = $("rp-speed-now");
    if (k === 0) {
      out.textContent = "1 token so far, from the prefill pass (plain decoding starts the same way).";
      return;
    }
    var words = f.n + " tokens so far from " + k + " DFlash cycle" + (k === 1 ? "" : "s") +
      " (one target pass each); plain decoding needs " + (f.n - 1) + " target passes after the prefill for them.";
    if (f.speed !== null) { words += " Speed so far: " + f.speed.toFixed(2) + "\u00d7 plain decoding."; }
    out.textContent = words;
  }

  function go(k) {
    k = Math.max(0, Math.min(last, Number(k) || 0));
    shown = k;
    var f = frames[k];
    root.dataset.cycle = String(k);
    $("rp-slider").value = String(k);
    $("rp-where").textContent = k === 0 ? "prefill \u00b7 0 of " + last : "cycle " + k + " of " + last;
    $("rp-caption").textContent = f.cap;
    drawBlock(f);
    drawText(k);
    drawChart(k);
    drawSpeed(f, k);
  }

  function pause() {
    if (timer !== null) { clearInterval(timer); timer = null; }
    root.dataset.playing = "false";
    $("rp-play").textContent = "\u25b6 Play";
  }
  function play() {
    if (last === 0) { return; }
    if (shown >= last) { go(0); }
    var rate = Number($("rp-speed").value) || 2;
    timer = setInterval(function () {
      if (shown >= last) { pause(); return; }
      go(shown + 1);
      if (shown >= last) { pause(); }
    }, 1000 / rate);
    root.dataset.playing = "true";
    $("rp-play").textContent = "\u275a\u275a Pause";
  }
  function toggle() { if (timer !== null) { pause(); } else { play(); } }
  function step(k) { pause(); go(k); }

  $("rp-home").addEventListener("click", function () { step(0); });
  $("rp-prev").addEventListener("click", function () { step(shown - 1); });
  $("rp-next").addEventListener("click", function () { step(shown + 1); });
  $("rp-end").addEventListener("click", function () { step(last); });
  $("rp-play").addEventListener("click", toggle);
  $("rp-slider").addEventListener("input", function (e) { step(e.target.value); });
  $("rp-speed").addEventListener("change", function () { if (timer !== null) { pause(); play(); } });
  $("rp-show-rejected").addEventListener("change", function () { drawText(shown); });

  document.addEventListener("keydown", function (e) {
    if (e.altKey || e.ctrlKey || e.metaKey || e.defaultPrevented) { return; }
    var t = e.target, tag = t && t.tagName;
    var onBox = tag === "INPUT" && t.type === "checkbox";
    if (tag === "SELECT" || tag === "TEXTAREA" || (tag === "INPUT" && t.type !== "range" && !onBox)) { return; }
    var onSlider = tag === "INPUT" && !onBox;  // a range slider moves itself one cycle on arrows, Home and End
    var key = e.key;
    if (key === " " || key === "Spacebar") {
      if (tag === "BUTTON" || onBox) { return; }  // space presses the focused button, ticks the focused box
      toggle();
    } else if (onSlider) {
      return;
    } else if (key === "ArrowRight") { step(shown + 1);
    } else if (key === "ArrowLeft") { step(shown - 1);
    } else if (key === "Home") { step(0);
    } else if (key === "End") { step(last);
    } else { return; }
    e.preventDefault();
  });

  var THEMES = ["auto", "light", "dark"];
  $("rp-theme").addEventListener("click", function () {
    var html = document.documentElement;
    var next = THEMES[(THEMES.indexOf(html.dataset.theme || "auto") + 1) % THEMES.length];
    if (next === "auto") { delete html.dataset.theme; } else { html.dataset.theme = next; }
    this.textContent = "\u25d0 theme: " + next;
  });

  function setUpRace(race) {
    var section = $("rp-race");
    var names = ["plain", "dflash"];
    var end = 0;  // the later lane's last step: at the end both lanes show every token
    names.forEach(function (name) {
      var steps = race[name].steps;
      if (steps.length) { end = Math.max(end, steps[steps.length - 1][0]); }
    });
    var clock = 0, raf = null, wallStart = 0, clockStart = 0;
    var slider = $("race-slider");
    var totals = {};
    names.forEach(function (name) {
      var steps = race[name].steps;
      totals[name] = steps.length ? steps[steps.length - 1][1] : 0;
    });
    function drawLane(name, t) {
      var lane = $("race-" + name), steps = race[name].steps;
      var pre = lane.querySelector(".lane-text");
      var frag = document.createDocumentFragment(), tokens = 0;
      for (var i = 0; i < steps.length && steps[i][0] <= t; i++) {
        frag.appendChild(node("span", "chunk", steps[i][2]));
        tokens = steps[i][1];
      }
      pre.replaceChildren(frag);
      pre.scrollTop = pre.scrollHeight;
      lane.querySelector(".lane-count").textContent = tokens + " of " + totals[name] + " tokens";
      lane.querySelector(".lane-fill").style.width = (totals[name] ? 100 * tokens / totals[name] : 0) + "%";
      lane.dataset.done = String(steps.length > 0 && t >= steps[steps.length - 1][0]);
    }
    function draw(t) {
      clock = Math.max(0, Math.min(end, t));
      names.forEach(function (name) { drawLane(name, clock); });
      $("race-clock").textContent = (clock / 1000).toFixed(2) + " s";
      slider.value = String(end > 0 ? Math.round(1000 * clock / end) : 1000);
      section.dataset.raceMs = String(Math.round(clock));
      section.dataset.raceState = clock >= end ? "finished" : (raf !== null ? "running" : (clock > 0 ? "paused" : "ready"));
    }
    function stop() {
      if (raf !== null) { cancelAnimationFrame(raf); raf = null; }
      $("race-play").textContent = "\u25b6 Start race";
      draw(clock);
    }
    function tick(now) {
      var pace = Number($("race-pace").value) || 1;
      var t = clockStart + (now - wallStart) * pace;
      if (t >= end) { raf = null; draw(end); stop(); return; }
      raf = requestAnimationFrame(tick);
      draw(t);
    }
    $("race-play").addEventListener("click", function () {
      if (raf !== null) { stop(); return; }
      if (clock >= end) { clock = 0; }
      wallStart = performance.now();
      clockStart = clock;
      $("race-play").textContent = "\u275a\u275a Pause race";
      raf = requestAnimationFrame(tick);
      draw(clock);
    });
    $("race-reset").addEventListener("click", function () { stop(); draw(0); });
    $("race-end").addEventListener("click", function () { stop(); draw(end); });
    $("race-pace").addEventListener("change", function () {
      if (raf !== null) { clockStart = clock; wallStart = performance.now(); }
    });
    slider.addEventListener("input", function () {
      var t = end * Number(slider.value) / 1000;  // read before stop() redraws the slider at the old clock
      stop();
      draw(t);
    });
    draw(0);
  }

  if (data.race) { setUpRace(data.race); }
  go(0);
})();
