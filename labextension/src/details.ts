/** What the timeline shows beside the canvas: the hover tooltip's rows, a selected span's links, and the
 * brushed range's table (count, total and self time per name). */
import { ILinks, ISpanRef, ISummary, ITile } from './api';
import { Band } from './band';
import { fmtFlops, fmtNs } from './format';

/** Label / value rows for mark ``i`` of ``tile``: a span (name, duration, shape, FLOPs, layer type) or a merged
 * block (how many spans, the longest, busy time). */
export function tooltipRows(band: Band, tile: ITile, i: number): [string, string][] {
  const sigs = band.meta.sigs;
  const s = tile.sig[i];
  const name = band.meta.names[sigs.name[s]];
  const n = tile.n[i];
  const dur = tile.end[i] - tile.start[i];
  const rows: [string, string][] =
    n > 1
      ? [
          ['spans merged', `${n.toLocaleString()} (narrower than a pixel here)`],
          ['longest', name],
          ['busy time', `${fmtNs(tile.busy[i])} (${((100 * tile.busy[i]) / Math.max(dur, 1)).toFixed(1)} % of the block)`],
          ['block extent', fmtNs(dur)]
        ]
      : [
          ['name', name],
          ['duration', fmtNs(dur)],
          ['shape', sigs.shape[s] || 'unknown'],
          ['FLOPs', fmtFlops(sigs.flops[s])],
          ['layer type', `${sigs.layer_type[s] || 'none'} (${sigs.kind[s]}, ${sigs.level[s]})`]
        ];
  rows.push(['start', `${fmtNs(tile.start[i] - band.meta.focus_ns[0])} from the traced pass`]);
  rows.push(['track', band.meta.tracks[tile.track[i]]?.label || '']);
  return rows;
}

/** The links of the selected span (each zooms to its span when clicked) and the brushed tables, per band. */
export function renderDetails(
  selection: { band: Band; links: ILinks } | null,
  summaries: [Band, ISummary][],
  zoomTo: (band: Band, span: ISpanRef) => void
): HTMLElement[] {
  const parts: HTMLElement[] = [];
  if (selection) {
    const { band, links } = selection;
    const box = document.createElement('div');
    box.className = 'mlms-tl-links';
    const h = box.appendChild(document.createElement('h4'));
    h.textContent = `${links.span.name} (${fmtNs(links.span.end_ns - links.span.start_ns)}) in ${band.label}: linked spans`;
    const ul = box.appendChild(document.createElement('ul'));
    if (!links.related.length) {
      ul.appendChild(document.createElement('li')).textContent = 'no parent, child or correlated span recorded';
    }
    for (const r of links.related) {
      const a = ul.appendChild(document.createElement('li')).appendChild(document.createElement('a'));
      a.textContent = `${r.relation}: ${r.name} (${fmtNs(r.end_ns - r.start_ns)}; ${band.meta.tracks[r.track]?.label})`;
      a.onclick = () => zoomTo(band, r);
    }
    parts.push(box);
  }
  for (const [band, sum] of summaries) {
    const box = document.createElement('div');
    box.className = 'mlms-tl-summary';
    box.appendChild(document.createElement('h4')).textContent =
      `${band.label}: ${sum.spans.toLocaleString()} spans start in ${fmtNs(band.rel(sum.start_ns) * 1e6)} .. ` +
      `${fmtNs(band.rel(sum.end_ns) * 1e6)} (${fmtNs(sum.end_ns - sum.start_ns)}), ${sum.names} names`;
    const table = box.appendChild(document.createElement('table'));
    table.className = 'mlms-tl-table';
    const head = table.appendChild(document.createElement('tr'));
    for (const c of ['name', 'count', 'total (ms)', 'self (ms)']) {
      head.appendChild(document.createElement('th')).textContent = c;
    }
    for (const r of sum.rows) {
      const tr = table.appendChild(document.createElement('tr'));
      tr.appendChild(document.createElement('td')).textContent = r.name;
      for (const v of [r.count.toLocaleString(), (r.total_ns / 1e6).toFixed(3), (r.self_ns / 1e6).toFixed(3)]) {
        const td = tr.appendChild(document.createElement('td'));
        td.textContent = v;
        td.className = 'mlms-num';
      }
    }
    box.appendChild(document.createElement('small')).textContent = sum.note;
    parts.push(box);
  }
  return parts;
}
