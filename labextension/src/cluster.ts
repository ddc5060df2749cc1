/**
 * The cluster section: every node's GPUs and profiled ranks, from the Prometheus the server is
 * configured with (`perfmagic/api/cluster`, queried server side). Polled every few seconds, one
 * request at a time, only while the panel is visible; hidden where no Prometheus is configured.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { Sparkline } from './chart';
import {
  clusterGpuText,
  clusterNotice,
  clusterRankText,
  IClusterNode,
  IClusterView,
  isClusterView
} from './clusterView';
import { Series } from './series';

const POLL_MS = 5000;

export class ClusterSection {
  readonly node: HTMLElement;
  private readonly notice: HTMLElement;
  private readonly list: HTMLElement;
  private readonly settings = ServerConnection.makeSettings();
  private timer: number | undefined;
  private active = false;
  private disposed = false;

  constructor() {
    this.node = document.createElement('section');
    this.node.className = 'pm-card pm-cluster';
    this.node.hidden = true;
    const title = document.createElement('h3');
    title.className = 'pm-card-title';
    title.textContent = 'Cluster (Prometheus)';
    this.notice = document.createElement('div');
    this.notice.className = 'pm-cluster-notice';
    this.list = document.createElement('div');
    this.list.className = 'pm-nodes';
    this.node.append(title, this.notice, this.list);
  }

  /** Poll while the panel is visible; the next request goes out only after the last one ended. */
  resume(): void {
    if (this.active || this.disposed) {
      return;
    }
    this.active = true;
    void this.poll();
  }

  pause(): void {
    this.active = false;
    window.clearTimeout(this.timer);
  }

  dispose(): void {
    this.disposed = true;
    this.pause();
  }

  private async poll(): Promise<void> {
    try {
      const url = URLExt.join(this.settings.baseUrl, 'perfmagic/api/cluster');
      const response = await ServerConnection.makeRequest(url, {}, this.settings);
      const view: unknown = response.ok ? await response.json() : null;
      if (isClusterView(view) && this.active) {
        this.render(view);
      }
    } catch (reason) {
      console.warn('perfmagic: cluster view request failed', reason);
    }
    if (this.active) {
      this.timer = window.setTimeout(() => void this.poll(), POLL_MS);
    }
  }

  private render(view: IClusterView): void {
    this.node.hidden = !view.prometheus.configured;
    const notice = clusterNotice(view);
    this.notice.hidden = notice === null;
    this.notice.textContent = notice ?? '';
    this.node.classList.toggle('pm-unreachable', view.prometheus.configured && !view.prometheus.reachable);
    this.list.replaceChildren(...view.nodes.map(renderNode));
  }
}

function renderNode(n: IClusterNode): HTMLElement {
  const node = document.createElement('div');
  node.className = 'pm-node';
  node.dataset.host = n.hostname;
  const head = document.createElement('div');
  head.className = 'pm-node-head';
  head.textContent = `${n.hostname} · ${n.gpus.length} GPU${n.gpus.length === 1 ? '' : 's'}`;
  node.append(head);
  for (const r of n.ranks) {
    const rank = document.createElement('div');
    rank.className = 'pm-node-rank';
    rank.textContent = clusterRankText(r);
    node.append(rank);
  }
  for (const g of n.gpus) {
    const row = document.createElement('div');
    row.className = 'pm-node-gpu';
    const label = document.createElement('span');
    label.className = 'pm-node-gpu-label';
    label.textContent = `${g.gpu ?? '?'} · ${g.model ?? 'GPU'}`;
    label.title = g.uuid ?? '';
    const value = document.createElement('span');
    value.className = 'pm-node-gpu-value';
    value.textContent = clusterGpuText(g);
    const spark = new Sparkline();
    const history = new Series(Math.max(1, g.util_history.length));
    g.util_history.forEach(([, v]) => history.push(v));
    row.append(label, value, spark.node);
    node.append(row);
    requestAnimationFrame(() => spark.draw(history, 100)); // once laid out: the canvas has a size
  }
  return node;
}
