"""A deployment as it is stated: by the user's options, or by a run's own log and metrics (`kvops calibrate`,
`kvops explain`), before anything is looked up. `plan_inputs()` resolves it: the model loaded, the GPU found, the
workload, profile and policy files read.

What the user typed wins over what a run states (`under`); what neither states keeps the engine's default.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from kvops.errors import ConfigError, UsageError
from kvops.frozen import frozen
from kvops.plan import LoraSlots, PlanInputs, Speculative
from kvops.profile import Profile
from kvops.workload import Workload, parse_workload


@frozen
class DeploymentOptions:
    model: str | None = None
    engine: str = "vllm"
    engine_version: str | None = None  # the release to plan for (None: the newest); a run states its own
    gpu: str | None = None  # a catalog name
    gpu_memory: int | None = None  # bytes per device
    gpus: int | None = None
    tp: int | None = None
    device: str = "gpu"
    max_model_len: int | str | None = None
    kv_dtype: str = "auto"
    quantization: str = "auto"
    quantization_method: str | None = None  # vLLM's --quantization value, as a pasted command gave it
    memory_fraction: float | None = None
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None  # vLLM --num-gpu-blocks-override
    extensible_kv_cache: bool | None = None  # vLLM 0.34+ --[no-]enable-extensible-kv-cache
    vmm: bool = True  # False: the driver has no virtual memory management (vLLM 0.34 then profiles)
    custom_all_reduce: bool = True  # False: vLLM --disable-custom-all-reduce
    as_run: bool = False  # a run's own launch: what it does not state ran at the engine's defaults
    compilation_config: str | None = None  # vLLM --compilation-config JSON
    batched_tokens: int | None = None
    block_size: int | None = None
    enforce_eager: bool = False
    max_num_seqs: int | None = None
    prompt_tokens: int | None = None
    gen_tokens: int | None = None
    workload: str | None = None  # a JSONL file of requests
    beams: int = 1
    n: int = 1
    concurrency: int | str | None = None
    max_input_tokens: int | None = None
    guard: bool | None = None
    max_queued: int | None = None
    kv_offloading_size: float | None = None  # GiB of host memory for vLLM's KV tier, all TP ranks
    kv_offloading_backend: str | None = None
    profile: str | None = None  # a calibration profile file
    policy: str | None = None  # a degrade policy file
    launcher: tuple[str, ...] = ()
    pp: int | None = None  # pipeline-parallel stages
    dcp: int = 1  # vLLM decode context parallelism
    expert_parallel: bool = False
    dtype: str = "auto"  # the serving dtype
    text_only: bool = False  # the vision tower is not loaded
    speculative_config: str | None = (
        None  # vLLM's --speculative-config JSON (TGI --speculate as {"method": "speculate"})
    )
    hybrid_manager: bool = True
    prefix_caching: bool | None = None
    chunked_prefill: bool = True
    performance_mode: str = "balanced"
    async_scheduling: bool | None = None
    disable_sliding_window: bool = False
    kv_skip_layers: tuple[str, ...] = ()
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    fully_sharded_loras: bool = False
    lora_dtype: str = "auto"
    mamba_cache_mode: str | None = None
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    cpu_offload_bytes: int = 0
    command_lines: tuple[str, ...] = ()  # what a pasted launch command's other options are (--from-command)
    kept_options: tuple[tuple[str, ...], ...] = ()  # those options' words, as given: the plan's command ends with them
    port: int | None = None  # the pasted command's --port (None: the engine's default)
    # the scheduler's flags a pasted command states (policy, watermark, ...): memory does not change with them,
    # kvops simulate runs them
    scheduler_flags: tuple[tuple[str, Any], ...] = ()
    given: frozenset[str] = frozenset()  # the fields stated (typed by the user, or read from a run)

    @classmethod
    def stated(cls, **values: Any) -> DeploymentOptions:
        """Options that say only these fields (a run's own statement of how it was launched)."""
        return cls(**values, given=frozenset(values))

    def under(self, run: DeploymentOptions) -> DeploymentOptions:
        """These options where they were given; what the run states for the rest."""
        taken = {name: getattr(run, name) for name in run.given - self.given}
        return replace(self, **taken, given=self.given | run.given)

    def field_names(self) -> list[str]:
        return [item.name for item in fields(self) if item.name != "given"]

    def request_workload(self) -> Workload:
        """The workload the options describe: a JSONL file sized at its p95, or the per-request flags."""
        sequences = self.beams * self.n
        if self.workload:
            return parse_workload(_read_text(self.workload, "--workload").splitlines(), self.workload, sequences)
        source = "flags" if self.prompt_tokens is not None or self.gen_tokens is not None else "none"
        return Workload(self.prompt_tokens, self.gen_tokens, sequences, source)

    def plan_inputs(self, workload: Workload | None = None) -> PlanInputs:
        """The planner's inputs: the model loaded, the GPU resolved, the files read."""
        from kvops.cpu_features import has_amx_tiles, has_avx512, has_avx512_bf16
        from kvops.gpus import resolve_gpu
        from kvops.model import load_model

        if self.model is None:
            raise ConfigError("no model: give --model MODEL (or --from-command with the engine's launch line)")
        if self.device == "cpu" and self.gpu:
            raise UsageError(
                f"--gpu {self.gpu} with --device cpu: the CPU build keeps its KV cache in host memory; give "
                "--kv-cache-memory-bytes (or --gpu-memory for the host memory) instead"
            )
        spec = load_model(self.model)
        warn, gpu_memory_below = policy_levels(self.policy)
        pinned = self.kv_cache_memory_bytes
        needs_gpu = self.gpu or self.gpu_memory or (self.device == "gpu" and pinned is None)
        pp = self.pp or 1
        return PlanInputs(
            engine=self.engine.lower(),
            engine_version=self.engine_version,
            spec=spec,
            gpu=resolve_gpu(self.gpu, self.gpu_memory) if needs_gpu else None,
            tp=self.tp or (self.gpus // pp if self.gpus and self.pp else self.gpus) or 1,
            gpus=self.gpus,
            pp=pp,
            dcp=self.dcp,
            expert_parallel=self.expert_parallel,
            dtype=self.dtype,
            text_only=self.text_only,
            speculative=self.speculative(),
            hybrid_manager=self.hybrid_manager,
            prefix_caching=self.prefix_caching,
            chunked_prefill=self.chunked_prefill,
            performance_mode=self.performance_mode,
            async_scheduling=self.async_scheduling,
            disable_sliding_window=self.disable_sliding_window,
            kv_skip_layers=self.kv_skip_layers,
            lora=self.lora_slots(),
            mamba_cache_mode=self.mamba_cache_mode,
            mamba_cache_dtype=self.mamba_cache_dtype,
            mamba_ssm_cache_dtype=self.mamba_ssm_cache_dtype,
            cpu_offload_bytes=self.cpu_offload_bytes,
            command_lines=self.command_lines,
            kept_options=self.kept_options,
            port=self.port,
            scheduler_flags=self.scheduler_flags,
            device=self.device,
            cpu_amx=self.device == "cpu" and has_amx_tiles(),
            cpu_avx512_bf16=self.device == "cpu" and has_avx512_bf16(),
            cpu_fp8_kv=self.device != "cpu" or has_avx512() or has_amx_tiles(),
            max_model_len=self.max_model_len,
            workload=workload if workload is not None else self.request_workload(),
            concurrency=self.concurrency,
            kv_dtype=self.kv_dtype,
            quantization=self.quantization,
            quantization_method=self.quantization_method,
            memory_fraction=self.memory_fraction,
            kv_cache_memory_bytes=pinned,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            extensible_kv_cache=self.extensible_kv_cache,
            vmm=self.vmm,
            custom_all_reduce=self.custom_all_reduce,
            as_run=self.as_run,
            compilation_config=self.compilation_config,
            batched_tokens=self.batched_tokens,
            max_num_seqs=self.max_num_seqs,
            block_size=self.block_size,
            enforce_eager=self.enforce_eager,
            guard=self.guard,
            launcher=self.launcher,
            max_queued=self.max_queued,
            max_input_tokens=self.max_input_tokens,
            profile=load_profile(self.profile) if self.profile else None,
            warn_level=warn,
            kv_offloading_size=self.kv_offloading_size,
            kv_offloading_backend=self.kv_offloading_backend,
            gpu_memory_target=gpu_memory_below,
        )

    def speculative(self) -> Speculative | None:
        """The speculative decoding the options ask for, with the draft's spec loaded when it has one."""
        if not self.speculative_config:
            return None
        from kvops.model import load_model
        from kvops.speculative import speculative_settings

        settings = speculative_settings(self.speculative_config)
        draft = load_model(settings.model) if settings.model else None
        return Speculative(settings.method, settings.tokens, draft, settings.draft_tp, self.speculative_config)

    def lora_slots(self) -> LoraSlots | None:
        """vLLM's LoRA slots, with --enable-lora (its other LoRA options alone change nothing, as in vLLM)."""
        if not self.enable_lora:
            return None
        return LoraSlots(self.max_loras, self.max_lora_rank, self.fully_sharded_loras, self.lora_dtype)


# levels.warn and gpu_memory.below in kvops/data/policy.yaml (a test holds them equal): plans read no YAML
SHIPPED_WARN_LEVEL = 0.70
SHIPPED_GPU_MEMORY_BELOW = 0.80


def policy_levels(policy_path: str | None) -> tuple[float, float]:
    """What a plan reads of a policy file (or the shipped policy): the warn threshold it sizes concurrency under,
    and the share of device memory the policy keeps in use under."""
    if policy_path is None:
        return SHIPPED_WARN_LEVEL, SHIPPED_GPU_MEMORY_BELOW
    from kvops.policy import Level, load_policy

    policy = load_policy(policy_path)
    return policy.thresholds[Level.WARN], policy.gpu_memory_below


def warn_level(policy_path: str | None) -> float:
    """The warn threshold of a policy file (or the shipped policy): what plans size concurrency under."""
    return policy_levels(policy_path)[0]


def load_profile(path: str) -> Profile:
    """A calibration profile (YAML or JSON): a regular file of at most 1 MiB, without alias bombs."""
    from kvops.files import SETTINGS_LIMIT, read_yaml

    return Profile.from_dict(read_yaml(path, "--profile", SETTINGS_LIMIT, ConfigError), path)


def _read_text(path: str, option: str) -> str:
    """A workload file: a regular file (a FIFO or a device is refused), bounded."""
    from kvops.files import LOG_LIMIT, read_text

    return read_text(path, option, LOG_LIMIT, ConfigError)
