/** What the timeline draws over its bands: the shared time axis, the selected span's links and the brushed range. */
import { ILinks, ISpanRef } from './api';
import { Band, Geometry } from './band';
import { fmtNs, fmtTick, niceStep } from './format';

export const AXIS_H = 30;

type XOf = (ms: number, g: Geometry) => number;

export interface IRange {
  x0: number;
  x1: number;
}

export interface ISelection {
  band: Band;
  links: ILinks;
}

/** The relative time axis (ms from each trace's traced pass) with its tick lines down to ``h``. */
export function drawAxis(ctx: CanvasRenderingContext2D, g: Geometry, h: number, xOf: XOf, fg: string): void {
  const { x0, x1 } = g.view;
  const step = niceStep(x1 - x0, Math.max(g.plotW / 110, 2));
  ctx.fillStyle = fg;
  ctx.strokeStyle = 'rgba(128,128,128,0.25)';
  ctx.textBaseline = 'middle';
  ctx.textAlign = 'center';
  for (let t = Math.ceil(x0 / step) * step; t <= x1; t += step) {
    const x = xOf(t, g);
    ctx.beginPath();
    ctx.moveTo(x, AXIS_H - 6);
    ctx.lineTo(x, h);
    ctx.stroke();
    ctx.fillText(fmtTick(t, step), x, 10);
  }
  ctx.textAlign = 'left';
  ctx.fillText('time from each trace\u2019s traced pass', 4, 10);
  ctx.fillText(`(${fmtNs(step * 1e6)} per tick)`, 4, 22);
}

/** The selected span boxed in black, its related spans boxed and joined to it (red: correlated, green: child). */
export function drawSelection(ctx: CanvasRenderingContext2D, g: Geometry, xOf: XOf, sel: ISelection | null, bands: Band[]): void {
  if (!sel || !bands.includes(sel.band)) {
    return;
  }
  const band = sel.band;
  const box = (s: ISpanRef) => {
    const xa = xOf(band.rel(s.start_ns), g);
    const xb = Math.max(xOf(band.rel(s.end_ns), g), xa + 2);
    const yy = band.trackY(s.track);
    return { xa, xb, yy };
  };
  const me = box(sel.links.span);
  ctx.lineWidth = 2;
  for (const r of sel.links.related) {
    const b = box(r);
    const linked = r.relation?.startsWith('correlated') || r.relation?.startsWith('same external id');
    ctx.strokeStyle = linked ? '#d62728' : r.relation === 'child' ? '#2ca02c' : '#9467bd';
    ctx.strokeRect(b.xa, b.yy - 6, b.xb - b.xa, 12);
    ctx.beginPath();
    ctx.moveTo((me.xa + me.xb) / 2, me.yy);
    ctx.lineTo(Math.min(Math.max((b.xa + b.xb) / 2, g.gutter), g.gutter + g.plotW), b.yy);
    ctx.stroke();
  }
  ctx.strokeStyle = '#000';
  ctx.strokeRect(me.xa - 1, me.yy - 7, me.xb - me.xa + 2, 14);
  ctx.lineWidth = 1;
}

/** Brushed ranges (ms on the shared axis) shaded from the axis down to ``h``, each with its alpha. */
export function drawBrush(ctx: CanvasRenderingContext2D, g: Geometry, h: number, xOf: XOf, ranges: [IRange | null, number][]): void {
  for (const [r, alpha] of ranges) {
    if (!r) {
      continue;
    }
    const a = xOf(Math.min(r.x0, r.x1), g);
    const b = xOf(Math.max(r.x0, r.x1), g);
    ctx.fillStyle = `rgba(31,119,180,${alpha})`;
    ctx.fillRect(a, AXIS_H, b - a, h - AXIS_H);
  }
}
