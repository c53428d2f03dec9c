// The report page's script and style, embedded verbatim in every report (no file or network
// resource is referenced). The script reads the JSON of <script id="report-data">, and for
// each chart entry draws an <svg> into <div id="chart-ID">: a line chart (one or two y axes),
// stacked bars per step, grouped bars per rank, or a Gantt chart of trace spans. Every drawn
// chart's container gets data-rendered="1" and data-points="N" (the points, bars or spans
// drawn); each series is a <g class="series" data-series="NAME" data-points="N">, so a test
// can check the rendered page (tests/cli/report_cmd_test.cpp). A chart that fails to draw gets
// data-rendered="error" and shows the error. The SVG is built as markup and parsed by the HTML
// parser (which puts it in the SVG namespace), so the page names no namespace URL.
#include "report_detail.h"

namespace paratrain::monitor::detail {

const char* report_style() {
  return R"CSS(
body { font-family: system-ui, sans-serif; margin: 0; padding: 16px 24px; color: #222; background: #f6f7f9; }
h1 { margin: 0 0 4px 0; font-size: 22px; }
h2 { margin: 0 0 4px 0; font-size: 16px; }
.source { color: #666; font-size: 12px; margin: 0 0 10px 0; }
.summary { display: flex; flex-wrap: wrap; gap: 8px; margin: 0 0 12px 0; padding: 0; }
.summary div { background: #fff; border: 1px solid #dde; border-radius: 6px; padding: 6px 12px; }
.summary dt { font-size: 11px; color: #666; }
.summary dd { margin: 0; font-size: 17px; font-weight: 600; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 12px; }
.card { background: #fff; border: 1px solid #dde; border-radius: 6px; padding: 10px 12px; }
.card.wide { grid-column: 1 / -1; }
.what { color: #555; font-size: 12px; margin: 0 0 6px 0; }
.chart svg { width: 100%; height: auto; display: block; }
.absent { color: #a05a00; background: #fff6e6; border: 1px dashed #e0b070; padding: 6px 10px; font-size: 13px; }
.notes { margin: 4px 0 0 0; padding: 0; list-style: none; }
.notes li { margin-top: 4px; }
table.means { border-collapse: collapse; background: #fff; font-size: 13px; }
table.means td, table.means th { border: 1px solid #dde; padding: 3px 10px; text-align: right; }
table.means th { background: #eef0f4; }
table.means td:first-child { text-align: left; font-family: monospace; }
td.na { color: #a05a00; font-style: italic; }
.means-card { margin-bottom: 12px; display: inline-block; }
svg text { font-size: 11px; fill: #333; }
svg .axis line, svg .axis path { stroke: #999; }
svg .grid line { stroke: #eee; }
)CSS";
}

const char* report_script() {
  return R"JS(
(function () {
  'use strict';
  var data = JSON.parse(document.getElementById('report-data').textContent);
  var COLORS = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7',
                '#9c755f', '#bab0ac', '#1f77b4', '#d62728'];
  function esc(s) {
    return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
  }
  function fmt(v) {
    var a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(1) + 'G';
    if (a >= 1e6) return (v / 1e6).toFixed(1) + 'M';
    if (a >= 1e4) return (v / 1e3).toFixed(1) + 'k';
    if (a === 0) return '0';
    return String(Number(v.toPrecision(3)));
  }
  function ticks(lo, hi, n) {
    if (!(hi > lo)) { hi = lo + (lo === 0 ? 1 : Math.abs(lo) * 0.1); }
    var raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw))), norm = raw / mag;
    var step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
    var t = [], v = Math.floor(lo / step) * step;
    for (; v <= hi + step * 1e-9; v += step) t.push(Number(v.toPrecision(12)));
    return {lo: t[0], hi: Math.max(t[t.length - 1], hi), ticks: t};
  }
  function scale(d0, d1, r0, r1) {
    return function (v) { return d1 === d0 ? (r0 + r1) / 2 : r0 + (v - d0) * (r1 - r0) / (d1 - d0); };
  }
  function legend(names, x, y) {
    var s = '', cx = x;
    names.forEach(function (n, i) {
      s += '<rect x="' + cx + '" y="' + (y - 9) + '" width="10" height="10" fill="' + COLORS[i % COLORS.length] +
           '"></rect><text x="' + (cx + 14) + '" y="' + y + '">' + esc(n) + '</text>';
      cx += 24 + 7 * String(n).length;
    });
    return '<g class="legend">' + s + '</g>';
  }
  function yAxis(t, sy, x, left, label, W) {
    var s = '<g class="axis">';
    t.ticks.forEach(function (v) {
      var y = sy(v);
      if (left) s += '<line class="gridline" x1="' + x + '" x2="' + (W - 56) + '" y1="' + y + '" y2="' + y +
                     '" stroke="#eee"></line>';
      s += '<text x="' + (left ? x - 4 : x + 4) + '" y="' + (y + 4) + '" text-anchor="' + (left ? 'end' : 'start') +
           '">' + fmt(v) + '</text>';
    });
    s += '<line x1="' + x + '" x2="' + x + '" y1="' + sy(t.lo) + '" y2="' + sy(t.hi) + '"></line>';
    if (label) s += '<text transform="translate(' + (left ? 12 : W - 6) + ',' + T + ') rotate(-90)" ' +
                    'text-anchor="end">' + esc(label) + '</text>';
    return s + '</g>';
  }
  function xAxis(t, sx, y, label, x0, x1) {
    var s = '<g class="axis"><line x1="' + x0 + '" x2="' + x1 + '" y1="' + y + '" y2="' + y + '"></line>';
    t.ticks.forEach(function (v) {
      var x = sx(v);
      if (x < x0 - 1 || x > x1 + 1) return;
      s += '<line x1="' + x + '" x2="' + x + '" y1="' + y + '" y2="' + (y + 4) + '"></line><text x="' + x +
           '" y="' + (y + 16) + '" text-anchor="middle">' + fmt(v) + '</text>';
    });
    if (label) s += '<text x="' + x1 + '" y="' + (y + 30) + '" text-anchor="end">' + esc(label) + '</text>';
    return s + '</g>';
  }
  var W = 600, H = 290, L = 56, R = 56, T = 30, B = 40;

  function lineChart(c) {
    var xs = [], ys = {left: [], right: []}, total = 0;
    c.series.forEach(function (s) {
      s.points.forEach(function (p) { xs.push(p[0]); ys[s.axis].push(p[1]); });
    });
    var tx = ticks(Math.min.apply(null, xs), Math.max.apply(null, xs), 6);
    var sx = scale(tx.lo, tx.hi, L, W - R);
    var axes = {};
    ['left', 'right'].forEach(function (a) {
      if (!ys[a].length) return;
      var lo = Math.min.apply(null, ys[a]), hi = Math.max.apply(null, ys[a]);
      if (lo > 0 && lo < 0.5 * hi) lo = 0;
      var t = ticks(lo, hi, 5);
      axes[a] = {t: t, s: scale(t.lo, t.hi, H - B, T)};
    });
    var s = '<svg viewBox="0 0 ' + W + ' ' + H + '">';
    if (axes.left) s += yAxis(axes.left.t, axes.left.s, L, true, c.y_label, W);
    if (axes.right) s += yAxis(axes.right.t, axes.right.s, W - R, false, c.y2_label, W);
    s += xAxis(tx, sx, H - B, c.x_label, L, W - R);
    c.series.forEach(function (ser, i) {
      var col = COLORS[i % COLORS.length], sy = axes[ser.axis].s;
      var pts = ser.points.map(function (p) { return sx(p[0]).toFixed(1) + ',' + sy(p[1]).toFixed(1); });
      s += '<g class="series" data-series="' + esc(ser.name) + '" data-points="' + ser.points.length + '">';
      s += '<polyline fill="none" stroke="' + col + '" stroke-width="1.8"' +
           (ser.axis === 'right' ? ' stroke-dasharray="5,3"' : '') + ' points="' + pts.join(' ') + '"></polyline>';
      if (ser.points.length <= 60)
        ser.points.forEach(function (p) {
          s += '<circle cx="' + sx(p[0]).toFixed(1) + '" cy="' + sy(p[1]).toFixed(1) + '" r="2.6" fill="' + col +
               '"><title>' + esc(ser.name) + ' at step ' + p[0] + ': ' + fmt(p[1]) + '</title></circle>';
        });
      s += '</g>';
      total += ser.points.length;
    });
    s += legend(c.series.map(function (x) { return x.name + (x.axis === 'right' ? ' (right, dashed)' : ''); }),
                L + 10, 14);
    return {svg: s + '</svg>', points: total};
  }

  function stackChart(c) {
    var n = c.x.length, tops = [];
    for (var i = 0; i < n; ++i) {
      var sum = 0;
      c.series.forEach(function (s) { sum += s.values[i]; });
      tops.push(sum);
    }
    var ty = ticks(0, Math.max.apply(null, tops), 5), sy = scale(ty.lo, ty.hi, H - B, T);
    var bw = (W - L - R) / n, tx = ticks(Math.min.apply(null, c.x), Math.max.apply(null, c.x), 6);
    var sx = function (v) {
      var k = c.x.indexOf(v);
      if (k < 0) k = (v - c.x[0]) / ((c.x[n - 1] - c.x[0]) || 1) * (n - 1);
      return L + (k + 0.5) * bw;
    };
    var s = '<svg viewBox="0 0 ' + W + ' ' + H + '">' + yAxis(ty, sy, L, true, c.y_label, W) +
            xAxis(tx, sx, H - B, c.x_label, L, W - R);
    var base = c.x.map(function () { return 0; });
    c.series.forEach(function (ser, j) {
      s += '<g class="series" data-series="' + esc(ser.name) + '" data-points="' + ser.values.length + '" fill="' +
           COLORS[j % COLORS.length] + '">';
      ser.values.forEach(function (v, i) {
        var y0 = sy(base[i]), y1 = sy(base[i] + v);
        s += '<rect x="' + (L + i * bw + bw * 0.08).toFixed(2) + '" y="' + y1.toFixed(2) + '" width="' +
             Math.max(0.5, bw * 0.84).toFixed(2) + '" height="' + Math.max(0, y0 - y1).toFixed(2) + '"><title>step ' +
             c.x[i] + ' ' + esc(ser.name) + ': ' + fmt(v) + ' ms</title></rect>';
        base[i] += v;
      });
      s += '</g>';
    });
    s += legend(c.series.map(function (x) { return x.name; }), L + 10, 14);
    return {svg: s + '</svg>', points: n};
  }

  function barsChart(c) {
    var n = c.categories.length, k = c.series.length, all = [];
    c.series.forEach(function (s) { all = all.concat(s.values); });
    var ty = ticks(0, Math.max.apply(null, all), 5), sy = scale(ty.lo, ty.hi, H - B, T);
    var gw = (W - L - R) / n, bw = gw * 0.8 / k;
    var s = '<svg viewBox="0 0 ' + W + ' ' + H + '">' + yAxis(ty, sy, L, true, c.y_label, W);
    s += '<g class="axis"><line x1="' + L + '" x2="' + (W - R) + '" y1="' + (H - B) + '" y2="' + (H - B) + '"></line>';
    c.categories.forEach(function (name, i) {
      s += '<text x="' + (L + (i + 0.5) * gw) + '" y="' + (H - B + 16) + '" text-anchor="middle">' + esc(name) +
           '</text>';
    });
    s += '</g>';
    c.series.forEach(function (ser, j) {
      s += '<g class="series" data-series="' + esc(ser.name) + '" data-points="' + ser.values.length + '" fill="' +
           COLORS[j % COLORS.length] + '">';
      ser.values.forEach(function (v, i) {
        var x = L + i * gw + gw * 0.1 + j * bw, y = sy(v);
        s += '<rect x="' + x.toFixed(2) + '" y="' + y.toFixed(2) + '" width="' + (bw * 0.92).toFixed(2) +
             '" height="' + Math.max(0, H - B - y).toFixed(2) + '"><title>' + esc(c.categories[i]) + ' ' +
             esc(ser.name) + ': ' + fmt(v) + '</title></rect>';
        if (n * k <= 32)
          s += '<text x="' + (x + bw * 0.46).toFixed(2) + '" y="' + (y - 3).toFixed(2) +
               '" text-anchor="middle">' + fmt(v) + '</text>';
      });
      s += '</g>';
    });
    s += legend(c.series.map(function (x) { return x.name; }), L + 10, 14);
    if (c.imbalance_pct !== undefined)
      s += '<text x="' + (W - R) + '" y="14" text-anchor="end" font-weight="bold">imbalance ' +
           c.imbalance_pct.toFixed(1) + '%</text>';
    return {svg: s + '</svg>', points: n};
  }

  function ganttChart(c) {
    var GW = 1200, LW = 170, lane = 22, top = 34, n = c.lanes.length, gh = top + n * lane + 44;
    var end = Math.max(c.window.dur_ms, 1e-6), tx = ticks(0, end, 10), sx = scale(0, tx.hi, LW, GW - 10);
    var names = [], color = {};
    c.spans.forEach(function (sp) {
      var key = sp.cat || sp.name;
      if (!(key in color)) { color[key] = COLORS[names.length % COLORS.length]; names.push(key); }
    });
    var s = '<svg viewBox="0 0 ' + GW + ' ' + gh + '">';
    c.lanes.forEach(function (ln, i) {
      var y = top + i * lane;
      s += '<rect x="' + LW + '" y="' + y + '" width="' + (GW - 10 - LW) + '" height="' + (lane - 2) + '" fill="' +
           (i % 2 ? '#f7f7fa' : '#eef0f5') + '"></rect><text x="' + (LW - 6) + '" y="' + (y + 15) +
           '" text-anchor="end">' + esc(ln.label) + '</text>';
    });
    s += '<g class="series" data-series="spans" data-points="' + c.spans.length + '">';
    c.spans.forEach(function (sp) {
      var x = sx(sp.t0), w = Math.max(0.8, sx(sp.t0 + sp.dur) - x), y = top + sp.lane * lane + 2;
      s += '<rect x="' + x.toFixed(2) + '" y="' + y + '" width="' + w.toFixed(2) + '" height="' + (lane - 6) +
           '" fill="' + color[sp.cat || sp.name] + '" stroke="#fff" stroke-width="0.5"><title>' + esc(sp.name) +
           (sp.cat ? ' [' + esc(sp.cat) + ']' : '') + ': ' + fmt(sp.full_dur) + ' ms' +
           (sp.info ? '\n' + esc(sp.info) : '') + '</title></rect>';
      if (w > 7 * sp.name.length + 6)
        s += '<text x="' + (x + 3).toFixed(2) + '" y="' + (y + 12) + '" fill="#fff">' + esc(sp.name) + '</text>';
    });
    s += '</g>' + xAxis(tx, sx, top + n * lane + 2, c.x_label, LW, GW - 10);
    s += '<text x="' + LW + '" y="12">' + esc(c.window.label) + ', ' + fmt(c.window.dur_ms) + ' ms</text>';
    s += legend(names.slice(0, 12), LW, 28);
    return {svg: s + '</svg>', points: c.spans.length};
  }

  var draw = {line: lineChart, stack: stackChart, bars: barsChart, gantt: ganttChart};
  data.charts.forEach(function (c) {
    var el = document.getElementById('chart-' + c.id);
    if (!el || c.absent) return;
    try {
      var r = draw[c.kind](c);
      el.innerHTML = r.svg;
      el.setAttribute('data-points', String(r.points));
      el.setAttribute('data-rendered', '1');
    } catch (e) {
      el.setAttribute('data-rendered', 'error');
      el.textContent = 'chart failed to draw: ' + e;
    }
  });
  document.body.setAttribute('data-report-rendered', '1');
})();
)JS";
}

}  // namespace paratrain::monitor::detail
