// A small SVG line chart for rates and depths sampled by the UI while a page is open.
// Series colours come from style.css (.series-N), so the chart needs no inline styles.

import { h, fmtNum, fmtRate } from './dom.js';

const SVG = 'http://www.w3.org/2000/svg';
const WINDOW_MS = 5 * 60 * 1000;
const SAMPLES_MAX = 600;
const HEIGHT = 180;
const PAD = { left: 56, right: 12, top: 12, bottom: 24 };

function svg(tag, attrs = {}) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

// 1, 2, 5 x 10^n at or above `value`: a readable top for the y axis.
function niceCeil(value) {
  if (value <= 0) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

export class LineChart {
  // series: [{key, label}]; kind: 'rate' or 'count' (how values are printed).
  constructor(id, series, kind = 'rate') {
    this.series = series;
    this.kind = kind;
    this.samples = [];
    this.plot = h('div', { class: 'chart-plot' });
    this.legend = h('ul', { class: 'chart-legend' });
    this.el = h('div', { class: 'chart', id }, this.plot, this.legend);
  }

  format(value) {
    return this.kind === 'rate' ? fmtRate(value) : fmtNum(value);
  }

  // values: {key: number|undefined}; a missing value leaves a gap in that line.
  add(values, time = Date.now()) {
    this.samples.push({ time, values });
    const oldest = time - WINDOW_MS;
    while (this.samples.length > SAMPLES_MAX || (this.samples.length && this.samples[0].time < oldest)) {
      this.samples.shift();
    }
    this.render();
  }

  render() {
    const width = Math.max(this.plot.clientWidth || 0, 320);
    const now = this.samples.length ? this.samples[this.samples.length - 1].time : Date.now();
    const left = now - WINDOW_MS;
    let top = 0;
    for (const s of this.samples) {
      for (const { key } of this.series) {
        const v = s.values[key];
        if (typeof v === 'number' && v > top) top = v;
      }
    }
    // Counts below 4 get a 0..4 axis, so its labels stay whole numbers.
    top = this.kind === 'count' ? Math.max(niceCeil(top * 1.1), 4) : niceCeil(top * 1.1);
    const innerW = width - PAD.left - PAD.right;
    const innerH = HEIGHT - PAD.top - PAD.bottom;
    const x = (t) => PAD.left + ((t - left) / WINDOW_MS) * innerW;
    const y = (v) => PAD.top + innerH - (v / top) * innerH;
    const root = svg('svg', { width, height: HEIGHT, viewBox: `0 0 ${width} ${HEIGHT}`, role: 'img' });
    for (let i = 0; i <= 4; i += 1) {
      const value = (top * i) / 4;
      const yy = y(value);
      root.append(svg('line', { x1: PAD.left, x2: width - PAD.right, y1: yy, y2: yy, class: i ? 'grid-line' : 'axis-line' }));
      const label = svg('text', { x: PAD.left - 8, y: yy + 4, class: 'axis-label', 'text-anchor': 'end' });
      label.textContent = this.kind === 'rate' ? fmtRate(value).replace('/s', '') : fmtNum(value);
      root.append(label);
    }
    for (let minutes = 0; minutes <= 5; minutes += 1) {
      const label = svg('text', { x: x(now - minutes * 60000), y: HEIGHT - 6, class: 'axis-label', 'text-anchor': minutes ? 'middle' : 'end' });
      label.textContent = minutes ? `-${minutes}m` : 'now';
      root.append(label);
    }
    this.series.forEach(({ key }, index) => {
      let points = [];
      const flush = () => {
        if (points.length === 1) root.append(svg('circle', { cx: points[0][0], cy: points[0][1], r: 2.5, class: `dot series-${index}` }));
        if (points.length > 1) root.append(svg('polyline', { points: points.map((p) => p.join(',')).join(' '), class: `line series-${index}` }));
        points = [];
      };
      for (const s of this.samples) {
        const v = s.values[key];
        if (typeof v === 'number') points.push([x(s.time).toFixed(1), y(v).toFixed(1)]);
        else flush();
      }
      flush();
    });
    this.plot.replaceChildren(root);
    const last = this.samples.length ? this.samples[this.samples.length - 1].values : {};
    this.legend.replaceChildren(...this.series.map(({ key, label }, index) => h('li', {},
      h('span', { class: `swatch series-${index}` }), h('span', { class: 'legend-label' }, label),
      h('span', { class: 'legend-value', dataset: { series: key } }, this.format(last[key])))));
  }
}
