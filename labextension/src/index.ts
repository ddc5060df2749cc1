/**
 * perfmagic's sidebar plugin: a GPU monitor fed by the perfmagic server extension, in JupyterLab 4's
 * left area and in Notebook 7's left panel (Notebook's shell is no ILabShell: only the generic shell
 * API is used, so one plugin serves both).
 */

import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { LabIcon } from '@jupyterlab/ui-components';

import { GpuMonitorPanel } from './panel';

const PLUGIN_ID = 'perfmagic:plugin';
const COMMAND = 'perfmagic:show-gpu-monitor';

const gpuIcon = new LabIcon({
  name: 'perfmagic:gpu',
  svgstr: `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M4 6h16a1 1 0 0 1 1 1v10a1 1 0 0 1-1 1H4a1 1 0 0 1-1-1V7a1 1 0 0 1 1-1zm1 2v8h14V8H5z"/>
    <path d="M7 10h4v4H7zM13 10h4v1.5h-4zM13 12.5h4V14h-4zM6 18h2v2H6zM10 18h2v2h-2zM14 18h2v2h-2z"/>
  </g>
</svg>`
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU monitor sidebar: every GPU, the host, and which notebook uses the GPU.',
  autoStart: true,
  optional: [ISettingRegistry, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    settingRegistry: ISettingRegistry | null,
    restorer: ILayoutRestorer | null
  ) => {
    const panel = new GpuMonitorPanel(1);
    panel.title.icon = gpuIcon;
    panel.title.caption = 'GPU monitor';
    app.shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, 'perfmagic-gpu-monitor');

    app.commands.addCommand(COMMAND, {
      label: 'Show GPU Monitor',
      execute: () => app.shell.activateById(panel.id)
    });

    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          const apply = () => {
            panel.rateHz = settings.get('refreshRate').composite as number;
          };
          apply();
          settings.changed.connect(apply);
        })
        .catch(reason => console.error('perfmagic: failed to load settings', reason));
    }
  }
};

export default plugin;
