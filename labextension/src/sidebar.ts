/** The left-sidebar panel: the runs in the history store, filtered and searched, refreshed when one lands. */
import { Widget } from '@lumino/widgets';

import { IRun, IRunsReply, requestAPI } from './api';
import { fmtAgo } from './format';

export const POLL_MS = 3000;

export interface IOpenRequest {
  evaluation_id: string;
  framework?: string;
  compare?: boolean;
}

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  cls = '',
  text = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (cls) {
    node.className = cls;
  }
  if (text) {
    node.textContent = text;
  }
  return node;
}

export class RunsSidebar extends Widget {
  constructor(private open: (req: IOpenRequest) => void) {
    super();
    this.id = 'mlms-runs';
    this.addClass('mlms-runs');
    this.title.caption = 'mlms-nb runs';
    const head = el('div', 'mlms-runs-head');
    head.appendChild(el('h3', '', 'mlms-nb runs'));
    const refresh = el('button', 'mlms-btn', 'Refresh');
    refresh.title = 'read the history store again';
    refresh.onclick = () => void this.refresh(true);
    head.appendChild(refresh);
    this.node.appendChild(head);
    const controls = el('div', 'mlms-runs-controls');
    this.search = el('input', 'mlms-runs-search');
    this.search.type = 'search';
    this.search.placeholder = 'filter: model, framework, dataset, id';
    this.search.oninput = () => this.render();
    this.filter = el('select', 'mlms-runs-filter');
    for (const [value, label] of [
      ['all', 'all runs'],
      ['traced', 'traced only'],
      ['complete', 'complete only'],
      ['partial', 'partial only']
    ]) {
      const opt = el('option', '', label);
      opt.value = value;
      this.filter.appendChild(opt);
    }
    this.filter.onchange = () => this.render();
    controls.append(this.search, this.filter);
    this.node.appendChild(controls);
    this.status = el('div', 'mlms-runs-status', 'loading runs…');
    this.node.appendChild(this.status);
    this.list = el('ul', 'mlms-runs-list');
    this.node.appendChild(this.list);
  }

  /** The newest traced run, for the launcher item (null when none). */
  latestTraced(): IRun | null {
    return this.runs.find(r => r.traces.length > 0) || null;
  }

  async refresh(force = false): Promise<void> {
    try {
      const reply = await requestAPI<IRunsReply>('runs', force || !this.version ? {} : { since: this.version });
      const failed = !!this.error;
      this.error = '';
      if (!reply.unchanged) {
        this.store = reply.store;
        this.version = reply.version;
        this.runs = reply.runs;
        this.render();
      } else if (failed) {
        this.render();
      }
    } catch (err) {
      this.error = `could not read the runs: ${(err as Error).message}`;
      this.render();
    }
  }

  protected onAfterAttach(): void {
    void this.refresh(true);
    this.timer = window.setInterval(() => {
      if (this.isVisible) {
        void this.refresh();
      }
    }, POLL_MS);
  }

  protected onBeforeDetach(): void {
    window.clearInterval(this.timer);
  }

  protected onAfterShow(): void {
    void this.refresh();
  }

  private matches(run: IRun): boolean {
    const f = this.filter.value;
    if ((f === 'traced' && !run.traces.length) || (f === 'complete' && !run.complete) || (f === 'partial' && run.complete)) {
      return false;
    }
    const words = this.search.value.toLowerCase().split(/\s+/).filter(Boolean);
    const text = [run.model, run.model_version, run.evaluation_id, run.dataset || '', ...run.frameworks, ...run.trace_levels]
      .join(' ')
      .toLowerCase();
    return words.every(w => text.includes(w));
  }

  private render(): void {
    const shown = this.runs.filter(r => this.matches(r));
    this.status.textContent = this.error
      ? this.error
      : `${shown.length} of ${this.runs.length} runs · store: ${this.store} · refreshed every ${POLL_MS / 1000} s`;
    this.status.classList.toggle('mlms-error', !!this.error);
    this.list.replaceChildren(...shown.map(run => this.item(run)));
  }

  private item(run: IRun): HTMLElement {
    const li = el('li', 'mlms-run');
    li.dataset.evaluationId = run.evaluation_id;
    const title = el('div', 'mlms-run-title');
    title.appendChild(el('span', 'mlms-run-model', `${run.model} @${run.model_version}`));
    title.appendChild(
      el('span', `mlms-badge ${run.complete ? 'mlms-complete' : 'mlms-partial'}`, run.complete ? 'complete' : 'partial')
    );
    li.appendChild(title);
    const levels = run.trace_levels.length ? run.trace_levels.join(', ') : 'not traced';
    li.appendChild(
      el(
        'div',
        'mlms-run-facts',
        `${run.frameworks.join(', ')} · batch ${run.batch_sizes.join(', ')} · trace ${levels} · ${fmtAgo(run.created_at)}`
      )
    );
    const ident = el('div', 'mlms-run-id', `${run.evaluation_id.slice(0, 12)}… · ${run.dataset || 'no dataset'}`);
    ident.title = `evaluation ${run.evaluation_id}; history rows ${run.history_ids.join(', ')}; created ${run.created_at}`;
    li.appendChild(ident);
    if (run.traces.length) {
      const chips = el('div', 'mlms-run-traces');
      for (const t of run.traces) {
        if (t.unreadable) {
          // a damaged trace breaks only itself: marked, with why, and not offered for opening
          const bad = el('span', 'mlms-chip mlms-unreadable', `${t.framework} · trace unreadable`);
          bad.title = t.unreadable;
          chips.appendChild(bad);
          continue;
        }
        const open = el('button', 'mlms-chip', `${t.framework} · ${t.spans.toLocaleString()} spans`);
        open.title = `open the ${t.framework} trace (${t.trace_level}) in a timeline`;
        open.dataset.framework = t.framework;
        open.onclick = () => this.open({ evaluation_id: run.evaluation_id, framework: t.framework });
        const ab = el('button', 'mlms-chip mlms-ab', '+ A/B');
        ab.title = `add the ${t.framework} trace below the timeline open now (shared relative time axis)`;
        ab.onclick = () => this.open({ evaluation_id: run.evaluation_id, framework: t.framework, compare: true });
        chips.append(open, ab);
      }
      if (run.traces.filter(t => !t.unreadable).length > 1) {
        const all = el('button', 'mlms-chip', 'all stacked');
        all.title = 'open every framework of this run, one above the other';
        all.onclick = () => this.open({ evaluation_id: run.evaluation_id });
        chips.appendChild(all);
      }
      li.appendChild(chips);
    }
    return li;
  }

  private runs: IRun[] = [];
  private version = '';
  private store = '';
  private error = '';
  private timer = 0;
  private search: HTMLInputElement;
  private filter: HTMLSelectElement;
  private status: HTMLDivElement;
  private list: HTMLUListElement;
}
