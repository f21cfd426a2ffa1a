/**
 * A generate run's phases (the prefill, decode step k) as bands behind a trace's spans: a strip under the band's
 * header with each phase in its colour and named where it is wide enough, a legend in the gutter, and a translucent
 * band over the tracks. The phases come with the trace's meta (``phases``: ns on the index clock, as the tiles).
 *
 * A long generation has thousands of decode steps: only the phases in the view are visited (binary search), and
 * a phase narrower than MIN_PX takes in its next neighbours of the same kind until the block is MIN_PX wide (drawn
 * and hovered as "decode steps a–b"), so a view draws at most about plotW / MIN_PX bands. The marks are computed once per view
 * and drawn from that list on every paint.
 */
import { IPhase } from './api';
import { fmtNs } from './format';

/** One colour per phase, as mlms_nb.analyses.phases.PHASE_COLOURS (Tableau 10: prefill blue, decode purple). */
export const PHASE_COLOURS: Record<string, string> = { prefill: '#1f77b4', decode: '#9467bd' };
const OTHER_COLOUR = '#7f7f7f';
export const PHASE_H = 14;
/** A band narrower than this (px) takes in the next phases of its kind until it is this wide. */
const MIN_PX = 3;
/** The translucent band over the tracks; the strip is drawn opaque. */
const BAND_ALPHA = 0.13;

export function phaseColour(phase: string): string {
  return PHASE_COLOURS[phase] || OTHER_COLOUR;
}

/** A drawn band: one phase, or a block of ``n`` consecutive phases of one kind merged (``first``..``last``). */
export interface IPhaseMark {
  x0: number;
  x1: number;
  phase: string;
  label: string;
  n: number;
  first: IPhase;
  last: IPhase;
  /** Summed duration of the merged phases (ns); a single phase's duration. */
  busy_ns: number;
}

/** The first index whose phase ends after ``ns`` (phases are sorted by start and do not overlap). */
function firstEndingAfter(phases: IPhase[], ns: number): number {
  let lo = 0;
  let hi = phases.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (phases[mid].end_ns <= ns) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

function markLabel(first: IPhase, last: IPhase, n: number): string {
  if (n === 1) {
    return first.label;
  }
  return first.phase === 'decode' ? `decode steps ${first.step}–${last.step}` : `${n} × ${first.phase}`;
}

/**
 * The bands of ``phases`` between ``x0`` and ``x1`` (px), with ``xOfNs`` mapping index-clock ns to px: each phase
 * at least MIN_PX wide on its own; a narrower one takes in the next phases of its kind until the block is MIN_PX wide.
 */
export function phaseMarks(phases: IPhase[], xOfNs: (ns: number) => number, nsOfX: (x: number) => number, x0: number, x1: number): IPhaseMark[] {
  const out: IPhaseMark[] = [];
  let cur: IPhaseMark | null = null;
  const flush = () => {
    if (cur) {
      cur.label = markLabel(cur.first, cur.last, cur.n);
      out.push(cur);
      cur = null;
    }
  };
  for (let i = firstEndingAfter(phases, nsOfX(x0)); i < phases.length; i++) {
    const p = phases[i];
    const a = xOfNs(p.start_ns);
    if (a > x1) {
      break;
    }
    const b = xOfNs(p.end_ns);
    const c = cur as IPhaseMark | null;
    if (c && c.phase === p.phase && c.x1 - c.x0 < MIN_PX) {
      c.x1 = b;
      c.last = p;
      c.n++;
      c.busy_ns += p.end_ns - p.start_ns;
      continue;
    }
    flush();
    cur = { x0: a, x1: b, phase: p.phase, label: '', n: 1, first: p, last: p, busy_ns: p.end_ns - p.start_ns };
  }
  flush();
  return out;
}

/** Draw the strip (at ``stripY``, opaque, named where wide enough) and the bands over the tracks (``y0``..``y1``). */
export function drawPhases(
  ctx: CanvasRenderingContext2D,
  marks: IPhaseMark[],
  stripY: number,
  y0: number,
  y1: number,
  clipX0: number,
  clipX1: number
): void {
  ctx.save();
  ctx.beginPath();
  ctx.rect(clipX0, stripY, clipX1 - clipX0, y1 - stripY);
  ctx.clip();
  ctx.font = '10px var(--jp-ui-font-family, sans-serif)';
  ctx.textBaseline = 'middle';
  ctx.textAlign = 'left';
  for (const m of marks) {
    const xa = Math.max(m.x0, clipX0 - 1);
    const w = Math.max(Math.min(m.x1, clipX1 + 1) - xa, 1);
    ctx.fillStyle = phaseColour(m.phase);
    ctx.globalAlpha = BAND_ALPHA;
    ctx.fillRect(xa, y0, w, y1 - y0);
    ctx.globalAlpha = 1;
    ctx.fillRect(xa, stripY + 1, Math.max(w - 1, 1), PHASE_H - 2);
    const text = m.label;
    if (w > 24) {
      ctx.fillStyle = '#fff';
      const room = w - 6;
      const fits = ctx.measureText(text).width <= room;
      const short = m.n === 1 && m.phase === 'decode' ? `d${m.first.step}` : '';
      const shown = fits ? text : short && ctx.measureText(short).width <= room ? short : '';
      if (shown) {
        ctx.fillText(shown, xa + 3, stripY + PHASE_H / 2);
      }
    }
  }
  ctx.restore();
}

/** The gutter's legend for the strip: the phases present, each with its colour. */
export function drawLegend(ctx: CanvasRenderingContext2D, phases: IPhase[], y: number, fg: string): void {
  const kinds = [...new Set(phases.map(p => p.phase))];
  ctx.font = '10px var(--jp-ui-font-family, sans-serif)';
  ctx.textBaseline = 'middle';
  ctx.textAlign = 'left';
  let x = 4;
  ctx.fillStyle = fg;
  ctx.fillText('phases:', x, y);
  x += ctx.measureText('phases: ').width;
  for (const k of kinds) {
    ctx.fillStyle = phaseColour(k);
    ctx.fillRect(x, y - 4, 8, 8);
    x += 11;
    ctx.fillStyle = fg;
    ctx.fillText(k, x, y);
    x += ctx.measureText(k).width + 8;
  }
}

/** The tooltip rows of a band: the step (or the merged steps), its batch size, duration and start, with units. */
export function phaseRows(m: IPhaseMark, focusNs: number): [string, string][] {
  const rows: [string, string][] = [['phase', m.label]];
  if (m.n > 1) {
    rows.push(['steps merged', `${m.n.toLocaleString()} (each narrower than ${MIN_PX} px here; zoom in for one)`]);
    rows.push(['time in these steps', fmtNs(m.busy_ns)]);
    rows.push(['extent', fmtNs(m.last.end_ns - m.first.start_ns)]);
  } else {
    rows.push(['duration', fmtNs(m.busy_ns)]);
  }
  const sizes = [...new Set([m.first.batch_size, m.last.batch_size])].filter(b => b >= 0);
  rows.push(['batch size', sizes.length ? sizes.join(', ') : 'unknown']);
  rows.push(['start', `${fmtNs(m.first.start_ns - focusNs)} from the traced pass`]);
  return rows;
}
