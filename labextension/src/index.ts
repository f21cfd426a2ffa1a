/**
 * mlms-nb in JupyterLab: the runs sidebar (left), timeline panels (main area), their commands in the palette
 * and the launcher, and two ways a notebook opens a run in a panel:
 *
 * - ``%mlms timeline RUN --panel`` opens a comm to the target ``mlms_nb.timeline`` with ``{evaluation_id,
 *   framework?}``; every notebook kernel gets that target registered;
 * - a link ``<a href="#mlms-timeline/<evaluation_id>[/<framework>]">`` in an output (the Evaluation's HTML has one)
 *   opens the run when clicked, even in a notebook reopened later.
 */
import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, InputDialog, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';
import { ILauncher } from '@jupyterlab/launcher';
import { INotebookTracker } from '@jupyterlab/notebook';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { LabIcon } from '@jupyterlab/ui-components';

import { IRun, requestAPI } from './api';
import { IOpenRequest, RunsSidebar } from './sidebar';
import { TimelineWidget } from './timeline';

const COMM_TARGET = 'mlms_nb.timeline';
const LINK_PREFIX = '#mlms-timeline/';

namespace CommandIDs {
  export const showRuns = 'mlms-nb:show-runs';
  export const openTimeline = 'mlms-nb:open-timeline';
}

const timelineIcon = new LabIcon({
  name: 'mlms-nb:timeline',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<rect x="2" y="4" width="12" height="3"/><rect x="6" y="9" width="14" height="3"/>' +
    '<rect x="4" y="14" width="6" height="3"/><rect x="12" y="14" width="8" height="3"/>' +
    '<rect x="2" y="19" width="20" height="1.5"/></g></svg>'
});

function runLabel(run: IRun | null, evaluationId: string, framework: string): string {
  return run ? `${run.model} · ${framework} · ${evaluationId.slice(0, 8)}` : `${framework} · ${evaluationId.slice(0, 8)}`;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'mlms-nb-lab:plugin',
  description: 'mlms-nb runs sidebar and timeline panel',
  autoStart: true,
  requires: [ILabShell],
  optional: [ICommandPalette, ILauncher, INotebookTracker],
  activate: (
    app: JupyterFrontEnd,
    shell: ILabShell,
    palette: ICommandPalette | null,
    launcher: ILauncher | null,
    notebooks: INotebookTracker | null
  ) => {
    const tracker = new WidgetTracker<MainAreaWidget<TimelineWidget>>({ namespace: 'mlms-timeline' });

    const open = (req: IOpenRequest) => app.commands.execute(CommandIDs.openTimeline, req as any);
    const sidebar = new RunsSidebar(open);
    sidebar.title.icon = timelineIcon;
    shell.add(sidebar, 'left', { rank: 650 });

    async function openTimeline(req: IOpenRequest): Promise<MainAreaWidget<TimelineWidget>> {
      const run = await requestAPI<IRun>(`runs/${encodeURIComponent(req.evaluation_id)}`);
      const frameworks = req.framework ? [req.framework] : run.traces.filter(t => !t.unreadable).map(t => t.framework);
      if (!frameworks.length) {
        throw new Error(`run ${req.evaluation_id} has no stored trace: evaluate with a trace level`);
      }
      let panel = req.compare ? tracker.currentWidget : null;
      if (!panel) {
        const content = new TimelineWidget();
        panel = new MainAreaWidget({ content });
        panel.id = `mlms-timeline-${Date.now()}`;
        panel.title.icon = timelineIcon;
        panel.title.closable = true;
        void tracker.add(panel);
        shell.add(panel, 'main');
      }
      shell.activateById(panel.id);
      for (const fw of frameworks) {
        if (!panel.content.hasTrace(run.evaluation_id, fw)) {
          await panel.content.addTrace(run.evaluation_id, fw, runLabel(run, run.evaluation_id, fw));
        }
      }
      panel.title.label = panel.content.title.label;
      return panel;
    }

    app.commands.addCommand(CommandIDs.showRuns, {
      label: 'mlms-nb: Show runs',
      caption: 'the evaluations in the history store, with their traces',
      icon: timelineIcon,
      execute: () => shell.activateById(sidebar.id)
    });

    app.commands.addCommand(CommandIDs.openTimeline, {
      label: args => (args.evaluation_id ? `Open timeline of ${String(args.evaluation_id).slice(0, 8)}` : 'mlms-nb: Open timeline…'),
      caption: 'open a traced run in a timeline panel (no id: ask for one; launcher: the newest traced run)',
      icon: timelineIcon,
      execute: async args => {
        let evaluationId = args.evaluation_id as string | undefined;
        if (!evaluationId) {
          await sidebar.refresh();
          const latest = sidebar.latestTraced();
          const answer = await InputDialog.getText({
            title: 'Open the timeline of a run',
            label: 'evaluation id (see the runs sidebar or `%mlms history`)',
            text: latest?.evaluation_id || ''
          });
          if (!answer.button.accept || !answer.value) {
            return;
          }
          evaluationId = answer.value.trim();
        }
        return openTimeline({
          evaluation_id: evaluationId,
          framework: (args.framework as string) || undefined,
          compare: !!args.compare
        });
      }
    });

    palette?.addItem({ command: CommandIDs.showRuns, category: 'mlms-nb' });
    palette?.addItem({ command: CommandIDs.openTimeline, category: 'mlms-nb' });
    launcher?.add({ command: CommandIDs.openTimeline, category: 'Other', rank: 10 });
    launcher?.add({ command: CommandIDs.showRuns, category: 'Other', rank: 11 });

    // outputs: <a href="#mlms-timeline/<id>[/<framework>]"> opens the run (captured before JupyterLab's handler)
    document.addEventListener(
      'click',
      event => {
        const a = (event.target as HTMLElement | null)?.closest?.('a');
        const href = a?.getAttribute('href') || '';
        if (!href.startsWith(LINK_PREFIX)) {
          return;
        }
        event.preventDefault();
        event.stopPropagation();
        const [evaluationId, framework] = href.slice(LINK_PREFIX.length).split('/');
        void open({ evaluation_id: evaluationId, framework: framework || undefined });
      },
      true
    );

    // kernels: %mlms timeline RUN --panel opens a comm to this target
    const hooked = new WeakSet<Kernel.IKernelConnection>();
    const hook = (kernel: Kernel.IKernelConnection | null | undefined) => {
      if (!kernel || hooked.has(kernel)) {
        return;
      }
      hooked.add(kernel);
      kernel.registerCommTarget(COMM_TARGET, (comm: Kernel.IComm, msg: KernelMessage.ICommOpenMsg) => {
        const data = msg.content.data as any;
        comm.close();
        if (data && typeof data.evaluation_id === 'string') {
          void open({ evaluation_id: data.evaluation_id, framework: data.framework || undefined });
        }
      });
    };
    notebooks?.widgetAdded.connect((_, panel) => {
      const ctx = panel.sessionContext;
      ctx.kernelChanged.connect((_, change) => hook(change.newValue));
      void ctx.ready.then(() => hook(ctx.session?.kernel));
    });
    notebooks?.forEach(panel => hook(panel.sessionContext.session?.kernel));
  }
};

export default plugin;
