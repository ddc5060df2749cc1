/**
 * Pure logic of the GPU monitor: the snapshot types, history, formatting, backoff and the
 * no-GPU state. No DOM and no JupyterLab imports, so node's test runner can test it directly.
 */

/** Per-GPU metrics, in the report's units (bytes, watts, fractions in [0, 1]). */
export interface IGpu {
  index: number;
  name: string | null;
  uuid?: string | null;
  util_gpu: number | null;
  util_mem?: number | null;
  mem_used_bytes: number | null;
  mem_total_bytes: number | null;
  power_w: number | null;
  power_limit_w?: number | null;
  temperature_c: number | null;
  throttle_reasons?: string[] | null;
  pcie_tx_bytes_per_s?: number | null;
  pcie_rx_bytes_per_s?: number | null;
  nvlink_tx_bytes_per_s?: number | null;
  nvlink_rx_bytes_per_s?: number | null;
  lost: boolean;
  lost_reason?: string | null;
}

/** The kernel (and notebook) a GPU process belongs to. */
export interface IKernelRef {
  id: string;
  name: string | null;
  execution_state?: string | null;
  path: string | null;
  notebook: string | null;
}

export interface IGpuProcess {
  gpu_index: number;
  pid: number;
  used_memory_bytes: number | null;
  sm_util?: number | null;
  type?: string;
  name: string | null;
  visible?: boolean;
  kernel: IKernelRef | null;
  /** Where a perfmagic session profiles the process: its distributed rank and node. */
  rank?: number | null;
  local_rank?: number | null;
  node?: string | null;
}

export interface IHost {
  cpu_count?: number;
  cpu_util?: number | null;
  mem_total_bytes?: number;
  mem_used_bytes?: number;
  mem_util?: number | null;
}

export interface INvmlStatus {
  available: boolean;
  reason: string | null;
  driver_version?: string | null;
  device_count?: number;
  warnings?: string[];
}

export interface ISnapshot {
  schema: string;
  seq: number;
  time: number;
  interval_s: number;
  age_s?: number | null;
  nvml: INvmlStatus;
  gpus: IGpu[];
  processes: IGpuProcess[];
  host: IHost;
}

export const MIN_RATE_HZ = 0.25;
export const MAX_RATE_HZ = 10;

/** A refresh rate as the server will serve it. */
export function clampRate(hz: number): number {
  if (!Number.isFinite(hz)) {
    return 1;
  }
  return Math.min(MAX_RATE_HZ, Math.max(MIN_RATE_HZ, hz));
}

/** Whether a message from the stream is a snapshot (the server also sends config acks). */
export function isSnapshot(msg: unknown): msg is ISnapshot {
  return (
    typeof msg === 'object' &&
    msg !== null &&
    (msg as { schema?: unknown }).schema === 'perfmagic.snapshot/1'
  );
}

/** Fixed-length history of one metric; `null` marks a sample the source could not read. */
export class Series {
  readonly values: (number | null)[] = [];
  constructor(readonly capacity = 120) {}

  push(value: number | null | undefined): void {
    this.values.push(value ?? null);
    if (this.values.length > this.capacity) {
      this.values.splice(0, this.values.length - this.capacity);
    }
  }

  get last(): number | null {
    return this.values.length ? this.values[this.values.length - 1] : null;
  }

  /** Largest value seen, for charts without a natural maximum. */
  get max(): number {
    let m = 0;
    for (const v of this.values) {
      if (v !== null && v > m) {
        m = v;
      }
    }
    return m;
  }
}

/** One chart: a metric's history, its label, how to print it and the chart's ceiling. */
export interface IMetricView {
  key: string;
  label: string;
  text: string;
  fraction: number | null;
  ceiling: (s: Series) => number;
  value: number | null;
}

const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

export function formatBytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) {
    return '–';
  }
  let i = 0;
  let v = Math.abs(n);
  while (v >= 1024 && i < BYTE_UNITS.length - 1) {
    v /= 1024;
    i++;
  }
  const digits = i === 0 || v >= 100 ? 0 : v >= 10 ? 1 : 2;
  return `${n < 0 ? '-' : ''}${v.toFixed(digits)} ${BYTE_UNITS[i]}`;
}

export function formatPercent(f: number | null | undefined): string {
  return f === null || f === undefined || !Number.isFinite(f) ? '–' : `${Math.round(f * 100)}%`;
}

export function formatWatts(w: number | null | undefined, limit?: number | null): string {
  if (w === null || w === undefined || !Number.isFinite(w)) {
    return '–';
  }
  return limit ? `${Math.round(w)} / ${Math.round(limit)} W` : `${Math.round(w)} W`;
}

export function formatCelsius(c: number | null | undefined): string {
  return c === null || c === undefined || !Number.isFinite(c) ? '–' : `${Math.round(c)} °C`;
}

function ratio(used: number | null | undefined, total: number | null | undefined): number | null {
  return used === null || used === undefined || !total ? null : used / total;
}

function known(x: number | null | undefined): x is number {
  return x !== null && x !== undefined && Number.isFinite(x);
}

/** A link's throughput both ways ("↑ 2.0 GiB/s ↓ 8.0 GiB/s"), charted as their sum; none unmeasured. */
function linkMetric(
  key: string,
  label: string,
  tx: number | null | undefined,
  rx: number | null | undefined
): IMetricView[] {
  if (!known(tx) && !known(rx)) {
    return [];
  }
  const text = `↑ ${known(tx) ? formatBytes(tx) : '–'}/s ↓ ${known(rx) ? formatBytes(rx) : '–'}/s`;
  return [
    {
      key,
      label,
      text,
      value: (tx ?? 0) + (rx ?? 0),
      fraction: null,
      ceiling: s => Math.max(1, s.max)
    }
  ];
}

/** The charts of one GPU, in display order (PCIe and NVLink where the GPU measures them). */
export function gpuMetrics(g: IGpu): IMetricView[] {
  const p = `gpu${g.index}`;
  const memFraction = ratio(g.mem_used_bytes, g.mem_total_bytes);
  return [
    {
      key: `${p}.util`,
      label: 'Utilization',
      text: formatPercent(g.util_gpu),
      value: g.util_gpu,
      fraction: g.util_gpu,
      ceiling: () => 1
    },
    {
      key: `${p}.mem`,
      label: 'Memory',
      text:
        g.mem_used_bytes === null
          ? '–'
          : `${formatBytes(g.mem_used_bytes)} / ${formatBytes(g.mem_total_bytes)}`,
      value: memFraction,
      fraction: memFraction,
      ceiling: () => 1
    },
    {
      key: `${p}.power`,
      label: 'Power',
      text: formatWatts(g.power_w, g.power_limit_w),
      value: g.power_w,
      fraction: ratio(g.power_w, g.power_limit_w),
      ceiling: s => g.power_limit_w || Math.max(1, s.max)
    },
    {
      key: `${p}.temp`,
      label: 'Temperature',
      text: formatCelsius(g.temperature_c),
      value: g.temperature_c,
      fraction: g.temperature_c === null ? null : g.temperature_c / 100,
      ceiling: s => Math.max(100, s.max)
    },
    ...linkMetric(`${p}.pcie`, 'PCIe', g.pcie_tx_bytes_per_s, g.pcie_rx_bytes_per_s),
    ...linkMetric(`${p}.nvlink`, 'NVLink', g.nvlink_tx_bytes_per_s, g.nvlink_rx_bytes_per_s)
  ];
}

/** How long the charts' history spans, in words ("last 2 min"), at `rateHz` samples a second. */
export function historySpan(capacity: number, rateHz: number): string {
  const seconds = Math.round(capacity / rateHz);
  return seconds >= 120 ? `last ${Math.round(seconds / 60)} min` : `last ${seconds} s`;
}

/** Host CPU and memory charts. */
export function hostMetrics(h: IHost): IMetricView[] {
  const memFraction = h.mem_util ?? ratio(h.mem_used_bytes, h.mem_total_bytes);
  const cores = h.cpu_count ? ` of ${h.cpu_count} cores` : '';
  return [
    {
      key: 'host.cpu',
      label: 'CPU',
      text: `${formatPercent(h.cpu_util)}${h.cpu_util === null || h.cpu_util === undefined ? '' : cores}`,
      value: h.cpu_util ?? null,
      fraction: h.cpu_util ?? null,
      ceiling: () => 1
    },
    {
      key: 'host.mem',
      label: 'Memory',
      text:
        h.mem_used_bytes === undefined
          ? '–'
          : `${formatBytes(h.mem_used_bytes)} / ${formatBytes(h.mem_total_bytes)}`,
      value: memFraction,
      fraction: memFraction,
      ceiling: () => 1
    }
  ];
}

/** Why there are no GPU charts, or null when GPUs are being shown. */
export function noGpuMessage(s: ISnapshot): string | null {
  if (!s.nvml.available) {
    return `No GPU data: ${s.nvml.reason || 'NVML is not available'}.`;
  }
  if (s.gpus.length === 0) {
    return 'No GPU data: NVML found no GPU on this machine.';
  }
  return null;
}

/** A snapshot is stale when the sampler has not produced one for several intervals (hung driver). */
export function isStale(s: ISnapshot): boolean {
  const age = s.age_s ?? 0;
  return age > Math.max(5, 5 * s.interval_s);
}

/** One row of the process list. */
export interface IProcessRow {
  label: string;
  title: string;
  gpu: number;
  pid: number;
  memory: string;
  bytes: number;
  isKernel: boolean;
  rank: number | null;
}

/**
 * GPU processes: the ranks of a distributed job first, by rank (named by rank and node), then the
 * others, largest memory first, named after their notebook when a kernel owns them.
 */
export function processRows(procs: IGpuProcess[]): IProcessRow[] {
  return procs
    .map(p => {
      const nb = p.kernel?.notebook ?? null;
      const who = nb
        ? nb
        : p.kernel
          ? `kernel ${p.kernel.id.slice(0, 8)}`
          : p.visible === false
            ? `pid ${p.pid} (not visible here)`
            : `${p.name ?? 'process'} (pid ${p.pid})`;
      const rank = p.rank ?? null;
      const label = rank === null ? who : `rank ${rank}${p.node ? ` · ${p.node}` : ''}`;
      const title = p.kernel?.path
        ? `${p.kernel.path} — kernel ${p.kernel.name ?? ''} (pid ${p.pid})`
        : rank === null
          ? label
          : `${label} — ${who}${p.local_rank != null ? `, local rank ${p.local_rank}` : ''}`;
      return {
        label,
        title,
        gpu: p.gpu_index,
        pid: p.pid,
        memory: formatBytes(p.used_memory_bytes),
        bytes: p.used_memory_bytes ?? 0,
        isKernel: p.kernel !== null,
        rank
      };
    })
    .sort((a, b) => byRank(a.rank, b.rank) || b.bytes - a.bytes || a.gpu - b.gpu || a.pid - b.pid);
}

/** Ranked before unranked, then by rank. */
function byRank(a: number | null, b: number | null): number {
  if (a === null || b === null) {
    return (a === null ? 1 : 0) - (b === null ? 1 : 0);
  }
  return a - b;
}

/**
 * Reconnect delay after `attempt` consecutive failures: exponential from `baseMs`, capped at
 * `maxMs`, with up to ±`jitter` randomness so many tabs don't reconnect in lockstep.
 */
export function backoffDelay(
  attempt: number,
  baseMs = 500,
  maxMs = 30000,
  jitter = 0.2,
  random: () => number = Math.random
): number {
  const raw = Math.min(maxMs, baseMs * 2 ** Math.max(0, attempt));
  const spread = raw * jitter * (2 * random() - 1);
  return Math.max(0, Math.round(Math.min(maxMs, raw + spread)));
}

// ---- the cluster view (perfmagic/api/cluster) -------------------------------------------------

export interface IClusterGpu {
  gpu: string | null;
  uuid: string | null;
  model: string | null;
  util_pct: number | null;
  fb_used_mib: number | null;
  fb_free_mib: number | null;
  power_w: number | null;
  util_history: [number, number][];
}

export interface IClusterRank {
  rank: number | null;
  local_rank: number | null;
  pid: number | null;
  program: string | null;
  steps: number | null;
  steps_per_s: number | null;
}

export interface IClusterNode {
  hostname: string;
  gpus: IClusterGpu[];
  ranks: IClusterRank[];
}

export interface IClusterView {
  prometheus: { configured: boolean; reachable: boolean; error: string | null };
  nodes: IClusterNode[];
}

export function isClusterView(x: unknown): x is IClusterView {
  const v = x as IClusterView;
  return !!v && typeof v === 'object' && !!v.prometheus && Array.isArray(v.nodes);
}

/** One GPU of another node in a line: utilization, memory used of total, power. */
export function clusterGpuText(g: IClusterGpu): string {
  const MiB = 1024 ** 2;
  const total = g.fb_used_mib !== null && g.fb_free_mib !== null ? g.fb_used_mib + g.fb_free_mib : null;
  const memory =
    g.fb_used_mib === null
      ? null
      : `${formatBytes(g.fb_used_mib * MiB)}${total !== null ? ` / ${formatBytes(total * MiB)}` : ''}`;
  return [
    g.util_pct === null ? 'n/a' : `${Math.round(g.util_pct)}%`,
    memory,
    g.power_w === null ? null : formatWatts(g.power_w)
  ]
    .filter(Boolean)
    .join(' · ');
}

/** A profiled process of a node: its rank (or pid), program and pace. */
export function clusterRankText(r: IClusterRank): string {
  const who = r.rank !== null ? `rank ${r.rank}` : `pid ${r.pid ?? '?'}`;
  const pace = r.steps_per_s === null ? '' : ` · ${r.steps_per_s.toFixed(r.steps_per_s < 10 ? 1 : 0)} steps/s`;
  return `${who}${r.program ? ` · ${r.program}` : ''}${pace}`;
}

/** What the cluster section says instead of nodes, or null when it shows nodes (or nothing). */
export function clusterNotice(v: IClusterView): string | null {
  if (!v.prometheus.configured) {
    return null;
  }
  if (!v.prometheus.reachable) {
    return `Prometheus unreachable: ${v.prometheus.error ?? 'no answer'}. This machine's GPUs above stay live.`;
  }
  return v.nodes.length ? null : 'Prometheus has no GPU series (dcgm-exporter or perfmagic exporter) yet.';
}
