"""What a sample costs to load, as the profile measured it, and the code that costs it: the data
card's "make each sample cheaper" fix.

The time per batch is the workers' own per-batch seconds (``analyze.loading``) where they timed
themselves, else, without workers, the training thread's ``data`` time per batch; divided by the
batch size, per sample. The code is ``data``'s hot spots (``analyze.hotspots``): the workers' lines
where they sampled their stacks, the training thread's without workers. What was not measured is
said, never guessed.
"""

from __future__ import annotations

from perfmagic.analyze import Analysis
from perfmagic.contract import LoaderConfig
from perfmagic.units import fmt_fraction, fmt_seconds

LISTED = 3
"""Hot lines the fix names."""
LISTED_SHARE = 0.05
"""Share of the loaders' samples below which a line is not named."""
WHAT_TO_DO = [
    "what is the same every epoch (decoding, resizing, features) can be computed once",
    "# and cached (numpy memmap, /dev/shm); array math can move to the GPU, on whole batches",
    "# (torch.fft, torchvision.transforms.v2 on CUDA tensors, decode_jpeg(device='cuda'), NVIDIA DALI);",
    "# or precompute it offline and load the result.",
]


def cheaper_samples_lines(a: Analysis) -> list[str]:
    """Comment lines: the measured time per sample, the lines that cost it with their shares, and what
    to do about each."""
    ld = a.config.loader or LoaderConfig()
    workers = ld.num_workers
    lines = [_cost_line(a, workers, ld.batch_size)]
    loaders = "workers" if workers else "training thread"
    spots = [h for h in a.hotspots.get("data") or [] if h["sampled"] == loaders]
    named = [h for h in spots[:LISTED] if h["share"] >= LISTED_SHARE]
    if named:
        total = round(named[0]["samples"] / named[0]["share"])
        whose = "the workers" if workers else "the training loop"
        lines.append(
            f"# Where {whose} spent it ({total} samples of {'their stacks' if workers else 'its stack'}):"
        )
        lines += [f"#   {fmt_fraction(h['share']):>4}  {h['where']}" for h in named]
        lines += ["# For each: " + WHAT_TO_DO[0], *WHAT_TO_DO[1:]]
    else:
        lines.append(_unnamed(workers, bool(spots)))
        lines += ["# In general: " + WHAT_TO_DO[0], *WHAT_TO_DO[1:]]
    if workers:
        lines.append(
            "# With workers, every batch is also pickled to the training process through shared memory:"
            " fewer, larger batches cut that per-batch cost."
        )
    return lines


def _cost_line(a: Analysis, workers: int, batch: object) -> str:
    """The measured seconds per batch, and per sample where the batch size is known."""
    if workers:
        account = a.loading
        per_batch = account.batch_s if account is not None and account.loaders == "workers" else None
        if per_batch is None:
            return (
                "# The workers did not time their batches (started before profiling, e.g. persistent_workers,"
                " or not forked): the time per sample was not measured."
            )
        who = "a DataLoader worker takes"
    else:
        s = a.steady
        if s is None:
            return "# No steady steps: the time per sample was not measured."
        per_batch = s.stage_s("data") / max(1.0, a.loop.calls_per_step.get("data") or 1.0)
        who = "the training loop takes"
    if isinstance(batch, int) and batch > 0:
        return (
            f"# Measured: {who} {fmt_seconds(per_batch)} per batch of {batch}, "
            f"{fmt_seconds(per_batch / batch)} per sample."
        )
    return f"# Measured: {who} {fmt_seconds(per_batch)} per batch (its size was not seen: not per sample)."


def _unnamed(workers: int, sampled_elsewhere: bool) -> str:
    """Why no line is named."""
    if workers:
        return (
            "# The workers' stacks were not sampled (started before profiling, e.g. persistent_workers, not"
            " forked, or fetches too short to sample): the code that costs the time is not named."
        )
    if sampled_elsewhere:
        return "# No line of the loading stood out in the training thread's stack samples."
    return "# The training thread's stack was not sampled while loading: the code that costs it is not named."
