import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import { clusterGpuText, clusterNotice, clusterRankText, isClusterView } from '../src/clusterView';
import { formatBytes, formatCelsius, formatJoules, formatPercent, formatWatts } from '../src/format';
import { gpuMetrics, historySpan, hostMetrics, Series } from '../src/series';
import { IGpu, IGpuProcess, IKernelRef, INvmlStatus, ISnapshot } from '../src/snapshot';
import { backoffDelay, clampRate, isSnapshot } from '../src/stream';
import { isStale, noGpuMessage, processRows } from '../src/view';

const GiB = 1024 ** 3;

// Whole snapshot parts (every field the server sends), with the fields a test cares about over them.

function nvml(over: Partial<INvmlStatus> = {}): INvmlStatus {
  return {
    available: true,
    reason: null,
    driver_version: null,
    cuda_driver_version: null,
    device_count: 0,
    warnings: [],
    ...over
  };
}

function gpuOf(over: Partial<IGpu> & Pick<IGpu, 'index'>): IGpu {
  return {
    name: null,
    uuid: null,
    pci_bus_id: null,
    power_limit_w: null,
    numa_cpus: null,
    numa_node: null,
    compute_capability: null,
    mig_enabled: false,
    mig_instances: [],
    util_gpu: null,
    util_mem: null,
    mem_used_bytes: null,
    mem_total_bytes: null,
    power_w: null,
    energy_j: null,
    sm_clock_mhz: null,
    mem_clock_mhz: null,
    temperature_c: null,
    pstate: null,
    throttle_mask: null,
    throttle_reasons: null,
    pcie_tx_bytes_per_s: null,
    pcie_rx_bytes_per_s: null,
    nvlink_tx_bytes_per_s: null,
    nvlink_rx_bytes_per_s: null,
    mig_mem_used_bytes: null,
    sm_active: null,
    sm_occupancy: null,
    tensor_active: null,
    dram_bw_util: null,
    lost: false,
    ...over
  };
}

function proc(over: Partial<IGpuProcess> & Pick<IGpuProcess, 'gpu_index' | 'pid'>): IGpuProcess {
  return {
    gpu_uuid: null,
    used_memory_bytes: null,
    type: 'compute',
    name: null,
    username: null,
    visible: true,
    kernel: null,
    rank: null,
    local_rank: null,
    node: null,
    ...over
  };
}

function kernel(over: Partial<IKernelRef> & Pick<IKernelRef, 'id'>): IKernelRef {
  return {
    name: null,
    execution_state: null,
    session_id: null,
    session_type: null,
    path: null,
    notebook: null,
    ...over
  };
}

function snapshot(over: Partial<ISnapshot> = {}): ISnapshot {
  return {
    schema: 'perfmagic.snapshot/1',
    seq: 1,
    time: 0,
    interval_s: 1,
    age_s: 0,
    nvml: nvml(),
    gpus: [],
    processes: [],
    host: {},
    ...over
  };
}

const gpu: IGpu = gpuOf({
  index: 1,
  name: 'NVIDIA A100',
  util_gpu: 0.93,
  mem_used_bytes: 30 * GiB,
  mem_total_bytes: 80 * GiB,
  power_w: 251.6,
  power_limit_w: 400,
  temperature_c: 64.4,
  lost: false
});

test('formatters use report units and show a dash for missing values', () => {
  assert.equal(formatBytes(0), '0 B');
  assert.equal(formatBytes(1536), '1.50 KiB');
  assert.equal(formatBytes(80 * GiB), '80.0 GiB');
  assert.equal(formatBytes(null), '–');
  assert.equal(formatPercent(0.456), '46%');
  assert.equal(formatPercent(undefined), '–');
  assert.equal(formatWatts(251.6, 400), '252 / 400 W');
  assert.equal(formatWatts(251.6), '252 W');
  assert.equal(formatCelsius(NaN), '–');
  assert.equal(formatCelsius(64.4), '64 °C');
});

test('gpu metrics: four charts with fractions against the right ceilings', () => {
  const [util, mem, power, temp] = gpuMetrics(gpu);
  assert.deepEqual(
    [util.key, mem.key, power.key, temp.key],
    ['gpu1.util', 'gpu1.mem', 'gpu1.power', 'gpu1.temp']
  );
  assert.equal(util.text, '93%');
  assert.equal(mem.text, '30.0 GiB / 80.0 GiB');
  assert.equal(mem.fraction, 30 / 80);
  assert.equal(power.fraction, 251.6 / 400);
  assert.equal(power.ceiling(new Series()), 400);
  assert.equal(temp.ceiling(new Series()), 100);
});

test('the power chart says the energy drawn since the panel first read the counter', () => {
  const power = gpuMetrics({ ...gpu, energy_j: 51_000 }, 50_000)[2];
  assert.equal(power.text, '252 / 400 W · 1.00 kJ so far');
  assert.equal(gpuMetrics({ ...gpu, energy_j: null }, 50_000)[2].text, '252 / 400 W');
  assert.equal(formatJoules(850.4), '850 J');
  assert.equal(formatJoules(4.1e6), '4.10 MJ');
});

test('unsupported fields stay empty instead of faking zeros', () => {
  const views = gpuMetrics({ ...gpu, power_w: null, power_limit_w: null, temperature_c: null });
  assert.equal(views[2].text, '–');
  assert.equal(views[2].value, null);
  assert.equal(views[3].fraction, null);
  const s = new Series();
  s.push(120);
  assert.equal(views[2].ceiling(s), 120); // no limit known: scale to what was seen
});

test('host metrics', () => {
  const [cpu, mem] = hostMetrics({
    cpu_count: 2,
    cpu_util: 0.5,
    mem_total_bytes: 8 * GiB,
    mem_used_bytes: 2 * GiB,
    mem_util: 0.25
  });
  assert.equal(cpu.text, '50% of 2 cores');
  assert.equal(mem.fraction, 0.25);
  assert.equal(hostMetrics({ cpu_util: null })[0].text, '–');
});

test('series keeps a bounded history and records gaps', () => {
  const s = new Series(3);
  [1, 2, null, 4].forEach(v => s.push(v));
  assert.deepEqual(s.values, [2, null, 4]);
  assert.equal(s.last, 4);
  assert.equal(s.max, 4);
});

test('no-GPU state says why', () => {
  assert.equal(
    noGpuMessage(snapshot({ nvml: nvml({ available: false, reason: 'NVML library not found' }) })),
    'No GPU data: NVML library not found.'
  );
  assert.match(noGpuMessage(snapshot())!, /found no GPU/);
  assert.equal(noGpuMessage(snapshot({ gpus: [gpu] })), null);
});

test('stale snapshots are flagged', () => {
  assert.equal(isStale(snapshot({ age_s: 1 })), false);
  assert.equal(isStale(snapshot({ age_s: 30 })), true);
  assert.equal(isStale(snapshot({ age_s: 30, interval_s: 10 })), false);
});

test('processes: notebook names, biggest first, foreign PIDs labelled', () => {
  const rows = processRows([
    proc({ gpu_index: 0, pid: 7, used_memory_bytes: GiB, name: 'python', visible: true, kernel: null }),
    proc({
      gpu_index: 1,
      pid: 9,
      used_memory_bytes: 4 * GiB,
      name: 'python',
      kernel: kernel({ id: 'abcdef0123', name: 'python3', path: 'work/train.ipynb', notebook: 'train.ipynb' })
    }),
    proc({ gpu_index: 0, pid: 4242, used_memory_bytes: null, name: null, visible: false, kernel: null })
  ]);
  assert.deepEqual(
    rows.map(r => r.label),
    ['train.ipynb', 'python (pid 7)', 'pid 4242 (not visible here)']
  );
  assert.equal(rows[0].memory, '4.00 GiB');
  assert.equal(rows[0].isKernel, true);
  assert.match(rows[0].title, /work\/train\.ipynb/);
});

test('processes: the ranks of a job first, by rank, named by rank and node', () => {
  const python = { used_memory_bytes: GiB, name: 'python', visible: true, kernel: null };
  const rows = processRows([
    proc({ ...python, gpu_index: 0, pid: 30, used_memory_bytes: 8 * GiB }),
    proc({ ...python, gpu_index: 1, pid: 21, rank: 1, local_rank: 1, node: 'a#0' }),
    proc({ ...python, gpu_index: 0, pid: 22, rank: 2, local_rank: 0, node: 'b#1' }),
    proc({ ...python, gpu_index: 0, pid: 20, rank: 0, local_rank: 0, node: 'a#0' })
  ]);
  assert.deepEqual(
    rows.map(r => [r.label, r.rank]),
    [
      ['rank 0 · a#0', 0],
      ['rank 1 · a#0', 1],
      ['rank 2 · b#1', 2],
      ['python (pid 30)', null]
    ]
  );
  assert.equal(rows[1].title, 'rank 1 · a#0 — python (pid 21), local rank 1');
});

test('rates are clamped to what the server serves', () => {
  assert.equal(clampRate(100), 10);
  assert.equal(clampRate(0), 0.25);
  assert.equal(clampRate(NaN), 1);
  assert.equal(clampRate(2), 2);
});

test('backoff doubles up to a cap, with bounded jitter', () => {
  const noJitter = (a: number) => backoffDelay(a, 500, 30000, 0);
  assert.deepEqual([0, 1, 2, 3].map(noJitter), [500, 1000, 2000, 4000]);
  assert.equal(noJitter(20), 30000);
  assert.equal(
    backoffDelay(1, 500, 30000, 0.2, () => 0),
    800
  );
  assert.equal(
    backoffDelay(1, 500, 30000, 0.2, () => 1),
    1200
  );
});

test('only snapshots are treated as snapshots', () => {
  assert.equal(isSnapshot(snapshot()), true);
  assert.equal(isSnapshot({ type: 'config', rate_hz: 1 }), false);
  assert.equal(isSnapshot(null), false);
});

test('PCIe and NVLink throughput charts appear only where the GPU measures them', () => {
  assert.deepEqual(
    gpuMetrics(gpu).map(v => v.key),
    ['gpu1.util', 'gpu1.mem', 'gpu1.power', 'gpu1.temp']
  );
  const views = gpuMetrics({
    ...gpu,
    pcie_tx_bytes_per_s: 2 * GiB,
    pcie_rx_bytes_per_s: 8 * GiB,
    nvlink_tx_bytes_per_s: null,
    nvlink_rx_bytes_per_s: 4 * GiB
  });
  const pcie = views.find(v => v.key === 'gpu1.pcie')!;
  assert.equal(pcie.text, '↑ 2.00 GiB/s ↓ 8.00 GiB/s');
  assert.equal(pcie.value, 10 * GiB);
  assert.equal(views.find(v => v.key === 'gpu1.nvlink')!.text, '↑ –/s ↓ 4.00 GiB/s');
});

test('the time scale follows the refresh rate', () => {
  assert.equal(historySpan(120, 1), 'last 2 min');
  assert.equal(historySpan(120, 4), 'last 30 s');
  assert.equal(historySpan(120, 10), 'last 12 s');
});

test('a node of the cluster reads as one line per GPU and per rank', () => {
  const gpu = {
    gpu: '0',
    uuid: 'GPU-0',
    model: 'NVIDIA H100 80GB HBM3',
    util_pct: 87,
    fb_used_mib: 20 * 1024,
    fb_free_mib: 60 * 1024,
    power_w: 250.12,
    util_history: [] as [number, number][]
  };
  assert.equal(clusterGpuText(gpu), '87% · 20.0 GiB / 80.0 GiB · 250 W');
  assert.equal(
    clusterGpuText({ ...gpu, util_pct: null, fb_free_mib: null, power_w: null }),
    'n/a · 20.0 GiB'
  );
  const rank = {
    rank: 3,
    local_rank: 1,
    pid: 42,
    program: 'train.py',
    steps: 100,
    steps_per_s: 12.34,
    joules_per_sample: null
  };
  assert.equal(clusterRankText(rank), 'rank 3 · train.py · 12 steps/s');
  assert.equal(
    clusterRankText({ ...rank, rank: null, program: null, steps_per_s: 2.34, joules_per_sample: 1.42 }),
    'pid 42 · 2.3 steps/s · 1.42 J/sample'
  );
});

test('the cluster section says why it shows no nodes', () => {
  const view = (configured: boolean, reachable: boolean, nodes = 0) => ({
    prometheus: { configured, reachable, error: reachable ? null : 'ConnectionRefusedError' },
    nodes: Array.from({ length: nodes }, () => ({ hostname: 'n', gpus: [], ranks: [] }))
  });
  assert.equal(clusterNotice(view(false, false)), null);
  assert.match(clusterNotice(view(true, false))!, /unreachable: ConnectionRefusedError/);
  assert.match(clusterNotice(view(true, true))!, /no GPU series/);
  assert.equal(clusterNotice(view(true, true, 1)), null);
  assert.ok(isClusterView(view(true, true)) && !isClusterView({ nodes: 1 }));
});
