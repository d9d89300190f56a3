"""Structured configuration: one dataclass per config group, registered in Hydra's ConfigStore.

The YAML files under ``conf/`` only pick values; these dataclasses define which keys exist, so a
misspelled key (in a YAML file or a command-line override) fails with the key named, and the
keys with a fixed set of values are enums, so a bad value fails with the choices listed
(``energy.policy=fastest`` -> ``expected one of [no_slowdown, slowdown, ...]``). Core classes
take these dataclasses (or plain values), never a ``DictConfig``: apps convert once with
:func:`to_object`. The keys are listed in ``docs/design.md`` ("Configuration").

Annotations stay ``Optional``/``List``: OmegaConf evaluates them at run time, also on the oldest
supported Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from perseus.config.enums import (
    PIPELINE_POLICIES,
    ConfigChoice,
    EmulatedCounter,
    EnergyPolicy,
    Framework,
    GPUBackend,
    GPUOnUnsupported,
    LoggerBackend,
    PlannerEffort,
    PlannerScope,
    PowerLimitSelector,
    ProfilerMode,
    RuntimeMode,
)

__all__ = [
    "PIPELINE_POLICIES",
    "ConfigChoice",
    "EmulatedCounter",
    "EnergyPolicy",
    "Framework",
    "GPUBackend",
    "GPUOnUnsupported",
    "LoggerBackend",
    "PerseusConfig",
    "PlannerEffort",
    "PlannerScope",
    "PowerLimitSelector",
    "ProfilerMode",
    "RuntimeMode",
]


@dataclass
class ModelConfig:
    """What to train (config group ``model``)."""

    name: str = "gpt3-tiny"
    family: str = "gpt"
    num_layers: int = 8
    hidden_size: int = 64
    num_attention_heads: int = 4
    ffn_hidden_size: Optional[int] = None
    seq_length: int = 32
    vocab_size: int = 512
    # Learned position table size; None = seq_length (gpt/bert).
    max_position_embeddings: Optional[int] = None
    # Per-head width of attention (t5's d_kv); None = hidden_size / num_attention_heads.
    kv_channels: Optional[int] = None
    # wide_resnet: inner-width multiplier of every bottleneck (num_layers is the depth, 50/101).
    width_factor: int = 2
    # wide_resnet: channels of the stem (64 in torchvision; smaller for CPU-sized variants).
    base_channels: int = 64
    image_size: int = 224
    num_classes: int = 1000
    # Partition of layers over stages: uniform, uniform_transformer, or custom:0,8,14,20,26.
    partition: str = "uniform"
    # Local dataset: a .npy file of token ids (None = seeded synthetic data).
    dataset: Optional[str] = None
    extra: Any = field(default_factory=dict)


@dataclass
class ParallelismConfig:
    """How the job is split (config group ``parallelism``)."""

    pp: int = 4
    dp: int = 1
    tp: int = 1
    num_microbatches: int = 8
    microbatch_size: int = 1
    schedule: str = "1f1b"
    # Model chunks per stage for the interleaved schedule (Megatron's virtual pipeline).
    num_model_chunks: int = 1


@dataclass
class PowerLimitConfig:
    """Power-limit optimizer settings (used by ``energy=power_limit``)."""

    # Try limits from the maximum down in steps of this many watts.
    step_w: float = 25.0
    # Steps of warm-up after a limit change and steps per measurement window, at least: a
    # warm-up also lasts warmup_s, and a window spans enough energy-counter updates for
    # target_error (both sized from the measured step time).
    warmup_steps: int = 2
    profile_steps: int = 1
    # Warm-up lasts at least this long (s): a GPU holds its power limit on an average over ~1 s,
    # so right after a change it still runs as under the old limit.
    warmup_s: float = 2.0
    # Relative standard error of one window's energy the windows are sized for: (spread of one
    # counter interval's energy / target_error)^2 counter intervals (0.01 with the H100's 6 %
    # under its power limiter: 36, 3.6 s).
    target_error: float = 0.01
    # Confirmation rounds: the best candidates and the highest limit measured again, interleaved,
    # once per round; 3 or more give the saving a 95 % interval (fewer: the report says it has
    # none).
    repeats: int = 6
    # Limits confirmed against the highest one (the best of those not clearly worse than the best).
    max_candidates: int = 2
    # zeus_cost (eta * E + (1 - eta) * P_max * T, eta = energy.eta), energy, time, max_slowdown.
    selector: PowerLimitSelector = PowerLimitSelector.zeus_cost
    # max_slowdown selector: least energy within this fraction of the fastest limit's time.
    max_slowdown: float = 0.1
    # JSON file of measured tables; a matching saved table (job_id, GPU, limits) skips profiling.
    profile_path: Optional[str] = None
    # Name of the recurring job in profile_path.
    job_id: str = "default"


@dataclass
class EnergyConfig:
    """The energy policy (config group ``energy``)."""

    policy: EnergyPolicy = EnergyPolicy.no_slowdown
    # slowdown: allowed iteration-time increase over all-max, as a fraction (0.05 = 5 %).
    max_slowdown: Optional[float] = None
    # deadline: target iteration time in seconds.
    iteration_time_s: Optional[float] = None
    # zeus_cost: weight of energy in eta * E + (1 - eta) * P_max * T.
    eta: float = 0.5
    power_limit: PowerLimitConfig = field(default_factory=PowerLimitConfig)


@dataclass
class FrameworkConfig:
    """The training framework and its adapter (config group ``framework``)."""

    name: Framework = Framework.deepspeed
    options: Any = field(default_factory=dict)


@dataclass
class EmulatedGPUConfig:
    """Device model used when no NVIDIA GPU is usable."""

    # Device profile CSV (the profile CSV format); None = the bundled A100 profile.
    profile: Optional[str] = None
    # Multiply every profiled time and energy by this (small = quick demo runs).
    time_scale: float = 1.0
    # realistic: counter, reads, power field and power limit behave like a recorded H100
    # (100 ms counter updates, ~3 ms blocking reads); ideal: a periodic counter, free to read.
    counter: EmulatedCounter = EmulatedCounter.realistic
    # Power while blocked on communication (W); None = from the profile's notes.
    blocking_power_w: Optional[float] = None
    # Power before any work and after a long pause (W); None = realistic: the recorded H100's
    # idle share of its maximum power limit (17.6 %), at most the blocking power; ideal: the
    # blocking power.
    idle_power_w: Optional[float] = None
    # Time between counter updates (s); None = 0.1 (realistic) or 0.02 (ideal).
    energy_update_period_s: Optional[float] = None
    energy_noise: float = 0.0
    # Highest (and default) power limit (W); None = realistic: the power of the profile's
    # heaviest instruction (it runs at the cap at default clocks); ideal: 400, or that power
    # where it is higher.
    power_limit_max_w: Optional[float] = None
    power_limit_min_w: float = 100.0
    # Sleep so instructions last their profiled time (off only for hook benchmarks).
    sleep: bool = True
    seed: int = 0
    # Queue work like CUDA: instruction hooks return at once, the work runs on a virtual device
    # timeline at the clocks in force while it runs, synchronize() waits for it.
    asynchronous: bool = False
    # Model the die's temperature (warming toward a power-dependent steady temperature over about
    # a minute) and the leakage power rising with it (docs/design.md, "Thermal drift").
    thermal: bool = False


@dataclass
class GPUConfig:
    """GPU backend (config group ``gpu``)."""

    backend: GPUBackend = GPUBackend.auto
    # Log every clock / power change instead of making it.
    dry_run: bool = False
    # Where restoration state files live (SIGKILL recovery).
    state_dir: Optional[str] = None
    lock_memory_clock: bool = False
    # When the start-up check finds the GPU cannot do what the job needs (lock clocks, set power
    # limits, ...): error stops before step 1; measure_only trains without changing clocks or
    # power limits, measuring time and energy, with one warning.
    on_unsupported: GPUOnUnsupported = GPUOnUnsupported.error
    emulated: EmulatedGPUConfig = field(default_factory=EmulatedGPUConfig)


@dataclass
class ProfilerConfig:
    """Online profiler (config group ``profiler``)."""

    enabled: bool = True
    # sweep: one frequency per (stage, instruction) per window; fast: several per iteration.
    mode: ProfilerMode = ProfilerMode.fast
    # Stop lowering the frequency once energy rose this many times in a row.
    energy_rise_patience: int = 5
    warmup_instructions: int = 2
    min_window_s: float = 0.1
    # The profiling budget: a (stage, clock) is re-measured until its rows' energy is known to
    # 2 % or the budget is spent, then the job plans with what was measured (the rows still
    # uncertain are listed). The budget is the smallest of max_iterations, max_iterations_fraction
    # of job_iterations, and what ran within max_minutes.
    max_iterations: int = 40
    # At most this fraction of the job's iterations profile; None = no such cap.
    max_iterations_fraction: Optional[float] = None
    # The job's length in iterations (conf/profiler/default.yaml: train.max_steps); None = not
    # known (max_iterations_fraction then caps nothing).
    job_iterations: Optional[int] = None
    # Profiling stops once its iterations ran this many minutes; None = no such cap.
    max_minutes: Optional[float] = None
    # Try every n-th supported clock (1 = all of them): a count of clocks, not MHz.
    frequency_step: int = 1
    # Lowest frequency to try (MHz); None = the device's lowest supported.
    min_frequency_mhz: Optional[int] = None
    # Iterations at max speed measured at start-up (the profiler's reference point).
    baseline_steps: int = 3
    # Iterations left unmeasured after every change of phase or plan.
    settle_steps: int = 1
    # Plan iterations measured, each next to one at max speed (the report's baseline): the
    # two alternate so both see the same host load.
    measure_steps: int = 5


@dataclass
class PlannerConfig:
    """Planner (config group ``planner``)."""

    # Profile CSV to plan from (perseus-plan).
    profile: Optional[str] = None
    # GPU power while blocked on pipeline communication (W): one value or one per stage.
    p2p_power_w: Any = 83.64
    solver: str = "lp"
    # lowtime's time quantum (s).
    time_unit_s: float = 1e-3
    # Also write plans in the reference freqs_pipeline_%05d.py format.
    export_reference: bool = False
    # Only keep frequencies at or above this (MHz) when planning; None = all.
    min_frequency_mhz: Optional[int] = None
    plots: bool = True
    # Profile stages to plan, in pipeline order (e.g. [0, 7] for a 2-stage job); None = all
    # stages (perseus-plan: parallelism.pp of them, first, last, evenly spaced, when
    # parallelism.pp is on its command line and smaller).
    stages: Optional[List[int]] = None
    # frontier (every Pareto-optimal plan) | policy (only the energy policy's plan) | auto
    # (the frontier unless it is estimated to exceed max_solve_s, then the policy's plan).
    scope: PlannerScope = PlannerScope.auto
    # perseus-plan refuses work estimated to take longer than this on one core (s).
    max_solve_s: float = 600.0
    # How hard the lp solver searches: fast (no MILP), balanced (seconds for the published
    # 8 x 96 cases, within 0.3 pp of the best bound) or thorough (minutes, within 0.2 pp).
    effort: PlannerEffort = PlannerEffort.balanced


# perseus-server's port when server.port is unset.
DEFAULT_SERVER_PORT = 7787


@dataclass
class ServerConfig:
    """Coordination server (config group ``server``)."""

    # URL of a running server (or PERSEUS_SERVER_URL); None = the job starts its own
    # (perseus-train on its node; in an own script, global rank 0).
    url: Optional[str] = None
    host: str = "127.0.0.1"
    # None: perseus-train's own server (and a launch's, started by global rank 0) takes any free
    # port, so that jobs sharing a node never collide; perseus-server listens on
    # DEFAULT_SERVER_PORT. A port given here is used as is (an error when it is taken).
    port: Optional[int] = None
    token: Optional[str] = None
    dump_dir: Optional[str] = None
    request_timeout_s: float = 10.0
    max_retries: int = 3
    # Base delay between retries (doubles each retry).
    retry_backoff_s: float = 0.2
    # Binding a non-loopback host without a token is refused unless this is true.
    allow_insecure: bool = False
    # A rank silent for this long is marked dead (its job keeps going without it).
    rank_timeout_s: float = 30.0
    # Data-parallel replicas whose iteration times differ by more than this fraction ...
    drift_threshold: float = 0.05
    # ... for this many iterations in a row: the faster ones slow down to the straggler.
    drift_patience: int = 3
    # Seconds to wait for a locally started server to answer /healthz.
    start_timeout_s: float = 60.0
    # Job id all ranks of one job share; None = PERSEUS_JOB_ID, else a fresh one per launch
    # (perseus-train's, or global rank 0's shared through torch.distributed's store).
    job_id: Optional[str] = None
    # Ranks: schedules fetched this many iterations ahead (never waited for).
    prefetch_steps: int = 2
    # Ranks: a stage's ranks combine their measurements through the job's process groups and
    # only the stage's leader talks to the server.
    combine_stage: bool = True
    # Server: largest request body (streamed bodies included), jobs held at once, and memory
    # budgets of one job's state and of all jobs' state (estimated at registration).
    max_body_mb: float = 16.0
    max_jobs: int = 1024
    max_job_state_mb: float = 256.0
    max_state_mb: float = 1024.0
    # Server: worker processes estimating profiles and planning (0: a thread of the server),
    # and BLAS threads per process.
    profiler_workers: int = 1
    planner_workers: int = 1
    blas_threads: int = 1
    # Server: keep every job in <dump_dir>/state.sqlite; a restarted server goes on with them.
    persist: bool = True
    # Server: a measured plan slower than its policy allows by more than this fraction (or the
    # measured noise, if larger) falls back to max speed.
    plan_slowdown_tolerance: float = 0.03
    # Server: false keeps a plan whose measurement fails that check (the verdict is still
    # recorded in the job's summary and events).
    plan_check: bool = True
    # Server: the live model behind /metrics and the live page keeps each GPU's power this
    # long (s), and shows a job whose ranks all ended this long after its end (s).
    live_history_s: float = 600.0
    live_retired_s: float = 3600.0
    # Server: a directory where jobs without a coordination server publish their state
    # (metrics.textfile_dir of those jobs): /metrics and the live page show them too.
    live_dir: Optional[str] = None


@dataclass
class RuntimeConfig:
    """Hook runtime inside every training rank."""

    mode: RuntimeMode = RuntimeMode.online
    plan: Optional[str] = None
    trace: bool = False
    # Check that instructions arrive as the plan expects.
    strict: bool = True


@dataclass
class TrainConfig:
    """Training loop and launcher (config group ``train``)."""

    warmup_steps: int = 2
    measure_steps: int = 5
    max_steps: int = 200
    seed: int = 1234
    lr: float = 1e-3
    # Several nodes (None: from the environment, see perseus.launcher.nodes: NNODES / NODE_RANK /
    # MASTER_ADDR / MASTER_PORT, else the Slurm job step's, else one node).
    nnodes: Optional[int] = None
    node_rank: Optional[int] = None
    master_addr: Optional[str] = None
    # The rendezvous port of a job on several nodes (one node always takes a free port).
    master_port: Optional[int] = None
    nproc_per_node: Optional[int] = None
    progress: bool = True
    # Interpreter the ranks run (None = the launcher's own); framework=merak needs Merak's
    # Python 3.9 environment here (scripts/merak-env prints its path).
    python: Optional[str] = None


@dataclass
class LoggerConfig:
    """Experiment tracker of global rank 0 (config group ``logger``).

    Per iteration: its time, its energy (once the sampler covers it), the clock of every
    stage and the phase; at the end the report's figures. Written by a thread of its own,
    never by the training thread; a tracker that fails costs one warning, never the training.
    """

    backend: LoggerBackend = LoggerBackend.none
    # Where the tracker writes (None: <run directory>/<backend> under perseus-train,
    # perseus-runs/<job id>/<backend> in an own script).
    dir: Optional[str] = None
    # MLflow's tracking URI (None: a file store in ``dir``).
    tracking_uri: Optional[str] = None
    # MLflow experiment / Weights & Biases project, and the run's name (None: the job id).
    experiment: str = "perseus"
    run_name: Optional[str] = None
    # Seconds between the tracker's looks at new iterations.
    interval_s: float = 2.0


@dataclass
class MetricsConfig:
    """Prometheus metrics of jobs without a coordination server (config group ``metrics``).

    A job with a server is scraped at the server's ``/metrics``. Without one (runtime modes
    ``plan``, ``measure``, ``max_speed``; ``energy=power_limit``), every process writes its
    readings in the Prometheus text format into ``textfile_dir`` for node_exporter's textfile
    collector, from a thread of its own.
    """

    # node_exporter's textfile-collector directory (None: no files).
    textfile_dir: Optional[str] = None
    # Seconds between two writes.
    interval_s: float = 5.0


@dataclass
class PerseusConfig:
    """The whole configuration of ``perseus-train`` and ``perseus-plan``."""

    model: ModelConfig = field(default_factory=ModelConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    energy: EnergyConfig = field(default_factory=EnergyConfig)
    framework: FrameworkConfig = field(default_factory=FrameworkConfig)
    gpu: GPUConfig = field(default_factory=GPUConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    output_dir: Optional[str] = None
