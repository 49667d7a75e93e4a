/* bertrain report: draws the curves of the runs in #report-data with uPlot (every run on the same axes). */
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("report-data").textContent);
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
                  "#7f7f7f", "#bcbd22"];
  const MARKS = {  // how each mark on the curves is drawn (the run's section lists them in words)
    resume: {color: "#d62728", width: 2, dash: [], label: "resume"},
    stop: {color: "#ff7f0e", width: 2, dash: [2, 3], label: "stop"},
    checkpoint: {color: "#999999", width: 1, dash: [3, 3], label: ""},
    nonfinite: {color: "#e377c2", width: 2, dash: [], label: "non-finite"},
  };
  const CHARTS = [  // [title, [records, key]...]: a key with a "_smooth" column is drawn raw (faint) and smoothed;
    // validation curves are dashed
    ["MLM loss: training, validation (dashed)", [["train", "mlm_loss"], ["eval", "mlm_loss"]]],
    ["Sentence (NSP/SOP) loss: training, validation (dashed)", [["train", "sentence_loss"], ["eval", "sentence_loss"]]],
    ["Validation accuracy: MLM, sentence (dashed)", [["eval", "mlm_accuracy"], ["eval", "sentence_accuracy"]]],
    ["Learning rate", [["train", "lr"]]],
    ["Gradient norm (before clipping)", [["train", "grad_norm"]]],
    ["Training tokens / s", [["train", "tokens_per_s"]]],
  ];
  const SI = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];

  function short(value) {
    if (value == null) return "";
    for (const [size, suffix] of SI) if (Math.abs(value) >= size) return +(value / size).toPrecision(3) + suffix;
    return Math.abs(value) < 1e-2 && value !== 0 ? value.toExponential(1) : +value.toPrecision(3) + "";
  }

  function align(tables) {  // [[xs, ys], ...] → uPlot's columns: the sorted union of x, one y column per table
    const xs = Array.from(new Set(tables.flatMap(t => t[0]))).sort((a, b) => a - b);
    const at = new Map(xs.map((x, i) => [x, i]));
    return [xs].concat(tables.map(([tx, ty]) => {
      const column = new Array(xs.length).fill(null);
      tx.forEach((x, i) => { column[at.get(x)] = ty[i]; });
      return column;
    }));
  }

  function marksPlugin(xKey) {
    return {hooks: {draw: [u => {
      const ctx = u.ctx, {left, top, width, height} = u.bbox, dpr = window.devicePixelRatio || 1;
      ctx.save();
      ctx.font = `${11 * dpr}px sans-serif`;
      DATA.runs.forEach(run => run.marks.forEach(mark => {
        const style = MARKS[mark.kind], value = mark[xKey];
        if (!style || value == null) return;
        const x = Math.round(u.valToPos(value, "x", true));
        if (x < left || x > left + width) return;
        ctx.strokeStyle = ctx.fillStyle = style.color;
        ctx.lineWidth = style.width * dpr;
        ctx.setLineDash(style.dash.map(d => d * dpr));
        ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
        if (style.label) ctx.fillText(style.label, x + 3 * dpr, top + 12 * dpr);
      }));
      ctx.restore();
    }]}};
  }

  function chart(title, curves, xKey, box) {
    const tables = [], series = [{label: xKey === "step" ? "step" : "tokens seen", value: (u, v) => short(v)}];
    DATA.runs.forEach((run, r) => {
      const color = COLORS[r % COLORS.length];
      curves.forEach(([source, key], k) => {
        const columns = run[source], name = (source === "eval" ? "validation " : "") + key;
        const variants = columns[key + "_smooth"] ? [[key, " (raw)", color + "55", 1], [key + "_smooth", " (smoothed)",
                         color, 2]] : columns[key] ? [[key, "", color, 2]] : [];
        variants.forEach(([column, suffix, stroke, width]) => {
          const pairs = columns[xKey].map((x, i) => [x, columns[column][i]]).filter(p => p[0] != null);
          if (!pairs.length) return;  // e.g. an older run's records have no tokens seen
          tables.push([pairs.map(p => p[0]), pairs.map(p => p[1])]);
          series.push({label: `${run.name} · ${name}${suffix}`, stroke, width, spanGaps: true, dash: k ? [6, 4] : [],
                       points: {show: pairs.length < 40}, value: (u, v) => (v == null ? "—" : short(v))});
        });
      });
    });
    const figure = document.createElement("figure");
    figure.innerHTML = `<figcaption>${title}</figcaption>`;
    box.appendChild(figure);
    if (!tables.some(t => t[0].length)) {
      figure.insertAdjacentHTML("beforeend", "<p class=note>No data for this curve in these runs.</p>");
      return;
    }
    const width = Math.max(320, Math.floor((box.clientWidth - 24) / 2));
    new uPlot({width, height: 240, series, plugins: [marksPlugin(xKey)], legend: {live: true},
               scales: {x: {time: false}},
               axes: [{values: (u, vals) => vals.map(short)}, {values: (u, vals) => vals.map(short), size: 56}]},
              align(tables), figure);
  }

  function draw(xKey) {
    const box = document.getElementById("charts");
    box.textContent = "";
    CHARTS.forEach(([title, curves]) => chart(title, curves, xKey, box));
    document.body.dataset.charts = String(box.querySelectorAll(".uplot").length);
  }

  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text != null) node.textContent = text;
    if (className) node.className = className;
    return node;
  }

  function markdown(text) {  // a results.md of `bertrain evaluate`: heading, list, paragraphs and tables, drawn
    const box = el("div", null, "evaluation");
    const cells = line => line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map(cell => cell.trim());
    const rule = line => cells(line).every(cell => /^:?-{3,}:?$/.test(cell));  // the |---|---| under a header
    for (const block of text.split(/\n\s*\n/)) {
      const lines = block.split("\n").filter(line => line.trim());
      if (!lines.length) continue;
      if (lines.every(line => line.trim().startsWith("|"))) {
        const rows = lines.filter(line => !rule(line)).map(cells);
        box.appendChild(table(rows[0], rows.slice(1)));
      } else if (lines.every(line => line.startsWith("- "))) {
        const list = el("ul");
        lines.forEach(line => list.appendChild(el("li", line.slice(2).replace(/`/g, ""))));
        box.appendChild(list);
      } else if (!lines[0].startsWith("# ")) {  // the file's own title repeats the h3 above it
        box.appendChild(el("p", lines.join(" ").replace(/`/g, "")));
      }
    }
    return box;
  }

  function table(header, rows) {
    const node = el("table");
    [header].concat(rows).forEach((row, r) => {
      const line = node.insertRow();
      row.forEach(cell => line.appendChild(el(r ? "td" : "th", cell == null ? "—" : cell)));
    });
    return node;
  }

  function list(items) {  // {term: description} as a <dl>
    const node = el("dl");
    Object.entries(items).forEach(([term, text]) => node.append(el("dt", term), el("dd", text)));
    return node;
  }

  const percent = v => (v == null ? "—" : (100 * v).toFixed(1) + "%");
  const count = v => (typeof v === "number" ? v.toLocaleString("en-US") : String(v));
  const last = column => (column || []).filter(v => v != null).pop();

  function model(run) {  // "bert, hidden 768, 12 layers, 12 heads, 110,106,428 parameters"
    const m = run.model;
    if (!m) return "unknown";
    return [m.type, `hidden ${m.hidden_size}`, `${m.num_hidden_layers} layers`, `${m.num_attention_heads} heads`]
      .concat(m.type === "albert" ? [`embedding ${m.embedding_size}`] : [])
      .concat(typeof run.parameters === "number" ? [`${count(run.parameters)} parameters`] : []).join(", ");
  }

  function verdict(run) {  // what the curves say, in a few sentences (first and last points are never dropped)
    const lines = [], train = run.train, evals = run.eval;
    const losses = (train.loss || []).map((v, i) => [train.step[i], v]).filter(pair => pair[1] != null);
    if (losses.length) {
      const [[s0, l0], [s1, l1]] = [losses[0], losses[losses.length - 1]];
      lines.push(`Training loss ${l0.toFixed(3)} at step ${s0} → ${l1.toFixed(3)} at step ${s1} ` +
                 `(${l1 < l0 ? "lower" : "not lower"}).`);
    }
    const accuracies = (evals.mlm_accuracy || []).filter(v => v != null);
    if (accuracies.length) {
      lines.push(`Validation MLM accuracy ${percent(last(accuracies))} at step ${last(evals.step)} (first evaluation ` +
                 `${percent(accuracies[0])}, best ${percent(Math.max(...accuracies))}).`);
    }
    const sentence = last(evals.sentence_accuracy), objective = (run.objective || "").toUpperCase() || "sentence";
    if (sentence != null) {
      lines.push(`Validation ${objective} accuracy ${percent(sentence)}: ` +
                 (Math.abs(sentence - 0.5) < 0.03 ? "near chance (50%)." :
                  `${(100 * (sentence - 0.5)).toFixed(1)} points from chance (50%).`));
    }
    if (train.step.length && !evals.step.length) lines.push("No evaluation yet (train.eval_every).");
    if (run.skipped) lines.push(`${run.skipped} step(s) skipped for a non-finite loss or gradient.`);
    if (run.sessions > 1) lines.push(`Trained in ${run.sessions} sessions (resumed ${run.sessions - 1} time(s)).`);
    return lines;
  }

  function section(run) {  // what the page says of one run, below the curves
    const box = el("section");
    box.append(el("h2", run.name), el("p", run.path, "path"));
    run.notes.forEach(note => box.appendChild(el("p", note, "note")));
    const bullets = box.appendChild(el("ul", null, "verdict"));
    verdict(run).forEach(line => bullets.appendChild(el("li", line)));
    box.appendChild(list({model: model(run), status: run.status,
                          marks: run.marks.map(m => m.text).join("; ") || "none"}));
    if (run.data) {
      const audit = run.data.audit;
      box.append(el("h3", "Data"), list(run.data.facts), table(["split", "documents", "sentences", "tokens"],
                 run.data.splits.map(row => row.map(count))));
      if (audit.found) {
        box.append(el("h3", `${audit.objective} pair audit: can a surface feature predict the label? ` +
                            `(${count(audit.held_out)} held-out instances, max_seq_length ${audit.max_seq_length})`),
                   table(["surface feature", "held-out accuracy", "majority rate", ""], audit.probes.map(
                     ([name, accuracy, majority, shortcut]) => [name, accuracy.toFixed(3), majority.toFixed(3),
                                                                shortcut ? "SHORTCUT" : "ok"])));
      } else if (audit.objective !== "NONE") {
        box.appendChild(el("p", `No ${audit.objective} pair audit in DATA_DIR (bertrain inspect DATA_DIR --pairs ` +
                                "--audit --config CONFIG writes one)."));
      }
    }
    if (run.config_diff) {
      const diff = run.config_diff;
      box.append(el("h3", `Config: ${diff.rows.length} key(s) differ from the closest shipped config, ${diff.shipped}`),
                 table(["key", diff.shipped, "this run"], diff.rows));
    }
    run.evaluation.forEach(([path, text]) => box.append(el("h3", `Evaluation (${path})`), markdown(text)));
    return box;
  }

  document.getElementById("summary").appendChild(table(
    ["run", "model", "step", "training loss", "validation MLM acc.", "validation sentence acc.", "status"],
    DATA.runs.map(run => [run.name, model(run), `${last(run.train.step) ?? 0} / ${run.total_steps ?? "?"}`,
                          last(run.train.loss)?.toFixed(4) ?? "—", percent(last(run.eval.mlm_accuracy)),
                          percent(last(run.eval.sentence_accuracy)), run.status])));
  DATA.runs.forEach(run => document.getElementById("runs").appendChild(section(run)));
  document.querySelectorAll("input[name=x]").forEach(input => {
    input.addEventListener("change", () => draw(input.value));
    input.checked = input.value === (location.hash === "#tokens" ? "tokens" : "step");  // #tokens: open on tokens
  });
  draw(location.hash === "#tokens" ? "tokens" : "step");
})();
