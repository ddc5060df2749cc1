"""Where the memory goes: what the memory probe records of one sampled step (``meta["memory"]``), and the
report's ``memory`` section built from it."""

from __future__ import annotations

from typing import Literal, TypedDict

PeakSource = Literal["cuda_allocator", "process_uss"]
"""What the peak was read from: the caching allocator's bytes in use, or the process's USS (CPU)."""


Category = Literal["parameters", "gradients", "optimizer_state", "activations", "other", "fragmentation"]
"""A part of a device's memory bar."""


class MemoryBlock(TypedDict):
    """One block of the model (an item of its longest module list, else a child) on the sampled forward."""

    path: str  # its attribute path from the model: "layers[3]", "encoder.layer[0]", "conv1"
    activations_bytes: int  # storages saved for backward inside it (first seen there)
    input_bytes: int  # its tensor inputs: what checkpointing it keeps
    forward_s: float  # its forward time: what recomputing it in backward costs


class MemoryDeviceMeta(TypedDict):
    """One device's bytes on the sampled step, as recorded."""

    device: str  # "cuda:0", "cpu"
    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int  # saved for backward by the sampled forward (parameters left out)
    peak_bytes: int | None  # the most in use, read through the sampled step
    peak_stage: str | None  # the stage the peak reading fell in
    peak_source: PeakSource
    reserved_at_peak_bytes: int | None  # CUDA: the allocator's reserved bytes at the peak reading
    forward_start_bytes: int | None  # in use as the sampled forward began
    backward_start_bytes: int | None  # in use as its backward began
    total_bytes: int | None  # the device's memory (the machine's, for the CPU)
    alloc_retries: int | None  # CUDA: the allocator's retries over the sampled step
    ooms: int | None


class MemoryMeta(TypedDict):
    """``meta["memory"]``: the memory probe's one sampled step."""

    step: int  # the step sampled, 1-based, counted by forwards with gradients
    model: str  # the model's class
    model_name: str | None  # the model's name in the code that called it
    hf_checkpointing: bool  # the model has gradient_checkpointing_enable() (Hugging Face)
    param_dtype: str | None  # the first parameter's dtype ("float32")
    alloc_conf: str | None  # PYTORCH_CUDA_ALLOC_CONF as the sampled step ran
    optimizer: str | None  # the optimizer's class
    optimizer_name: str | None  # the optimizer's name in the code that stepped it
    batch_size: int | None  # the first dimension of the forward's first tensor argument
    blocks_path: str | None  # the module list the blocks are items of ("layers"), None: the children
    blocks: list[MemoryBlock]
    devices: list[MemoryDeviceMeta]
    host_embeddings: list[HostEmbedding]  # the model on a GPU: its large embedding tables left on the host


class BatchCheck(TypedDict):
    """``memory.devices[i].batch_check``: tuning's doubled batch (copies of the model, on this device)
    against the estimate's prediction for it."""

    batch: int  # the batch tuning ran, and doubled
    single_peak_bytes: int  # tuning's step at that batch: the allocator's peak (its copies counted)
    doubled_peak_bytes: int  # at twice that batch
    measured_peak_bytes: int  # peak_bytes plus the doubled step's rise over the single one's
    predicted_peak_bytes: int  # peak_bytes plus activation_bytes_per_sample times the batch
    agrees: bool  # within CHECK_TOLERANCE of each other; else largest_batch takes the measured growth


class MemoryDevice(TypedDict):
    """``memory.devices[i]``: where one device's memory went on the sampled step."""

    device: str
    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int
    other_bytes: int | None  # the peak less the four above and fragmentation: temporaries (CPU: the process)
    fragmentation_bytes: int | None  # CUDA: reserved but unused at the peak; None on the CPU
    peak_bytes: int | None
    peak_stage: str | None
    peak_source: PeakSource
    peak_fraction: float | None  # of total_bytes
    total_bytes: int | None
    activation_bytes_per_sample: float | None
    largest: (
        Literal["parameters", "gradients", "optimizer_state", "activations", "other", "fragmentation"] | None
    )
    largest_fraction: float | None  # its share of the bar
    alloc_retries: int | None
    ooms: int | None
    largest_batch: int | None  # estimate: batches of this size fit the free memory, by the growth per sample
    batch_check: BatchCheck | None  # tuning's doubled batch measured against the estimate; None: not run here


class DatasetContainer(TypedDict):
    """A list or dict the DataLoader's dataset holds (``collect.dataset_memory``)."""

    attribute: str  # its path from the dataset: "rows", "dataset.rows" (a Subset's)
    kind: str  # "list of dict", "dict of str": its class and its items' most common class
    length: int
    bytes: int  # an estimate: its own size and its items', from its first few, one level deep


class WorkerMemoryMeta(TypedDict):
    """``meta["worker_memory"][i]``: one DataLoader worker's own USS readings (``collect.worker_load``)."""

    pid: int
    first_uss_bytes: int  # as its first fetch began
    last_uss_bytes: int  # at its last reading
    samples: int  # samples it read before its last reading


class WorkerMemory(WorkerMemoryMeta):
    """``memory.host.workers[i]``: one forked worker's unique memory over its life in the window."""

    growth_bytes: int  # last less first: the pages it copied, copy-on-read among them


class HostEmbedding(TypedDict):
    """``memory.host.embeddings[i]``: an embedding table kept in host memory while the model trains on a GPU."""

    path: str  # its attribute path from the model ("user_emb", "tables[0]")
    bytes: int
    parameter_share: float  # of all the model's parameter bytes
    forward_s: float  # its lookups on the CPU in the sampled forward (0: not timed)


class HostMemory(TypedDict):
    """``memory.host``: the host side of the training's memory."""

    start_method: str | None  # how the DataLoader's workers started; None: no workers
    dataset_name: str | None  # the dataset's name in the user's code
    containers: list[DatasetContainer]  # the dataset's largest lists and dicts
    workers: list[WorkerMemory]  # forked workers that read their own USS (none under spawn or forkserver)
    worker_growth_bytes: int | None  # the workers' mean growth; None: none measured
    pinned_bytes: int | None  # page-locked host memory the CUDA host allocator held at most; None: not read
    swap_start_bytes: int | None  # the machine's swap in use as the window opened
    swap_growth_bytes: int | None  # its most above that during the run; None: not read
    embeddings: list[HostEmbedding]  # tables of >= 25% of the parameter bytes on the host, the model on a GPU


class MemorySection(TypedDict):
    """``memory``: one sampled step's memory, per device, and the host side (``host``).
    Without a sampled step (no model was seen) the step's fields are None or empty."""

    step: int | None
    model: str | None
    model_name: str | None
    hf_checkpointing: bool
    param_dtype: str | None
    alloc_conf: str | None
    optimizer: str | None
    optimizer_name: str | None
    batch_size: int | None
    blocks_path: str | None
    blocks: list[MemoryBlock]
    devices: list[MemoryDevice]
    host: HostMemory | None  # None: nothing of the host's memory was read
