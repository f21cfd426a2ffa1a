/** One trace in a timeline: its tracks and counters strip, its current tile, and how they are drawn. */
import { ICounters, ISearch, ITile, ITraceMeta, requestAPI, tracePath } from './api';
import { fmtValue } from './format';
import { IPhaseMark, PHASE_H, drawLegend, drawPhases, phaseMarks } from './phases';

export const HEADER_H = 18;
export const TRACK_H = 14;
export const COUNTER_H = 24;
export const GAP = 12;

export interface Geometry {
  width: number;
  plotW: number;
  gutter: number;
  view: { x0: number; x1: number };
}

/** A tile is re-requested when the view leaves it or its pixel differs from the view's by more than this. */
const RESOLUTION_SLACK = 1.5;
/** Each request covers the view plus this fraction of it on either side, so a pan redraws at once. */
const MARGIN = 0.5;

export class Band {
  tile: ITile | null = null;
  tileWindow: [number, number] | null = null;
  counters: ICounters | null = null;
  countersTimer = 0;
  search: ISearch | null = null;
  error = '';
  top = 0;

  constructor(
    readonly meta: ITraceMeta,
    readonly label: string
  ) {}

  /** ms on the shared axis -> ns on this trace's index clock (0 = first span). */
  ns(ms: number): number {
    return this.meta.focus_ns[0] + ms * 1e6;
  }

  /** ns on this trace's index clock -> ms on the shared axis (0 = the traced pass). */
  rel(ns: number): number {
    return (ns - this.meta.focus_ns[0]) / 1e6;
  }

  window(x0: number, x1: number): [number, number] {
    return [this.ns(x0), this.ns(x1)];
  }

  countersHeight(): number {
    return Math.max(this.counters?.series.length || 0, 1) * COUNTER_H;
  }

  /** The phase strip's height: 0 unless the trace is a generate run's (its meta has phases). */
  phaseH(): number {
    return this.meta.phases?.length ? PHASE_H : 0;
  }

  height(): number {
    return HEADER_H + this.phaseH() + this.meta.tracks.length * TRACK_H + this.countersHeight() + GAP;
  }

  trackY(track: number): number {
    return this.top + HEADER_H + this.phaseH() + track * TRACK_H + TRACK_H / 2;
  }

  trackAt(y: number): number {
    const t = Math.floor((y - this.top - HEADER_H - this.phaseH()) / TRACK_H);
    return t >= 0 && t < this.meta.tracks.length ? t : -1;
  }

  /** The phase bands in the view (px), computed once per view and width: a paint only draws them. */
  phases(g: Geometry, xOf: (ms: number, g: Geometry) => number): IPhaseMark[] {
    const key = `${g.view.x0}:${g.view.x1}:${g.plotW}:${g.gutter}`;
    if (this.phaseKey !== key) {
      const span = g.view.x1 - g.view.x0;
      this.phaseCache = phaseMarks(
        this.meta.phases || [],
        ns => xOf(this.rel(ns), g),
        x => this.ns(g.view.x0 + ((x - g.gutter) / g.plotW) * span),
        g.gutter,
        g.gutter + g.plotW
      );
      this.phaseKey = key;
    }
    return this.phaseCache;
  }

  /** The phase band under (x, y) when y is on the strip or the tracks, else null. */
  phaseAt(x: number, y: number, g: Geometry, xOf: (ms: number, g: Geometry) => number): IPhaseMark | null {
    const top = this.top + HEADER_H;
    if (!this.phaseH() || y < top || y >= top + this.phaseH() + this.meta.tracks.length * TRACK_H) {
      return null;
    }
    return this.phases(g, xOf).find(m => x >= m.x0 - 1 && x <= Math.max(m.x1, m.x0 + 1) + 1) || null;
  }

  /** Whether the current tile covers the view at (about) the view's resolution. */
  isFresh(g: Geometry): boolean {
    if (!this.tile || !this.tileWindow) {
      return false;
    }
    const [s, e] = this.window(g.view.x0, g.view.x1);
    const perPx = (e - s) / g.plotW;
    const ratio = this.tile.ns_per_px / perPx;
    return this.tileWindow[0] <= s && this.tileWindow[1] >= e && ratio < RESOLUTION_SLACK && ratio > 1 / RESOLUTION_SLACK;
  }

  /** Ask for a tile covering the view (unless the current one does); ``done`` when it arrives. */
  want(g: Geometry, done: (tile: ITile) => void): void {
    if (this.isFresh(g)) {
      return;
    }
    const [s, e] = this.window(g.view.x0, g.view.x1);
    const pad = (e - s) * MARGIN;
    const start = Math.floor(s - pad);
    const end = Math.ceil(e + pad);
    const width = Math.max(10, Math.round(g.plotW * (1 + 2 * MARGIN)));
    if (this.pending && this.pendingKey === `${start}:${end}:${width}`) {
      return;
    }
    this.pending?.abort();
    const ctl = new AbortController();
    this.pending = ctl;
    this.pendingKey = `${start}:${end}:${width}`;
    requestAPI<ITile>(
      tracePath(this.meta.evaluation_id, this.meta.framework, 'tiles'),
      { start_ns: start, end_ns: end, width_px: width },
      ctl.signal
    )
      .then(tile => {
        if (this.pending !== ctl) {
          return;
        }
        this.pending = null;
        this.tile = tile;
        this.tileWindow = [start, end];
        this.error = '';
        done(tile);
      })
      .catch(err => {
        if (this.pending === ctl && (err as Error).name !== 'AbortError') {
          this.pending = null;
          this.error = (err as Error).message;
        }
      });
  }

  /** Draw the band at ``this.top``; returns how many marks it drew. */
  draw(ctx: CanvasRenderingContext2D, g: Geometry, xOf: (ms: number, g: Geometry) => number): number {
    const fg = getComputedStyle(document.body).getPropertyValue('--jp-ui-font-color1').trim() || '#222';
    ctx.fillStyle = fg;
    ctx.textBaseline = 'middle';
    ctx.textAlign = 'left';
    ctx.font = 'bold 11px var(--jp-ui-font-family, sans-serif)';
    ctx.fillText(
      `${this.label} · ${this.meta.n_spans.toLocaleString()} spans${this.tile ? '' : ' · loading…'}`,
      4,
      this.top + HEADER_H / 2
    );
    ctx.font = '10px var(--jp-ui-font-family, sans-serif)';
    for (const t of this.meta.tracks) {
      const y = this.trackY(t.track);
      ctx.fillStyle = t.track % 2 ? 'rgba(128,128,128,0.06)' : 'rgba(128,128,128,0.12)';
      ctx.fillRect(g.gutter, y - TRACK_H / 2, g.plotW, TRACK_H);
      ctx.fillStyle = fg;
      ctx.fillText(t.label.length > 38 ? t.label.slice(0, 37) + '…' : t.label, 4, y);
    }
    if (this.phaseH()) {
      const stripY = this.top + HEADER_H;
      const y1 = stripY + PHASE_H + this.meta.tracks.length * TRACK_H;
      drawLegend(ctx, this.meta.phases!, stripY + PHASE_H / 2, fg);
      drawPhases(ctx, this.phases(g, xOf), stripY, stripY + PHASE_H, y1, g.gutter, g.gutter + g.plotW);
    }
    let marks = 0;
    const tile = this.tile;
    if (tile) {
      const sigs = this.meta.sigs;
      const hits = this.search ? new Set(this.search.name_ids) : null;
      ctx.save();
      ctx.beginPath();
      ctx.rect(g.gutter, this.top, g.plotW, this.height());
      ctx.clip();
      const x0 = g.gutter - 2;
      const x1 = g.gutter + g.plotW + 2;
      for (let i = 0; i < tile.start.length; i++) {
        let xa = xOf(this.rel(tile.start[i]), g);
        let xb = xOf(this.rel(tile.end[i]), g);
        if (xb < x0 || xa > x1) {
          continue;
        }
        xa = Math.max(xa, x0);
        xb = Math.min(Math.max(xb, xa + 1), x1);
        const s = tile.sig[i];
        const dur = tile.end[i] - tile.start[i];
        let alpha = tile.n[i] > 1 ? 0.25 + 0.55 * Math.min(1, tile.busy[i] / Math.max(dur, 1)) : 0.9;
        if (hits) {
          alpha = hits.has(sigs.name[s]) ? 1 : 0.12;
        }
        ctx.globalAlpha = alpha;
        ctx.fillStyle = sigs.colour[s];
        const y = this.trackY(tile.track[i]);
        ctx.fillRect(xa, y - TRACK_H / 2 + 1, xb - xa, TRACK_H - 2);
        marks++;
      }
      ctx.globalAlpha = 1;
      ctx.restore();
    }
    this.drawCounters(ctx, g, xOf, fg);
    return marks;
  }

  private drawCounters(
    ctx: CanvasRenderingContext2D,
    g: Geometry,
    xOf: (ms: number, g: Geometry) => number,
    fg: string
  ): void {
    let y = this.top + HEADER_H + this.phaseH() + this.meta.tracks.length * TRACK_H;
    const series = this.counters?.series || [];
    ctx.font = '10px var(--jp-ui-font-family, sans-serif)';
    if (!series.length) {
      ctx.fillStyle = fg;
      ctx.fillText(
        this.counters ? 'counters: none in this trace (trace at HARDWARE level for power, utilisation, memory)' : 'counters: loading…',
        4,
        y + COUNTER_H / 2
      );
      return;
    }
    for (const s of series) {
      const lo = s.lo ?? 0;
      const hi = s.hi ?? 1;
      const scale = (v: number) => y + COUNTER_H - 3 - ((v - lo) / Math.max(hi - lo, 1e-12)) * (COUNTER_H - 6);
      ctx.fillStyle = 'rgba(128,128,128,0.08)';
      ctx.fillRect(g.gutter, y + 1, g.plotW, COUNTER_H - 2);
      ctx.fillStyle = fg;
      ctx.fillText(`${s.label}: ${fmtValue(lo, s.unit)} – ${fmtValue(hi, s.unit)}`.slice(0, 44), 4, y + COUNTER_H / 2);
      ctx.save();
      ctx.beginPath();
      ctx.rect(g.gutter, y, g.plotW, COUNTER_H);
      ctx.clip();
      ctx.strokeStyle = '#ff7f0e';
      ctx.beginPath();
      let started = false;
      for (let i = 0; i < s.t_ns.length; i++) {
        const a = s.min[i];
        const b = s.max[i];
        if (a === null || b === null) {
          started = false;
          continue;
        }
        const x = xOf(this.rel(s.t_ns[i]), g);
        if (!started) {
          ctx.moveTo(x, scale(b));
          started = true;
        } else {
          ctx.lineTo(x, scale(b));
        }
        if (a !== b) {
          ctx.lineTo(x, scale(a));
        }
      }
      ctx.stroke();
      ctx.restore();
      y += COUNTER_H;
    }
  }

  private phaseKey = '';
  private phaseCache: IPhaseMark[] = [];
  private pending: AbortController | null = null;
  private pendingKey = '';
}
