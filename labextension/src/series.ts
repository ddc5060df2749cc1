/**
 * The charts' data: each metric's fixed-length history, and the charts of a GPU and of the host
 * (label, text, value and ceiling) from a snapshot.
 */

import { formatBytes, formatCelsius, formatJoules, formatPercent, formatWatts } from './format';
import { IGpu, IHost } from './snapshot';

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

/** How long the charts' history spans, in words ("last 2 min"), at `rateHz` samples a second. */
export function historySpan(capacity: number, rateHz: number): string {
  const seconds = Math.round(capacity / rateHz);
  return seconds >= 120 ? `last ${Math.round(seconds / 60)} min` : `last ${seconds} s`;
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

/**
 * The charts of one GPU, in display order (PCIe and NVLink where the GPU measures them); the power
 * chart says the energy drawn since `energySinceJ` joules were counted, where it is known.
 */
export function gpuMetrics(g: IGpu, energySinceJ: number | null = null): IMetricView[] {
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
      text:
        formatWatts(g.power_w, g.power_limit_w) +
        (known(g.energy_j) && energySinceJ !== null
          ? ` · ${formatJoules(g.energy_j - energySinceJ)} so far`
          : ''),
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
