/**
 * A sparkline on a canvas: a filled line of a metric's recent history, sized to its element.
 * Deliberately tiny: a sidebar of many GPUs must stay cheap to redraw several times a second.
 */

import { Series } from './series';

export class Sparkline {
  readonly node: HTMLCanvasElement;

  constructor() {
    this.node = document.createElement('canvas');
    this.node.className = 'pm-spark';
  }

  /** Redraw `series` scaled to [0, ceiling]; `null` samples leave gaps. */
  draw(series: Series, ceiling: number): void {
    const canvas = this.node;
    const ratio = window.devicePixelRatio || 1;
    const width = Math.max(1, Math.round(canvas.clientWidth * ratio));
    const height = Math.max(1, Math.round(canvas.clientHeight * ratio));
    if (canvas.width !== width || canvas.height !== height) {
      canvas.width = width;
      canvas.height = height;
    }
    const ctx = canvas.getContext('2d');
    canvas.dataset.points = String(series.values.length);
    if (!ctx) {
      return;
    }
    ctx.clearRect(0, 0, width, height);
    const style = getComputedStyle(canvas);
    const stroke = style.getPropertyValue('--pm-spark-color').trim() || '#2f7ed8';
    const values = series.values;
    // Stretch what we have over the full width while the history fills up.
    const span = Math.max(1, values.length - 1);
    const x = (i: number) => (i / span) * width;
    const top = ceiling > 0 ? ceiling : 1;
    const y = (v: number) => height - 1 - (Math.min(v, top) / top) * (height - 2);

    ctx.lineWidth = Math.max(1, ratio);
    ctx.strokeStyle = stroke;
    ctx.fillStyle = stroke;
    let run: [number, number][] = [];
    const flush = () => {
      if (run.length > 1) {
        ctx.globalAlpha = 0.18;
        ctx.beginPath();
        ctx.moveTo(run[0][0], height);
        run.forEach(([px, py]) => ctx.lineTo(px, py));
        ctx.lineTo(run[run.length - 1][0], height);
        ctx.closePath();
        ctx.fill();
        ctx.globalAlpha = 1;
        ctx.beginPath();
        run.forEach(([px, py], i) => (i ? ctx.lineTo(px, py) : ctx.moveTo(px, py)));
        ctx.stroke();
      } else if (run.length === 1) {
        ctx.fillRect(run[0][0] - ratio, run[0][1] - ratio, 2 * ratio, 2 * ratio);
      }
      run = [];
    };
    values.forEach((v, i) => (v === null ? flush() : run.push([x(i), y(v)])));
    flush();
  }
}
