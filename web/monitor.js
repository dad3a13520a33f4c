// hyperion monitor's page: polls /api/data (shape in src/cli/monitor_cmd.cc and
// src/monitor/dashboard_data.h) every 2 s and draws one uPlot chart per metric over
// steps, updating each in place. Plain ES2017, no build step: it is served as written.
//
// Per run directory: metrics.jsonl's metrics (one line each), ranks.jsonl's per-rank
// metrics (one line per rank: the outlier, the summary's top rank by max, drawn thick;
// stragglers drawn red and listed in a banner), and goodput as a stacked bar. Per URL
// source: each scraped gauge, one line per rank.
//
// When a refresh has drawn every chart, body's data-plots holds the number of charts
// with a drawn canvas and data-ready is "1" (what the headless-browser test reads).
'use strict';
(function () {
  const POLL_MS = 2000;
  const PALETTE = ['#1f77b4', '#ff7f0e', '#2ca02c', '#9467bd', '#8c564b', '#e377c2',
                   '#7f7f7f', '#bcbd22', '#17becf', '#393b79', '#637939', '#8c6d31'];
  const STRAGGLER = '#d62728';
  const BADPUT = ['#e6550d', '#fdae6b', '#756bb1', '#9e9ac8', '#de2d26', '#fc9272',
                  '#636363', '#bdbdbd', '#3182bd'];
  const charts = new Map();  // id -> {plot, sig, box, note}
  let lastData = null;
  let showMax = false;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function isNum(v) { return typeof v === 'number' && isFinite(v); }

  function fmt(v, metric) {
    if (!isNum(v)) return '-';
    if (metric && /bytes/.test(metric) && Math.abs(v) >= 1024) {
      const units = ['KiB', 'MiB', 'GiB', 'TiB'];
      let u = -1;
      while (Math.abs(v) >= 1024 && u < units.length - 1) { v /= 1024; u++; }
      return v.toFixed(1) + ' ' + units[u];
    }
    const a = Math.abs(v);
    const s = a !== 0 && (a >= 1e6 || a < 1e-3) ? v.toExponential(3) : String(+v.toPrecision(4));
    return metric && /_s$/.test(metric) && !/per_s$/.test(metric) ? s + ' s' : s;
  }

  // A titled container with a grid for charts, created once under `parent`; the title
  // is refreshed (it may count rows).
  function section(parent, id, title, level) {
    let box = document.getElementById(id);
    if (!box) {
      box = el('div');
      box.id = id;
      box.appendChild(el(level || 'h2'));
      box.appendChild(el('div', 'extra'));
      box.appendChild(el('div', 'grid'));
      parent.appendChild(box);
    }
    box.children[0].textContent = title;
    return { box: box, extra: box.children[1], grid: box.children[2] };
  }

  function chartWidth() {
    const w = document.documentElement.clientWidth || 800;
    return Math.max(300, Math.min(560, Math.floor((w - 60) / 2)));
  }

  // Draws chart `id` in `grid`, or updates it in place (recreated when its series change).
  function drawChart(seen, grid, id, title, series, data, note) {
    seen.add(id);
    const sig = JSON.stringify(series);
    let c = charts.get(id);
    if (c && c.sig !== sig) {
      c.plot.destroy();
    }
    if (!c || c.sig !== sig) {
      const box = c ? c.box : el('div', 'chart');
      if (!c) grid.appendChild(box);
      const noteEl = c ? c.note : el('div', 'note');
      const plotEl = el('div');
      box.textContent = '';
      box.appendChild(plotEl);
      box.appendChild(noteEl);
      const opts = {
        title: title, width: chartWidth(), height: 200,
        scales: { x: { time: false } },
        axes: [{ label: 'step' }, { size: 60 }],
        series: [{ label: 'step' }].concat(series.map(function (s) {
          return { label: s.label, stroke: s.stroke, width: s.width, dash: s.dash,
                   spanGaps: true, value: function (u, v) { return fmt(v, s.metric); } };
        })),
      };
      c = { plot: new uPlot(opts, data, plotEl), sig: sig, box: box, note: noteEl };
      charts.set(id, c);
    } else {
      c.plot.setData(data);
    }
    c.note.textContent = '';
    if (note) c.note.appendChild(note);
  }

  // Rows by step, ascending, the last row of a repeated step kept.
  function byStep(rows) {
    const m = new Map();
    rows.forEach(function (r) { if (isNum(r.step)) m.set(r.step, r); });
    return Array.from(m.values()).sort(function (a, b) { return a.step - b.step; });
  }

  // The server's JSON objects come with sorted keys: charts go in the order of
  // metrics.jsonl's and ranks.jsonl's writers, then the rest alphabetically.
  const STEP_ORDER = ['loss', 'lm_loss', 'rewards/accuracies', 'rewards/margins', 'rewards/chosen',
                      'rewards/rejected', 'grad_norm', 'lr', 'step_s', 'tokens_per_s', 'tflops',
                      'mfu', 'emfu', 'data_wait_s', 'comm_s', 'comm_exposed_s', 'comm_bytes_sent',
                      'tokens_seen'];
  const RANK_ORDER = ['step_s', 'compute_s', 'data_wait_s', 'comm_exposed_s', 'tokens_per_s',
                      'process_cpu', 'rss_bytes'];
  function ordered(keys, order) {
    const rank = function (k) { const i = order.indexOf(k); return i < 0 ? order.length : i; };
    return keys.sort(function (a, b) { return rank(a) - rank(b) || (a < b ? -1 : a > b ? 1 : 0); });
  }

  function numericKeys(rows, skip) {
    const keys = [];
    rows.forEach(function (r) {
      Object.keys(r).forEach(function (k) {
        if (skip.indexOf(k) < 0 && keys.indexOf(k) < 0 && typeof r[k] === 'number') keys.push(k);
      });
    });
    return ordered(keys, STEP_ORDER);
  }

  function rankList(sum, key, metric, latest) {
    if (!sum || !Array.isArray(sum[key])) return '';
    return sum[key].map(function (r) {
      const e = (latest.ranks || []).find(function (x) { return x.rank === r; }) || {};
      return 'rank ' + r + ' (' + fmt(e[metric + (key === 'top_by_max' ? '_max' : '_mean')], metric) + ')';
    }).join(', ');
  }

  function renderGoodput(box, run) {
    box.textContent = '';
    const g = run.goodput;
    if (!g) {
      box.appendChild(el('div', 'unavailable',
                         'goodput: unavailable (' + (run.goodput_error || 'no event log') + ')'));
      return;
    }
    const parts = [{ kind: 'productive', seconds: g.productive_s, fraction: g.goodput, color: '#2ca02c' }];
    const kinds = (run.badput_kinds || []).filter(function (k) { return g.badput && k in g.badput; });
    Object.keys(g.badput || {}).forEach(function (k) { if (kinds.indexOf(k) < 0) kinds.push(k); });
    kinds.forEach(function (k, i) {
      const b = g.badput[k];
      parts.push({ kind: k, seconds: b.seconds, fraction: b.fraction, color: BADPUT[i % BADPUT.length] });
    });
    box.appendChild(el('div', '', 'goodput ' + (100 * g.goodput).toFixed(1) + '% of ' +
      fmt(g.total_s, 'total_s') + ' (' + g.processes + ' process' + (g.processes === 1 ? '' : 'es') +
      ', ' + g.disruptions + ' disrupted, ' + g.steps_kept + ' steps kept, ' + g.steps_lost +
      ' lost' + (g.finished ? ', finished' : '') + ')'));
    const bar = el('div', 'gp-bar');
    const table = el('table', 'gp-table');
    parts.forEach(function (p) {
      const label = p.kind + ': ' + fmt(p.seconds, 'x_s') + ' (' + (100 * p.fraction).toFixed(1) + '%)';
      if (p.seconds > 0) {
        const seg = el('div');
        seg.style.flex = String(p.seconds);
        seg.style.background = p.color;
        seg.title = label;
        bar.appendChild(seg);
      }
      const tr = el('tr');
      const name = el('td');
      const sw = el('span', 'swatch');
      sw.style.background = p.color;
      name.appendChild(sw);
      name.appendChild(document.createTextNode(p.kind));
      tr.appendChild(name);
      tr.appendChild(el('td', '', fmt(p.seconds, 'x_s')));
      tr.appendChild(el('td', '', (100 * p.fraction).toFixed(1) + '%'));
      table.appendChild(tr);
    });
    box.appendChild(bar);
    box.appendChild(table);
  }

  function renderRankCharts(seen, grid, run, ri) {
    const rows = byStep(run.ranks || []);
    if (!rows.length) return;
    const latest = rows[rows.length - 1];
    const ranks = [], hosts = {}, metrics = [];
    rows.forEach(function (row) {
      (row.ranks || []).forEach(function (e) {
        if (ranks.indexOf(e.rank) < 0) ranks.push(e.rank);
        if (e.host) hosts[e.rank] = e.host;
        Object.keys(e).forEach(function (k) {
          const m = k.replace(/_mean$/, '');
          if (m !== k && metrics.indexOf(m) < 0) metrics.push(m);
        });
      });
    });
    ranks.sort(function (a, b) { return a - b; });
    ordered(metrics, RANK_ORDER);
    const stragglers = latest.stragglers || [];
    const xs = rows.map(function (r) { return r.step; });
    metrics.forEach(function (m) {
      const sum = latest.summary && latest.summary[m];
      const outlier = ranks.length > 1 && sum && sum.top_by_max && sum.top_by_max.length ? sum.top_by_max[0] : null;
      const series = [], data = [xs];
      ranks.forEach(function (r, i) {
        const strag = stragglers.filter(function (s) { return s.rank === r; });
        const slow = strag.some(function (s) { return s.metric === m; });
        const label = 'rank ' + r + (hosts[r] ? ' (' + hosts[r] + ')' : '') +
          (strag.length ? ' straggler' : '') + (r === outlier ? ' outlier' : '');
        const color = strag.length ? STRAGGLER : PALETTE[i % PALETTE.length];
        const value = function (suffix) {
          return rows.map(function (row) {
            const e = (row.ranks || []).find(function (x) { return x.rank === r; });
            return e && isNum(e[m + suffix]) ? e[m + suffix] : null;
          });
        };
        series.push({ label: label, stroke: color, width: slow || r === outlier ? 3.5 : 1.5, metric: m });
        data.push(value('_mean'));
        if (showMax) {
          series.push({ label: 'rank ' + r + ' max', stroke: color, width: 1, dash: [4, 4], metric: m });
          data.push(value('_max'));
        }
      });
      const note = el('table');
      [['top by max', 'top_by_max'], ['top by mean', 'top_by_mean']].forEach(function (t) {
        const text = rankList(sum, t[1], m, latest);
        if (!text) return;
        const tr = el('tr');
        tr.appendChild(el('td', '', t[0] + ':'));
        tr.appendChild(el('td', '', text));
        note.appendChild(tr);
      });
      if (outlier !== null) {
        const tr = el('tr');
        tr.appendChild(el('td', '', 'outlier:'));
        tr.appendChild(el('td', '', 'rank ' + outlier + ' (thick line)'));
        note.appendChild(tr);
      }
      drawChart(seen, grid, 'run' + ri + ':rank:' + m, m + ' per rank (mean over ' +
                (latest.steps || '?') + ' steps)', series, data, note);
    });
  }

  function renderRun(seen, parent, run, ri) {
    const s = section(parent, 'run' + ri, 'Run ' + run.dir);
    s.extra.textContent = '';
    (run.problems || []).forEach(function (p) { s.extra.appendChild(el('div', 'notice', p)); });
    const gp = el('div');
    s.extra.appendChild(gp);
    renderGoodput(gp, run);
    const rows = byStep(run.metrics || []);
    const steps = section(s.grid, 'run' + ri + ':steps', 'Per step (metrics.jsonl, ' +
                          (run.metrics_rows || 0) + ' steps)', 'h3');
    if (!rows.length) steps.extra.textContent = 'no metrics.jsonl rows yet';
    else steps.extra.textContent = '';
    const xs = rows.map(function (r) { return r.step; });
    numericKeys(rows, ['step']).forEach(function (k) {
      const ys = rows.map(function (r) { return isNum(r[k]) ? r[k] : null; });
      drawChart(seen, steps.grid, 'run' + ri + ':step:' + k, k,
                [{ label: k, stroke: PALETTE[0], width: 1.5, metric: k }], [xs, ys], null);
    });
    const per = section(s.grid, 'run' + ri + ':ranks', 'Per rank (ranks.jsonl)', 'h3');
    if (!(run.ranks || []).length) per.extra.textContent = 'no ranks.jsonl rows (one process, or not written yet)';
    else per.extra.textContent = '';
    renderRankCharts(seen, per.grid, run, ri);
    s.grid.style.display = 'block';
  }

  function renderStragglers(runs) {
    const box = document.getElementById('stragglers');
    box.textContent = '';
    const banner = el('div', 'banner');
    runs.forEach(function (run) {
      const rows = byStep(run.ranks || []);
      if (!rows.length) return;
      const prefix = runs.length > 1 ? run.dir + ': ' : '';
      const latest = rows[rows.length - 1];
      const now = {};
      (latest.stragglers || []).forEach(function (s) {
        now[s.rank] = true;
        banner.appendChild(el('div', '', prefix + 'straggler: rank ' + s.rank + ' (' + s.metric +
          ' ' + fmt(s.value, s.metric) + ' vs median ' + fmt(s.median, s.metric) + ', threshold ' +
          fmt(s.threshold, s.metric) + '; ' + s.periods + ' period' + (s.periods === 1 ? '' : 's') +
          ') at step ' + latest.step));
      });
      const earlier = {};
      rows.slice(0, -1).forEach(function (row) {
        (row.stragglers || []).forEach(function (s) {
          if (!now[s.rank]) earlier[s.rank] = 'rank ' + s.rank + ' (' + s.metric + ') at step ' + row.step;
        });
      });
      Object.keys(earlier).forEach(function (r) {
        banner.appendChild(el('div', 'earlier', prefix + 'earlier straggler: ' + earlier[r]));
      });
    });
    if (banner.children.length) box.appendChild(banner);
  }

  function renderEndpoints(seen, data) {
    const scrapes = data.scrapes || [];
    if (!scrapes.length) return;
    const s = section(document.getElementById('endpoints'), 'endpoints-section', 'Rank endpoints (Prometheus)');
    s.extra.textContent = '';
    scrapes.forEach(function (sc) {
      s.extra.appendChild(el('div', sc.error ? 'notice' : '', sc.url + ': ' + sc.ok + ' scrapes' +
        (sc.failed ? ', ' + sc.failed + ' failed' : '') + (sc.error ? ' (last: ' + sc.error + ')' : '')));
    });
    const info = data.series_ranks || {};
    const series = data.series || {};
    Object.keys(series).sort().forEach(function (metric) {
      const byRank = series[metric];
      const keys = Object.keys(byRank).sort(function (a, b) { return (+a) - (+b) || (a < b ? -1 : 1); });
      const stepSet = new Set();
      keys.forEach(function (k) { byRank[k].forEach(function (p) { stepSet.add(p[0]); }); });
      const xs = Array.from(stepSet).sort(function (a, b) { return a - b; });
      const index = new Map(xs.map(function (x, i) { return [x, i]; }));
      const data2 = [xs];
      const opts = keys.map(function (k, i) {
        const ys = xs.map(function () { return null; });
        byRank[k].forEach(function (p) { ys[index.get(p[0])] = isNum(p[1]) ? p[1] : null; });
        data2.push(ys);
        const host = info[k] && info[k].host ? ' (' + info[k].host + ')' : '';
        return { label: 'rank ' + k + host, stroke: PALETTE[i % PALETTE.length], width: 1.5, metric: metric };
      });
      drawChart(seen, s.grid, 'ep:' + metric, metric, opts, data2, null);
    });
  }

  function render(data) {
    lastData = data;
    document.getElementById('sources').textContent = 'sources: ' + (data.sources || []).join(', ');
    const seen = new Set();
    renderStragglers(data.runs || []);
    (data.runs || []).forEach(function (run, ri) {
      renderRun(seen, document.getElementById('runs'), run, ri);
    });
    renderEndpoints(seen, data);
    charts.forEach(function (c, id) {  // metrics that went away (a run restarted anew)
      if (!seen.has(id)) { c.plot.destroy(); c.box.remove(); charts.delete(id); }
    });
    // uPlot sizes its canvas when it commits (a microtask): count after it.
    setTimeout(function () {
      let drawn = 0;
      charts.forEach(function (c) {
        const canvas = c.box.querySelector('canvas');
        if (canvas && canvas.width > 0 && canvas.height > 0) drawn++;
      });
      document.body.dataset.plots = String(drawn);
      document.body.dataset.ready = '1';
    }, 0);
  }

  function setStatus(text, error) {
    const s = document.getElementById('status');
    s.textContent = text;
    s.className = error ? 'error' : '';
  }

  async function refresh() {
    try {
      const res = await fetch('/api/data', { cache: 'no-store' });
      if (!res.ok) throw new Error('HTTP ' + res.status + ' ' + (await res.text()));
      const data = await res.json();
      render(data);
      setStatus('updated ' + new Date().toLocaleTimeString() + ' (every ' + POLL_MS / 1000 + ' s)');
    } catch (e) {
      setStatus('cannot update from /api/data: ' + e.message, true);
    }
  }

  async function loop() {
    await refresh();
    setTimeout(loop, POLL_MS);
  }

  const toggle = el('label', '', ' show per-rank max (dashed)');
  const box = el('input');
  box.type = 'checkbox';
  box.addEventListener('change', function () { showMax = box.checked; if (lastData) render(lastData); });
  toggle.insertBefore(box, toggle.firstChild);
  document.getElementById('status').after(toggle);
  loop();
})();
