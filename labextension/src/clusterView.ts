/** The cluster view (`perfmagic/api/cluster`): its types and how a node's GPUs and ranks read. */

import { formatBytes, formatJoules, formatWatts } from './format';
import { IClusterGpu, IClusterRank, IClusterView } from './snapshot';

export type { IClusterGpu, IClusterNode, IClusterRank, IClusterView } from './snapshot';

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

/** A profiled process of a node: its rank (or pid), program, pace and energy per sample. */
export function clusterRankText(r: IClusterRank): string {
  const who = r.rank !== null ? `rank ${r.rank}` : `pid ${r.pid ?? '?'}`;
  const pace =
    r.steps_per_s === null ? '' : ` · ${r.steps_per_s.toFixed(r.steps_per_s < 10 ? 1 : 0)} steps/s`;
  const energy = r.joules_per_sample === null ? '' : ` · ${formatJoules(r.joules_per_sample)}/sample`;
  return `${who}${r.program ? ` · ${r.program}` : ''}${pace}${energy}`;
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
