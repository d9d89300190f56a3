// The live page of perseus-server: the jobs it holds and, for one job, what it knows of it.
//
// Read-only: it only GETs the server's /live/ JSON, every POLL_MS, without reloading. Every
// string that comes from a job (ids, names, messages) is put on the page as text
// (textContent, SVG text nodes), never as markup. The server's token, where it has one, is
// asked for once, kept in this tab's sessionStorage and sent in the Authorization header,
// never in a URL. Charts are drawn with SVG here (no library); a job is drawn by stages,
// never by ranks, and the server bounds what one view holds.
"use strict";

(function () {
  const TOKEN_KEY = "perseus-live-token";
  const POLL_MS = 2000;
  const PAGE = 50;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const W = 520;
  const H = 240;
  const M = { left: 56, right: 12, top: 10, bottom: 34 };
  const ARM_COLORS = { baseline: "#b42318", plan: "#157f3b", profiling: "#b54708" };
  const GPU_COLORS = ["#1f5fbf", "#b42318", "#157f3b", "#b54708", "#6941c6", "#0e7090",
    "#c11574", "#475467"];

  const state = { offset: 0, phase: null, q: "", timer: null, tokenRequired: null };

  class NeedToken extends Error {}

  // -- DOM helpers (text only) ----------------------------------------------------------------
  function $(id) { return document.getElementById(id); }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function svgEl(tag, attrs, text) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

  function status(text) { $("status").textContent = text; }

  // -- formatting -----------------------------------------------------------------------------
  function num(x, digits) { return x === null || x === undefined ? "—" : Number(x).toFixed(digits); }
  function pct(x) { return x === null || x === undefined ? "—" : (100 * x).toFixed(1) + " %"; }

  function interval(iv) {
    if (!iv) return "—";
    const bounds = iv.lower !== null && iv.upper !== null ? pct(iv.lower) + " to " + pct(iv.upper) : null;
    if (!iv.measurable && iv.value === null) {
      return bounds ? "not measurable (" + bounds + ")" : "not measurable";
    }
    return bounds ? pct(iv.value) + " (" + bounds + ")" : pct(iv.value);
  }

  function progress(job) {
    if (job.kind !== "pipeline") return job.phase;
    if (job.phase === "profiling" && job.profiling_max_steps) {
      return "profiling " + (job.profiling_steps || 0) + " of " + job.profiling_max_steps;
    }
    return { baseline: "measuring max speed", planning: "planning", running: "measuring the plan",
      watching: "plan measured", failed: "failed" }[job.phase] || job.phase;
  }

  function planInUse(job) {
    if (job.plan_id === null || job.plan_id === undefined) return "—";
    let text = "plan " + job.plan_id + " (" + (job.plan_reason || "chosen") + ")";
    if (job.plan_since_step !== null) text += " since step " + job.plan_since_step;
    return text;
  }

  // -- the server -----------------------------------------------------------------------------
  async function api(path, params) {
    const url = new URL(path, window.location.origin);
    for (const [k, v] of Object.entries(params || {})) {
      if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, String(v));
    }
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    const answer = await fetch(url, { headers, cache: "no-store", credentials: "omit" });
    if (answer.status === 401) throw new NeedToken("the token was refused");
    if (!answer.ok) {
      let detail = answer.statusText;
      try { detail = (await answer.json()).detail || detail; } catch (e) { /* not JSON */ }
      throw new Error(String(detail));
    }
    return answer.json();
  }

  async function tokenRequired() {
    if (state.tokenRequired === null) {
      const found = await api("/live/auth");
      state.tokenRequired = Boolean(found.token_required);
    }
    return state.tokenRequired;
  }

  function showToken(why) {
    $("token-why").textContent = why;
    $("token-view").hidden = false;
    $("list-view").hidden = true;
    $("job-view").hidden = true;
    $("token-input").focus();
  }

  // -- routing and polling --------------------------------------------------------------------
  function route() {
    const hash = window.location.hash;
    if (hash.startsWith("#job=")) return { key: decodeURIComponent(hash.slice(5)) };
    return { key: null };
  }

  async function refresh() {
    window.clearTimeout(state.timer);
    try {
      if ((await tokenRequired()) && !sessionStorage.getItem(TOKEN_KEY)) {
        showToken("This server needs its token (server.token).");
        return;
      }
      $("token-view").hidden = true;
      $("forget-token").hidden = !sessionStorage.getItem(TOKEN_KEY);
      const where = route();
      if (where.key === null) await showList(); else await showJob(where.key);
      status("updated " + new Date().toLocaleTimeString());
    } catch (e) {
      if (e instanceof NeedToken) {
        sessionStorage.removeItem(TOKEN_KEY);
        showToken("The server refused the token: enter it again.");
        return;
      }
      status("cannot reach the server: " + e.message + " (retrying)");
    }
    state.timer = window.setTimeout(refresh, POLL_MS);
  }

  // -- the job list ---------------------------------------------------------------------------
  async function showList() {
    const page = await api("/live/jobs", { offset: state.offset, limit: PAGE, phase: state.phase, q: state.q });
    $("job-view").hidden = true;
    $("list-view").hidden = false;
    drawPhaseFilter(page.phases);
    const body = $("jobs").tBodies[0];
    clear(body);
    for (const job of page.jobs) {
      const row = el("tr");
      row.dataset.key = job.key;
      row.appendChild(el("td", job.job_id, "id"));
      row.appendChild(el("td", job.kind));
      const phase = el("td");
      phase.appendChild(el("span", job.phase, "phase " + job.phase));
      row.appendChild(phase);
      const prog = el("td");
      if (job.profiling_progress !== null && job.kind === "pipeline") {
        const bar = el("span", null, "bar");
        const fill = el("span");
        fill.style.width = Math.round(100 * job.profiling_progress) + "%";
        bar.appendChild(fill);
        prog.appendChild(bar);
      }
      prog.appendChild(document.createTextNode(progress(job)));
      row.appendChild(prog);
      row.appendChild(el("td", planInUse(job)));
      row.appendChild(el("td", interval(job.energy_saving), "saving"));
      row.appendChild(el("td", interval(job.predicted_saving)));
      row.appendChild(el("td", job.message ? job.message.slice(0, 160) : ""));
      row.addEventListener("click", () => {
        window.location.hash = "job=" + encodeURIComponent(job.key);
      });
      body.appendChild(row);
    }
    const last = Math.min(page.offset + page.jobs.length, page.total);
    $("page-info").textContent = page.total ? (page.offset + 1) + "–" + last + " of " + page.total : "no jobs";
    $("prev").disabled = page.offset <= 0;
    $("next").disabled = last >= page.total;
  }

  function drawPhaseFilter(phases) {
    const box = $("phase-filter");
    clear(box);
    const all = Object.values(phases).reduce((a, b) => a + b, 0);
    const chips = [[null, "all", all]].concat(Object.entries(phases).sort().map(([p, n]) => [p, p, n]));
    for (const [phase, label, count] of chips) {
      const b = el("button", label + " " + count);
      b.type = "button";
      if (phase === state.phase) b.className = "on";
      b.addEventListener("click", () => { state.phase = phase; state.offset = 0; refresh(); });
      box.appendChild(b);
    }
  }

  // -- one job --------------------------------------------------------------------------------
  async function showJob(key) {
    const found = await api("/live/job", { key });
    const job = found.job;
    const detail = found.detail;
    $("list-view").hidden = true;
    $("job-view").hidden = false;
    $("job-title").textContent = job.job_id;
    drawFacts(job);
    drawPhases(detail.phases);
    const message = $("job-message");
    message.hidden = !job.message;
    message.textContent = job.message || "";
    // A pipeline job draws all of it; a job without a server what it has.
    const pipeline = job.kind === "pipeline";
    $("saving-fig").hidden = !pipeline;
    $("frontier-fig").hidden = !pipeline;
    $("timeline-fig").hidden = !pipeline;
    $("power-fig").hidden = !pipeline && !Object.keys(detail.power || {}).length;
    $("time-fig").hidden = !pipeline && !(detail.steps || []).length;
    $("energy-fig").hidden = $("time-fig").hidden;
    drawSaving($("saving-fig"), detail.savings, job);
    drawFrontier($("frontier-fig"), detail.frontier);
    drawTimeline($("timeline-fig"), detail.timeline, detail.timeline_plan_id);
    drawPower($("power-fig"), detail.power);
    drawArms($("time-fig"), detail.steps, job.arms, "iteration_time_s", "s");
    drawArms($("energy-fig"), detail.steps, job.arms, "energy_j", "J");
    drawOptimizer($("optimizer-fig"), job.optimizer);
  }

  function drawFacts(job) {
    const facts = $("job-facts");
    clear(facts);
    const ranks = Object.entries(job.ranks || {}).filter(([, n]) => n).map(([s, n]) => n + " " + s).join(", ");
    const rows = [
      ["kind", job.kind], ["phase", job.phase], ["progress", progress(job)],
      ["newest iteration", job.step], ["stages", job.num_stages || "—"], ["ranks", ranks || "—"],
      ["plan in use", planInUse(job)],
      ["measured saving", interval(job.energy_saving)], ["slowdown", interval(job.slowdown)],
      ["predicted saving", interval(job.predicted_saving)],
      ["energy saved so far", job.energy_saved_j ? joules(job.energy_saved_j) : "—"],
    ];
    for (const arm of job.arms || []) {
      rows.push([arm.arm + " iteration", num(arm.iteration_time_s, 3) + " s, " + num(arm.energy_j, 1) + " J (" + arm.num_steps + " iterations)"]);
    }
    for (const [k, v] of rows) {
      facts.appendChild(el("dt", k));
      const dd = el("dd", v === null || v === undefined ? "—" : v);
      dd.dataset.fact = k;
      facts.appendChild(dd);
    }
  }

  function joules(iv) {
    const b = iv.lower !== null ? " (" + num(iv.lower, 0) + " to " + num(iv.upper, 0) + " J)" : "";
    return (iv.value === null ? "not measurable" : num(iv.value, 0) + " J") + b;
  }

  function drawPhases(phases) {
    const list = $("job-phases");
    clear(list);
    for (const p of phases || []) {
      const step = p.step === null ? "" : " from step " + p.step;
      const item = el("li", p.phase + step + ", " + new Date(p.time_s * 1000).toLocaleTimeString());
      if (p.why) item.title = p.why;
      list.appendChild(item);
    }
  }

  // -- charts ---------------------------------------------------------------------------------
  function chartOf(figure) { const c = figure.querySelector(".chart"); clear(c); return c; }

  function empty(chart, text) { chart.appendChild(el("div", text, "empty")); }

  function linear(d0, d1, r0, r1) {
    const span = d1 - d0 || Math.abs(d0) || 1;
    return (x) => r0 + ((x - d0) / span) * (r1 - r0);
  }

  function extent(values, pad) {
    let lo = Math.min(...values);
    let hi = Math.max(...values);
    if (!isFinite(lo) || !isFinite(hi)) { lo = 0; hi = 1; }
    if (lo === hi) { lo -= Math.abs(lo) * 0.05 || 0.5; hi += Math.abs(hi) * 0.05 || 0.5; }
    const p = (hi - lo) * (pad || 0.05);
    return [lo - p, hi + p];
  }

  function frame(chart, xs, ys, labels, fmt) {
    const svg = svgEl("svg", { viewBox: "0 0 " + W + " " + H, role: "img" });
    const x = linear(xs[0], xs[1], M.left, W - M.right);
    const y = linear(ys[0], ys[1], H - M.bottom, M.top);
    for (let i = 0; i <= 4; i++) {
      const vx = xs[0] + ((xs[1] - xs[0]) * i) / 4;
      const vy = ys[0] + ((ys[1] - ys[0]) * i) / 4;
      svg.appendChild(svgEl("line", { class: "grid-line", x1: M.left, x2: W - M.right, y1: y(vy), y2: y(vy) }));
      svg.appendChild(svgEl("text", { x: x(vx), y: H - M.bottom + 14, "text-anchor": "middle" }, fmt[0](vx)));
      svg.appendChild(svgEl("text", { x: M.left - 4, y: y(vy) + 3, "text-anchor": "end" }, fmt[1](vy)));
    }
    svg.appendChild(svgEl("line", { class: "axis", x1: M.left, x2: W - M.right, y1: H - M.bottom, y2: H - M.bottom }));
    svg.appendChild(svgEl("line", { class: "axis", x1: M.left, x2: M.left, y1: M.top, y2: H - M.bottom }));
    svg.appendChild(svgEl("text", { x: (M.left + W - M.right) / 2, y: H - 4, "text-anchor": "middle" }, labels[0]));
    svg.appendChild(svgEl("text", { x: 10, y: M.top + 8, "text-anchor": "start" }, labels[1]));
    chart.appendChild(svg);
    return { svg, x, y };
  }

  function fixed(d) { return (v) => Number(v).toFixed(d); }

  function drawFrontier(figure, plans) {
    const chart = chartOf(figure);
    if (!plans || !plans.length) { empty(chart, "no plans yet (the job is not planned)"); return; }
    const xs = extent(plans.map((p) => p.iteration_time_s));
    const ys = extent(plans.map((p) => p.energy_j));
    const f = frame(chart, xs, ys, ["iteration time (s)", "energy (J)"], [fixed(3), fixed(0)]);
    f.svg.dataset.numPlans = String(plans.length);
    const pts = plans.map((p) => f.x(p.iteration_time_s) + "," + f.y(p.energy_j)).join(" ");
    f.svg.appendChild(svgEl("polyline", { class: "frontier-line", points: pts }));
    for (const p of plans) {
      const cls = "plan" + (p.chosen ? " chosen" : "") + (p.is_allmax ? " allmax" : "");
      const cx = f.x(p.iteration_time_s);
      const cy = f.y(p.energy_j);
      const mark = p.is_allmax
        ? svgEl("rect", { class: cls, x: cx - 5, y: cy - 5, width: 10, height: 10, transform: "rotate(45 " + cx + " " + cy + ")" })
        : svgEl("circle", { class: cls, cx, cy, r: p.chosen ? 6 : 2.5 });
      mark.dataset.planId = String(p.plan_id);
      mark.appendChild(svgEl("title", {}, "plan " + p.plan_id + ": " + num(p.iteration_time_s, 4) + " s, " + num(p.energy_j, 1) + " J"));
      f.svg.appendChild(mark);
      if (p.in_force) f.svg.appendChild(svgEl("circle", { class: "plan in-force", cx, cy, r: 9 }));
      if (p.chosen || p.is_allmax) {
        f.svg.appendChild(svgEl("text", { x: cx + 8, y: cy - 8 }, p.is_allmax ? "max speed" : "chosen"));
      }
    }
  }

  function clockColor(mhz, lo, hi) {
    const t = hi > lo ? (mhz - lo) / (hi - lo) : 1;
    const r = Math.round(31 + t * (212 - 31));
    const g = Math.round(95 + t * (112 - 95));
    const b = Math.round(191 - t * (191 - 24));
    return "rgb(" + r + "," + g + "," + b + ")";
  }

  function drawTimeline(figure, stages, planId) {
    const chart = chartOf(figure);
    if (!stages || !stages.length) { empty(chart, "no plan in force yet"); return; }
    const all = stages.flat();
    const end = Math.max(...all.map((b) => b.end_s), 1e-9);
    const clocks = all.map((b) => b.frequency_mhz);
    const lo = Math.min(...clocks);
    const hi = Math.max(...clocks);
    const rowH = Math.max(1, Math.min(24, (H - M.top - M.bottom) / stages.length));
    const height = M.top + M.bottom + rowH * stages.length;
    const svg = svgEl("svg", { viewBox: "0 0 " + W + " " + height, role: "img" });
    svg.dataset.numStages = String(stages.length);
    svg.dataset.planId = String(planId);
    const x = linear(0, end, M.left, W - M.right);
    stages.forEach((boxes, s) => {
      const g = svgEl("g", { class: "stage" });
      g.dataset.stage = String(s);
      const y = M.top + s * rowH;
      if (rowH >= 8) g.appendChild(svgEl("text", { x: M.left - 4, y: y + rowH / 2 + 3, "text-anchor": "end" }, "stage " + s));
      for (const b of boxes) {
        const r = svgEl("rect", {
          x: x(b.start_s), y: y + 1, width: Math.max(0.5, x(b.end_s) - x(b.start_s)),
          height: Math.max(0.5, rowH - 2), fill: clockColor(b.frequency_mhz, lo, hi),
        });
        r.appendChild(svgEl("title", {}, b.kind + b.microbatch + " at " + b.frequency_mhz + " MHz"));
        g.appendChild(r);
      }
      svg.appendChild(g);
    });
    svg.appendChild(svgEl("text", { x: M.left, y: height - 18 }, "0 s"));
    svg.appendChild(svgEl("text", { x: W - M.right, y: height - 18, "text-anchor": "end" }, num(end, 3) + " s"));
    svg.appendChild(svgEl("text", { x: (M.left + W) / 2, y: height - 4, "text-anchor": "middle" },
      "plan " + planId + ": SM clock " + lo + " MHz (blue) to " + hi + " MHz (orange)"));
    chart.appendChild(svg);
  }

  function drawPower(figure, power) {
    const chart = chartOf(figure);
    const series = Object.entries(power || {}).filter(([, pts]) => pts.length);
    if (!series.length) { empty(chart, "no power readings yet"); return; }
    const now = Math.max(...series.map(([, pts]) => pts[pts.length - 1][0]));
    const xs = extent(series.flatMap(([, pts]) => pts.map((p) => p[0] - now)), 0);
    const ys = extent(series.flatMap(([, pts]) => pts.map((p) => p[1])).concat([0]));
    const f = frame(chart, xs, ys, ["seconds ago", "W"], [(v) => Math.max(0, Math.round(-v)), fixed(0)]);
    f.svg.dataset.numGpus = String(series.length);
    series.forEach(([gpu, pts], i) => {
      const color = GPU_COLORS[i % GPU_COLORS.length];
      const line = svgEl("polyline", { fill: "none", stroke: color, "stroke-width": 1.5,
        points: pts.map((p) => f.x(p[0] - now) + "," + f.y(p[1])).join(" ") });
      line.appendChild(svgEl("title", {}, gpu));
      f.svg.appendChild(line);
    });
    const legend = el("div", null, "legend");
    series.slice(0, 16).forEach(([gpu], i) => {
      const item = el("span");
      const sw = el("span", null, "swatch");
      sw.style.background = GPU_COLORS[i % GPU_COLORS.length];
      item.appendChild(sw);
      item.appendChild(document.createTextNode(gpu));
      legend.appendChild(item);
    });
    chart.appendChild(legend);
  }

  function drawArms(figure, steps, arms, key, unit) {
    const chart = chartOf(figure);
    const points = (steps || []).filter((s) => s[key] !== null && s[key] !== undefined);
    if (!points.length) { empty(chart, "no iterations yet"); return; }
    const xs = extent(points.map((s) => s.step));
    const ys = extent(points.map((s) => s[key]));
    const f = frame(chart, xs, ys, ["iteration", unit], [fixed(0), fixed(unit === "s" ? 3 : 0)]);
    for (const s of points) {
      const c = svgEl("circle", { cx: f.x(s.step), cy: f.y(s[key]), r: 2, fill: ARM_COLORS[s.arm] || "#98a2b3" });
      c.appendChild(svgEl("title", {}, "step " + s.step + " (" + s.arm + "): " + s[key]));
      f.svg.appendChild(c);
    }
    for (const arm of arms || []) {
      const v = arm[key];
      if (v === null || v === undefined) continue;
      f.svg.appendChild(svgEl("line", { x1: M.left, x2: W - M.right, y1: f.y(v), y2: f.y(v),
        stroke: ARM_COLORS[arm.arm] || "#98a2b3", "stroke-dasharray": "4 3" }));
    }
    const legend = el("div", null, "legend");
    for (const [arm, color] of Object.entries(ARM_COLORS)) {
      const item = el("span");
      const sw = el("span", null, "swatch");
      sw.style.background = color;
      item.appendChild(sw);
      item.appendChild(document.createTextNode(arm === "baseline" ? "max speed (baseline)" : arm));
      legend.appendChild(item);
    }
    legend.appendChild(el("span", "dashed: each arm's typical iteration"));
    chart.appendChild(legend);
  }

  function drawSaving(figure, savings, job) {
    const chart = chartOf(figure);
    const predicted = job.predicted_saving;
    if (!savings || !savings.length) {
      chart.dataset.measured = "no";
      empty(chart, "not measured yet" + (predicted ? "; predicted " + interval(predicted) : ""));
      return;
    }
    chart.dataset.measured = "yes";
    const values = savings.flatMap((s) => [s.energy_saving.lower, s.energy_saving.upper]).concat([0]);
    if (predicted && predicted.lower !== null) values.push(predicted.lower, predicted.upper);
    const xs = [0, Math.max(...savings.map((s) => s.num_pairs)) + 1];
    const ys = extent(values.filter((v) => v !== null));
    const f = frame(chart, xs, ys, ["block pairs measured", "saving"], [fixed(0), (v) => (100 * v).toFixed(1) + "%"]);
    if (predicted && predicted.lower !== null && predicted.upper !== null) {
      f.svg.appendChild(svgEl("rect", { class: "predicted-band", x: M.left, width: W - M.right - M.left,
        y: f.y(predicted.upper), height: Math.max(1, f.y(predicted.lower) - f.y(predicted.upper)) }));
    }
    if (predicted && predicted.value !== null) {
      f.svg.appendChild(svgEl("line", { class: "predicted-line", x1: M.left, x2: W - M.right, y1: f.y(predicted.value), y2: f.y(predicted.value) }));
      f.svg.appendChild(svgEl("text", { x: W - M.right - 4, y: f.y(predicted.value) - 4, "text-anchor": "end" }, "predicted " + pct(predicted.value)));
    }
    f.svg.appendChild(svgEl("line", { class: "zero", x1: M.left, x2: W - M.right, y1: f.y(0), y2: f.y(0) }));
    for (const s of savings) {
      const iv = s.energy_saving;
      const cx = f.x(s.num_pairs);
      const g = svgEl("g", { class: "saving-point" });
      g.appendChild(svgEl("line", { class: "ci", x1: cx, x2: cx, y1: f.y(iv.lower), y2: f.y(iv.upper) }));
      const mid = iv.value !== null ? iv.value : (iv.lower + iv.upper) / 2;
      g.appendChild(svgEl("circle", { cx, cy: f.y(mid), r: 4, fill: iv.measurable ? "#1f5fbf" : "#fff", stroke: "#1f5fbf" }));
      g.appendChild(svgEl("title", {}, s.num_pairs + " pairs: " + interval(iv)));
      f.svg.appendChild(g);
    }
    const last = savings[savings.length - 1];
    chart.appendChild(el("div", "now: " + interval(last.energy_saving) + "; slowdown " + interval(last.slowdown), "legend"));
  }

  function drawOptimizer(figure, optimizer) {
    figure.hidden = !optimizer;
    if (!optimizer) return;
    const chart = chartOf(figure);
    chart.appendChild(el("p", optimizer.kind + ": " + optimizer.state + (optimizer.note ? " — " + optimizer.note : ""), "note"));
    if (optimizer.saving) chart.appendChild(el("p", "saving of the choice: " + interval(optimizer.saving), "note"));
    const table = el("table");
    const head = el("tr");
    for (const h of ["choice", "time", "energy (J)", "cost (J)", "measured", "chosen"]) head.appendChild(el("th", h));
    table.appendChild(head);
    for (const c of optimizer.choices) {
      const row = el("tr");
      row.appendChild(el("td", c.label));
      row.appendChild(el("td", num(c.time_s, 3) + " s"));
      row.appendChild(el("td", num(c.energy_j, 1)));
      row.appendChild(el("td", num(c.cost, 1)));
      row.appendChild(el("td", c.runs));
      row.appendChild(el("td", c.chosen ? "✓" : ""));
      table.appendChild(row);
    }
    chart.appendChild(table);
  }

  // -- wiring ---------------------------------------------------------------------------------
  function start() {
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const value = $("token-input").value.trim();
      $("token-input").value = "";
      if (value) sessionStorage.setItem(TOKEN_KEY, value);
      refresh();
    });
    $("forget-token").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); refresh(); });
    $("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); refresh(); });
    $("next").addEventListener("click", () => { state.offset += PAGE; refresh(); });
    let typing = null;
    $("search").addEventListener("input", (event) => {
      window.clearTimeout(typing);
      typing = window.setTimeout(() => { state.q = event.target.value; state.offset = 0; refresh(); }, 300);
    });
    for (const link of document.querySelectorAll(".back, #home")) {
      link.addEventListener("click", (event) => { event.preventDefault(); window.location.hash = ""; refresh(); });
    }
    window.addEventListener("hashchange", refresh);
    refresh();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
