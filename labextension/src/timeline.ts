/**
 * The timeline of one or more stored traces, drawn on a canvas from the server's level-of-detail tiles.
 *
 * Each trace is a band: its tracks (level · device · thread/stream), then its counters strip. Bands share one
 * relative time axis: 0 is each trace's traced pass (its first span below APPLICATION level), so two runs
 * stacked (A/B) line up. Wheel: zoom around the cursor; drag: pan; shift+drag (or the Brush button): select a
 * range, whose spans are tabulated per name (count, total and self time); hover: the span or merged block;
 * click: the span's links (its layer, its children, a kernel and its launch); search: spans by name.
 */
import { Widget } from '@lumino/widgets';

import { ICounters, ILinks, ISearch, ISpanRef, ISummary, ITile, ITraceMeta, requestAPI, tracePath } from './api';
import { fmtNs } from './format';
import { renderDetails, tooltipRows } from './details';
import { Band, Geometry, HEADER_H } from './band';
import { phaseRows } from './phases';
import { AXIS_H, IRange, ISelection, drawAxis, drawBrush, drawSelection } from './overlays';

const GUTTER = 230;

export interface ITimelineProbe {
  created_ms: number;
  first_paint_ms: number | null;
  last_input_ms: number | null;
  last_fresh_paint_ms: number | null;
  paints: number;
  marks: number;
}

export class TimelineWidget extends Widget {
  readonly probe: ITimelineProbe = {
    created_ms: performance.now(),
    first_paint_ms: null,
    last_input_ms: null,
    last_fresh_paint_ms: null,
    paints: 0,
    marks: 0
  };

  constructor() {
    super();
    this.addClass('mlms-timeline');
    this.title.closable = true;
    this.title.label = 'mlms timeline';
    const bar = this.node.appendChild(document.createElement('div'));
    bar.className = 'mlms-tl-toolbar';
    this.searchBox = bar.appendChild(document.createElement('input'));
    this.searchBox.type = 'search';
    this.searchBox.className = 'mlms-tl-search';
    this.searchBox.placeholder = 'search spans by name';
    this.searchBox.oninput = () => {
      window.clearTimeout(this.searchTimer);
      this.searchTimer = window.setTimeout(() => void this.search(this.searchBox.value), 250);
    };
    this.button(bar, '◀', 'previous match', () => this.gotoMatch(-1));
    this.button(bar, '▶', 'next match', () => this.gotoMatch(1));
    this.button(bar, 'Traced pass', 'show the traced pass of every trace', () => this.resetView());
    this.brushBtn = this.button(bar, 'Brush', 'drag to select a range (or shift+drag)', () => {
      this.brushMode = !this.brushMode;
      this.brushBtn.classList.toggle('mlms-on', this.brushMode);
    });
    this.status = bar.appendChild(document.createElement('span'));
    this.status.className = 'mlms-tl-status';
    this.scroller = this.node.appendChild(document.createElement('div'));
    this.scroller.className = 'mlms-tl-scroller';
    this.canvas = this.scroller.appendChild(document.createElement('canvas'));
    this.canvas.className = 'mlms-tl-canvas';
    this.tooltip = this.scroller.appendChild(document.createElement('div'));
    this.tooltip.className = 'mlms-tl-tooltip';
    this.details = this.node.appendChild(document.createElement('div'));
    this.details.className = 'mlms-tl-details';
    this.canvas.addEventListener('wheel', e => this.onWheel(e), { passive: false });
    this.canvas.addEventListener('mousedown', e => this.onDown(e));
    this.canvas.addEventListener('mousemove', e => this.onHover(e));
    this.canvas.addEventListener('mouseleave', () => (this.tooltip.style.display = 'none'));
    this.canvas.addEventListener('dblclick', e => this.onDoubleClick(e));
    (window as any).mlmsTimelines = [...((window as any).mlmsTimelines || []), this];
  }

  /** Add a stored trace as a band below the others (A/B: shared relative axis). */
  async addTrace(evaluationId: string, framework: string, label: string): Promise<void> {
    const meta = await requestAPI<ITraceMeta>(tracePath(evaluationId, framework));
    const band = new Band(meta, label);
    this.bands.push(band);
    this.title.label = this.bands.map(b => b.label).join(' | ');
    this.title.caption = this.bands.map(b => `${b.label} (${meta.n_spans.toLocaleString()} spans)`).join('\n');
    if (this.bands.length === 1 || !this.view) {
      this.resetView();
    } else {
      this.refetch();
    }
    void this.loadCounters(band);
    if (this.searchBox.value) {
      void this.search(this.searchBox.value);
    }
  }

  hasTrace(evaluationId: string, framework: string): boolean {
    return this.bands.some(b => b.meta.evaluation_id === evaluationId && b.meta.framework === framework);
  }

  /** The shared window, ms on the relative axis. */
  setView(x0: number, x1: number): void {
    if (!(x1 > x0)) {
      return;
    }
    this.view = { x0, x1 };
    this.probe.last_input_ms = performance.now();
    this.probe.last_fresh_paint_ms = null;
    this.refetch();
    this.schedule();
  }

  getView(): { x0: number; x1: number } | null {
    return this.view ? { ...this.view } : null;
  }

  /** The marks of the current tiles inside the view, in client coordinates (for tests and the benchmark). */
  visibleMarks(): { band: number; x: number; y: number; w: number; n: number; name: string }[] {
    if (!this.view) {
      return [];
    }
    const g = this.geometry();
    const rect = this.canvas.getBoundingClientRect();
    const out: { band: number; x: number; y: number; w: number; n: number; name: string }[] = [];
    this.bands.forEach((band, b) => {
      const t = band.tile;
      for (let i = 0; t && i < t.start.length; i++) {
        const xa = Math.max(this.xOf(band.rel(t.start[i]), g), g.gutter);
        const xb = Math.min(this.xOf(band.rel(t.end[i]), g), g.gutter + g.plotW);
        if (xb >= xa) {
          const name = band.meta.names[band.meta.sigs.name[t.sig[i]]];
          out.push({ band: b, x: rect.left + (xa + xb) / 2, y: rect.top + band.trackY(t.track[i]), w: xb - xa, n: t.n[i], name });
        }
      }
    });
    return out;
  }

  /** The phase bands drawn (a generate run's prefill and decode steps), in client coordinates (for tests). */
  visiblePhases(): { band: number; x0: number; x1: number; y: number; label: string; phase: string; n: number }[] {
    if (!this.view) {
      return [];
    }
    const g = this.geometry();
    const rect = this.canvas.getBoundingClientRect();
    return this.bands.flatMap((band, b) =>
      band.phases(g, this.xOf.bind(this)).map(m => ({
        band: b,
        x0: rect.left + Math.max(m.x0, g.gutter),
        x1: rect.left + Math.min(m.x1, g.gutter + g.plotW),
        y: rect.top + band.top + HEADER_H + band.phaseH() / 2, // the strip, under the band's header
        label: m.label,
        phase: m.phase,
        n: m.n
      }))
    );
  }

  bandCount(): number {
    return this.bands.length;
  }

  resetView(): void {
    const extent = Math.max(...this.bands.map(b => (b.meta.focus_ns[1] - b.meta.focus_ns[0]) / 1e6), 1e-6);
    this.setView(-extent * 0.01, extent * 1.01);
  }

  protected onResize(): void {
    this.refetch();
    this.schedule();
  }

  protected onAfterShow(): void {
    this.schedule();
  }

  protected onCloseRequest(msg: any): void {
    (window as any).mlmsTimelines = ((window as any).mlmsTimelines || []).filter((w: any) => w !== this);
    super.onCloseRequest(msg);
    this.dispose();
  }

  // ------------------------------------------------------------------------------------- geometry

  private geometry(): Geometry {
    const width = Math.max(this.scroller.clientWidth, 200);
    return { width, plotW: Math.max(width - GUTTER - 8, 50), gutter: GUTTER, view: this.view! };
  }

  private xOf(ms: number, g: Geometry): number {
    return g.gutter + ((ms - g.view.x0) / (g.view.x1 - g.view.x0)) * g.plotW;
  }

  private msOf(x: number, g: Geometry): number {
    return g.view.x0 + ((x - g.gutter) / g.plotW) * (g.view.x1 - g.view.x0);
  }

  // ------------------------------------------------------------------------------------- data

  private refetch(): void {
    if (!this.view || !this.isAttached) {
      return;
    }
    const g = this.geometry();
    for (const band of this.bands) {
      band.want(g, tile => {
        this.probe.marks = tile.count;
        this.schedule();
      });
      this.loadCountersDebounced(band);
    }
  }

  private loadCountersDebounced(band: Band): void {
    window.clearTimeout(band.countersTimer);
    band.countersTimer = window.setTimeout(() => void this.loadCounters(band), 120);
  }

  private async loadCounters(band: Band): Promise<void> {
    if (!this.view) {
      return;
    }
    const g = this.geometry();
    const [s, e] = band.window(g.view.x0, g.view.x1);
    try {
      band.counters = await requestAPI<ICounters>(tracePath(band.meta.evaluation_id, band.meta.framework, 'counters'), {
        start_ns: Math.floor(s),
        end_ns: Math.ceil(e),
        width_px: Math.round(g.plotW)
      });
      this.schedule();
    } catch (err) {
      band.error = (err as Error).message;
    }
  }

  private async search(text: string): Promise<void> {
    this.matchIndex = -1;
    for (const band of this.bands) {
      band.search = text.trim()
        ? await requestAPI<ISearch>(tracePath(band.meta.evaluation_id, band.meta.framework, 'search'), { q: text })
        : null;
    }
    this.schedule();
  }

  private gotoMatch(step: number): void {
    const hits: [Band, ISpanRef][] = [];
    for (const band of this.bands) {
      for (const s of band.search?.first || []) {
        hits.push([band, s]);
      }
    }
    if (!hits.length) {
      return;
    }
    this.matchIndex = (this.matchIndex + step + hits.length) % hits.length;
    const [band, span] = hits[this.matchIndex];
    this.zoomTo(band, span);
  }

  private zoomTo(band: Band, span: ISpanRef): void {
    const s = band.rel(span.start_ns);
    const e = band.rel(span.end_ns);
    const pad = Math.max((e - s) * 2, 1e-4);
    this.setView(s - pad, e + pad);
    void this.select(band, span.ref);
  }

  private async select(band: Band, ref: number): Promise<void> {
    const links = await requestAPI<ILinks>(tracePath(band.meta.evaluation_id, band.meta.framework, 'links'), { ref });
    this.selection = { band, links };
    this.renderDetails();
    this.schedule();
  }

  private async brush(x0: number, x1: number): Promise<void> {
    const lo = Math.min(x0, x1);
    const hi = Math.max(x0, x1);
    this.brushRange = { x0: lo, x1: hi };
    const tables: [Band, ISummary][] = [];
    for (const band of this.bands) {
      const [s, e] = band.window(lo, hi);
      tables.push([
        band,
        await requestAPI<ISummary>(tracePath(band.meta.evaluation_id, band.meta.framework, 'summary'), {
          start_ns: Math.floor(s),
          end_ns: Math.ceil(e)
        })
      ]);
    }
    this.summaries = tables;
    this.renderDetails();
    this.schedule();
  }

  // ------------------------------------------------------------------------------------- input

  private onWheel(e: WheelEvent): void {
    if (!this.view) {
      return;
    }
    e.preventDefault();
    const g = this.geometry();
    const rect = this.canvas.getBoundingClientRect();
    const x = Math.min(Math.max(e.clientX - rect.left, g.gutter), g.gutter + g.plotW);
    const { x0, x1 } = this.view;
    const span = x1 - x0;
    if (e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY)) {
      const d = ((e.shiftKey ? e.deltaY : e.deltaX) / g.plotW) * span;
      this.setView(x0 + d, x1 + d);
      return;
    }
    const at = this.msOf(x, g);
    const k = Math.exp(e.deltaY * 0.002);
    const newSpan = Math.max(span * k, 1e-6);
    this.setView(at - ((at - x0) / span) * newSpan, at + ((x1 - at) / span) * newSpan);
  }

  private onDown(e: MouseEvent): void {
    if (!this.view || e.button !== 0) {
      return;
    }
    const g = this.geometry();
    const rect = this.canvas.getBoundingClientRect();
    const startX = e.clientX - rect.left;
    const startView = { ...this.view };
    const brushing = e.shiftKey || this.brushMode;
    let moved = false;
    const move = (ev: MouseEvent) => {
      const x = ev.clientX - rect.left;
      moved = moved || Math.abs(x - startX) > 3;
      if (!moved) {
        return;
      }
      if (brushing) {
        this.brushDraft = { x0: this.msOf(startX, g), x1: this.msOf(x, g) };
        this.schedule();
      } else {
        const d = ((x - startX) / g.plotW) * (startView.x1 - startView.x0);
        this.setView(startView.x0 - d, startView.x1 - d);
      }
    };
    const up = (ev: MouseEvent) => {
      window.removeEventListener('mousemove', move);
      window.removeEventListener('mouseup', up);
      const x = ev.clientX - rect.left;
      if (brushing && moved) {
        this.brushDraft = null;
        void this.brush(this.msOf(startX, g), this.msOf(x, g));
      } else if (!moved) {
        const hit = this.hitTest(startX, e.clientY - rect.top);
        if (hit) {
          void this.select(hit.band, hit.tile.ref[hit.i]);
        }
      }
    };
    window.addEventListener('mousemove', move);
    window.addEventListener('mouseup', up);
  }

  private onDoubleClick(e: MouseEvent): void {
    const rect = this.canvas.getBoundingClientRect();
    const hit = this.hitTest(e.clientX - rect.left, e.clientY - rect.top);
    if (hit) {
      const { band, tile, i } = hit;
      const s = band.rel(tile.start[i]);
      const d = Math.max(band.rel(tile.end[i]) - s, 1e-4);
      this.setView(s - d * 0.1, s + d * 1.1);
    }
  }

  private hitTest(x: number, y: number): { band: Band; tile: ITile; i: number } | null {
    if (!this.view) {
      return null;
    }
    const g = this.geometry();
    for (const band of this.bands) {
      const track = band.trackAt(y);
      const tile = band.tile;
      if (track < 0 || !tile) {
        continue;
      }
      const ms = this.msOf(x, g);
      const slack = (2 * (g.view.x1 - g.view.x0)) / g.plotW; // 2 px
      let best = -1;
      let bestDur = Infinity;
      for (let i = 0; i < tile.start.length; i++) {
        if (tile.track[i] !== track) {
          continue;
        }
        const s = band.rel(tile.start[i]);
        const e = band.rel(tile.end[i]);
        if (ms >= s - slack && ms <= e + slack && e - s < bestDur) {
          best = i;
          bestDur = e - s;
        }
      }
      return best >= 0 ? { band, tile, i: best } : null;
    }
    return null;
  }

  private onHover(e: MouseEvent): void {
    if (e.buttons) {
      return;
    }
    const rect = this.canvas.getBoundingClientRect();
    const x = e.clientX - rect.left;
    const y = e.clientY - rect.top;
    const hit = this.hitTest(x, y);
    let rows: [string, string][] | null = hit ? tooltipRows(hit.band, hit.tile, hit.i) : null;
    if (!rows && this.view) {
      // no span here: the phase band behind (a generate run's step), if any
      const g = this.geometry();
      for (const band of this.bands) {
        const m = band.phaseAt(x, y, g, this.xOf.bind(this));
        if (m) {
          rows = phaseRows(m, band.meta.focus_ns[0]);
          break;
        }
      }
    }
    if (!rows) {
      this.tooltip.style.display = 'none';
      return;
    }
    this.tooltip.replaceChildren(
      ...rows.map(([k, v]) => {
        const row = document.createElement('div');
        const key = row.appendChild(document.createElement('b'));
        key.textContent = `${k}: `;
        row.appendChild(document.createTextNode(v));
        return row;
      })
    );
    this.tooltip.style.display = 'block';
    this.tooltip.style.left = `${Math.min(x + 14, this.scroller.clientWidth - 320)}px`;
    this.tooltip.style.top = `${y + 14}px`;
  }

  private button(bar: HTMLElement, text: string, title: string, click: () => void): HTMLButtonElement {
    const b = bar.appendChild(document.createElement('button'));
    b.className = 'mlms-btn';
    b.textContent = text;
    b.title = title;
    b.onclick = click;
    return b;
  }

  // ------------------------------------------------------------------------------------- drawing

  private schedule(): void {
    if (this.frame || this.isDisposed) {
      return;
    }
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.paint();
    });
  }

  private paint(): void {
    if (!this.view || !this.isVisible) {
      return;
    }
    const g = this.geometry();
    let y = AXIS_H;
    for (const band of this.bands) {
      band.top = y;
      y += band.height();
    }
    const dpr = window.devicePixelRatio || 1;
    const h = Math.max(y + 10, 80);
    if (this.canvas.width !== Math.round(g.width * dpr) || this.canvas.height !== Math.round(h * dpr)) {
      this.canvas.width = Math.round(g.width * dpr);
      this.canvas.height = Math.round(h * dpr);
      this.canvas.style.width = `${g.width}px`;
      this.canvas.style.height = `${h}px`;
    }
    const ctx = this.canvas.getContext('2d')!;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, g.width, h);
    ctx.font = '11px var(--jp-ui-font-family, sans-serif)';
    const xOf = this.xOf.bind(this);
    drawAxis(ctx, g, h, xOf, getComputedStyle(this.node).getPropertyValue('--jp-ui-font-color1') || '#222');
    let fresh = this.bands.length > 0;
    let marks = 0;
    for (const band of this.bands) {
      marks += band.draw(ctx, g, xOf);
      fresh = fresh && band.isFresh(g);
    }
    drawSelection(ctx, g, xOf, this.selection, this.bands);
    drawBrush(ctx, g, h, xOf, [
      [this.brushRange, 0.12],
      [this.brushDraft, 0.2]
    ]);
    this.probe.paints++;
    const level = this.bands[0]?.tile;
    const perPx = ((g.view.x1 - g.view.x0) / g.plotW) * 1e6;
    this.status.textContent =
      `${fmtNs(perPx)} per pixel · ${marks.toLocaleString()} marks` +
      (level ? ` · level ${level.level}${level.level >= level.raw_level ? ' (every span)' : ''}` : '') +
      (this.bands.some(b => b.search) ? ` · ${this.bands.reduce((n, b) => n + (b.search?.matches || 0), 0).toLocaleString()} matches` : '') +
      (this.bands.some(b => b.error) ? ` · ${this.bands.find(b => b.error)!.error}` : '');
    this.node.dataset.marks = String(marks);
    this.node.dataset.phases = String(this.bands.reduce((n, b) => n + b.phases(g, this.xOf.bind(this)).length, 0));
    this.node.dataset.level = String(level?.level ?? '');
    if (fresh) {
      const now = performance.now();
      if (this.probe.first_paint_ms === null) {
        this.probe.first_paint_ms = now;
      }
      if (this.probe.last_fresh_paint_ms === null) {
        this.probe.last_fresh_paint_ms = now;
      }
      this.node.dataset.state = 'idle';
    } else {
      this.node.dataset.state = 'loading';
    }
  }

  private renderDetails(): void {
    this.details.replaceChildren(...renderDetails(this.selection, this.summaries, (band, span) => this.zoomTo(band, span)));
  }

  private bands: Band[] = [];
  private view: { x0: number; x1: number } | null = null;
  private frame = 0;
  private brushMode = false;
  private brushDraft: IRange | null = null;
  private brushRange: IRange | null = null;
  private summaries: [Band, ISummary][] = [];
  private selection: ISelection | null = null;
  private matchIndex = -1;
  private searchTimer = 0;
  private canvas: HTMLCanvasElement;
  private scroller: HTMLDivElement;
  private tooltip: HTMLDivElement;
  private details: HTMLDivElement;
  private status: HTMLSpanElement;
  private searchBox: HTMLInputElement;
  private brushBtn: HTMLButtonElement;
}
