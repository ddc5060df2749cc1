/**
 * The sidebar panel: a card per GPU (utilization, memory, power, temperature), host CPU and
 * memory, the GPU processes named after their notebooks, and where a Prometheus is configured the
 * cluster's nodes. Updates pause while hidden.
 */

import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { Sparkline } from './chart';
import { ClusterSection } from './cluster';
import { FeedState, MonitorFeed } from './connection';
import { gpuMetrics, historySpan, hostMetrics, IMetricView, Series } from './series';
import { IGpu, IGpuProcess, ISnapshot } from './snapshot';
import { clampRate } from './stream';
import { isStale, noGpuMessage, processRows } from './view';

/** Samples each chart keeps: one per refresh. */
const HISTORY = 120;

/** One chart row: label, value text and sparkline. */
class MetricRow {
  readonly node: HTMLElement;
  private readonly value: HTMLElement;
  private readonly chart = new Sparkline();
  readonly series = new Series(HISTORY);

  constructor(key: string, label: string) {
    this.node = el('div', 'pm-metric');
    this.node.dataset.key = key;
    const head = el('div', 'pm-metric-head');
    head.append(el('span', 'pm-metric-label', label));
    this.value = el('span', 'pm-metric-value');
    head.append(this.value);
    this.node.append(head, this.chart.node);
  }

  update(view: IMetricView): void {
    this.series.push(view.value);
    this.value.textContent = view.text;
    this.node.classList.toggle('pm-high', view.fraction !== null && view.fraction >= 0.9);
    this.chart.draw(this.series, view.ceiling(this.series));
  }
}

export class GpuMonitorPanel extends Widget {
  private readonly feed: MonitorFeed;
  private readonly status = el('span', 'pm-status');
  // The charts' time scale: their history holds HISTORY samples, one per refresh.
  private readonly timescale = el('div', 'pm-timescale');
  private readonly notice = el('div', 'pm-notice');
  private readonly gpuSection = el('div', 'pm-gpus');
  private readonly hostSection = el('section', 'pm-card pm-host');
  private readonly procSection = el('section', 'pm-card pm-procs');
  private readonly cluster = new ClusterSection();
  private readonly rows = new Map<string, MetricRow>();
  private readonly cards = new Map<number, HTMLElement>();
  /** Each GPU's energy counter when the panel first read it: "so far" counts from there. */
  private readonly energyFrom = new Map<number, number>();
  private readonly onVisibility = () => this.updateActivity();
  private state: FeedState = 'paused';

  constructor(rateHz: number) {
    super();
    this.id = 'perfmagic-gpu-monitor';
    this.addClass('pm-monitor');
    const header = el('header', 'pm-header');
    header.append(el('span', 'pm-title', 'GPU'), this.status);
    this.hostSection.append(el('h3', 'pm-card-title', 'Host'));
    this.notice.hidden = true;
    this.showTimescale(rateHz);
    this.node.append(
      header,
      this.timescale,
      this.notice,
      this.gpuSection,
      this.hostSection,
      this.procSection,
      this.cluster.node
    );
    this.renderProcesses([]);
    this.feed = new MonitorFeed({
      rateHz,
      onSnapshot: s => this.render(s),
      onState: (state, detail) => this.showState(state, detail)
    });
    this.showState('paused');
    document.addEventListener('visibilitychange', this.onVisibility);
  }

  set rateHz(hz: number) {
    this.feed.setRate(hz);
    this.showTimescale(hz);
  }

  private showTimescale(hz: number): void {
    const span = historySpan(HISTORY, clampRate(hz));
    this.timescale.replaceChildren(el('span', '', `charts: ${span}`), el('span', '', 'now'));
    this.timescale.title = `${HISTORY} samples at ${clampRate(hz)} per second`;
  }

  dispose(): void {
    document.removeEventListener('visibilitychange', this.onVisibility);
    this.feed.dispose();
    this.cluster.dispose();
    super.dispose();
  }

  protected onAfterShow(_msg: Message): void {
    this.updateActivity();
  }

  protected onAfterHide(_msg: Message): void {
    this.updateActivity();
  }

  protected onAfterAttach(_msg: Message): void {
    this.updateActivity();
  }

  /** Stream only while someone can see the panel: visible in the shell and the browser tab. */
  private updateActivity(): void {
    if (this.isVisible && document.visibilityState !== 'hidden') {
      this.feed.resume();
      this.cluster.resume();
    } else {
      this.feed.pause();
      this.cluster.pause();
    }
  }

  private showState(state: FeedState, detail?: string): void {
    this.state = state;
    this.status.textContent = state;
    this.status.title = detail ?? '';
    this.status.dataset.state = state;
  }

  private render(s: ISnapshot): void {
    this.node.dataset.seq = String(s.seq);
    const why = noGpuMessage(s);
    this.notice.hidden = why === null;
    this.notice.textContent = why ?? '';
    this.node.classList.toggle('pm-no-gpu', why !== null);
    // A hung driver stalls the sampler, not the socket: say so instead of showing old numbers as live.
    const stale = isStale(s);
    this.node.classList.toggle('pm-stale', stale);
    this.status.textContent = stale ? `stale (${Math.round(s.age_s ?? 0)} s old)` : this.state;
    this.renderGpus(s.gpus, s.processes);
    for (const view of hostMetrics(s.host)) {
      this.row(view, this.hostSection).update(view);
    }
    this.renderProcesses(s);
  }

  private renderGpus(gpus: IGpu[], procs: IGpuProcess[]): void {
    const seen = new Set<number>();
    for (const g of gpus) {
      seen.add(g.index);
      let card = this.cards.get(g.index);
      if (!card) {
        card = el('section', 'pm-card pm-gpu');
        card.dataset.gpu = String(g.index);
        card.append(el('h3', 'pm-card-title'), el('div', 'pm-gpu-lost'), el('div', 'pm-gpu-procs'));
        this.cards.set(g.index, card);
        this.gpuSection.append(card);
      }
      const title = card.querySelector('.pm-card-title') as HTMLElement;
      title.textContent = `GPU ${g.index}${g.name ? ` · ${g.name}` : ''}`;
      title.title = [g.name, g.uuid].filter(Boolean).join(' · ');
      const lost = card.querySelector('.pm-gpu-lost') as HTMLElement;
      lost.hidden = !g.lost;
      lost.textContent = g.lost ? `GPU lost${g.lost_reason ? `: ${g.lost_reason}` : ''}` : '';
      card.classList.toggle('pm-lost', g.lost);
      for (const view of gpuMetrics(g, this.energyStart(g))) {
        this.row(view, card).update(view);
      }
      const held = card.querySelector('.pm-gpu-procs') as HTMLElement;
      const memory = this.rows.get(`gpu${g.index}.mem`)?.node;
      if (memory && held.previousElementSibling !== memory) {
        memory.after(held); // under the GPU's memory chart
      }
      renderProcessMemory(held, g, procs);
    }
    for (const [index, card] of this.cards) {
      if (!seen.has(index)) {
        card.remove();
        this.cards.delete(index);
        card.querySelectorAll<HTMLElement>('.pm-metric').forEach(m => this.rows.delete(m.dataset.key!));
      }
    }
  }

  /** Where a GPU's energy so far counts from; a counter that went back (a driver reload) starts over. */
  private energyStart(g: IGpu): number | null {
    const now = g.energy_j;
    if (now === null || !Number.isFinite(now)) {
      return null;
    }
    const from = this.energyFrom.get(g.index);
    if (from === undefined || now < from) {
      this.energyFrom.set(g.index, now);
      return now;
    }
    return from;
  }

  private row(view: IMetricView, parent: HTMLElement): MetricRow {
    let row = this.rows.get(view.key);
    if (!row) {
      row = new MetricRow(view.key, view.label);
      this.rows.set(view.key, row);
      parent.append(row.node);
    }
    return row;
  }

  private renderProcesses(s: ISnapshot | []): void {
    const section = this.procSection;
    section.replaceChildren(el('h3', 'pm-card-title', 'GPU processes'));
    if (Array.isArray(s)) {
      return;
    }
    const rows = processRows(s.processes);
    if (!rows.length) {
      section.append(
        el('div', 'pm-empty', s.nvml.available ? 'No process is using a GPU.' : 'No GPU processes to show.')
      );
      return;
    }
    const table = el('table', 'pm-proc-table');
    const head = el('tr');
    for (const h of ['Process', 'GPU', 'Memory']) {
      head.append(el('th', '', h));
    }
    table.append(head);
    for (const r of rows) {
      const tr = el('tr', r.isKernel ? 'pm-proc pm-kernel' : 'pm-proc');
      tr.title = r.title;
      if (r.rank !== null) {
        tr.dataset.rank = String(r.rank);
      }
      tr.append(el('td', 'pm-proc-name', r.label), el('td', '', String(r.gpu)), el('td', '', r.memory));
      table.append(tr);
    }
    section.append(table);
  }
}

/** Who holds a GPU's memory: one bar, a segment per process (largest first), each named on hover. */
function renderProcessMemory(node: HTMLElement, g: IGpu, procs: IGpuProcess[]): void {
  const rows = processRows(procs.filter(p => p.gpu_index === g.index));
  const total = g.mem_total_bytes ?? 0;
  if (!rows.length || !total) {
    node.replaceChildren();
    node.hidden = true;
    return;
  }
  node.hidden = false;
  const bar = el('div', 'pm-gpu-procs-bar');
  rows.forEach((r, i) => {
    const seg = el('div', 'pm-gpu-proc');
    seg.style.width = `${(100 * r.bytes) / total}%`;
    seg.style.opacity = String(1 - (0.6 * i) / Math.max(1, rows.length));
    seg.title = `${r.label}: ${r.memory}`;
    seg.dataset.pid = String(r.pid);
    bar.append(seg);
  });
  const label = el('div', 'pm-metric-head');
  label.append(
    el('span', 'pm-metric-label', 'By process'),
    el('span', 'pm-metric-value', rows.map(r => `${r.label} ${r.memory}`).join(', '))
  );
  node.replaceChildren(label, bar);
}

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className = '',
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}
