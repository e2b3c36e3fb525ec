"""TGI releases: how each sizes its KV pool after the warmup prefill, read from huggingface/text-generation-inference
at each tag (`server/text_generation_server/models/flash_causal_lm.py::warmup`, `models/globals.py`,
`utils/import_utils.py::get_cuda_free_memory`).

`free` is `torch.cuda.mem_get_info` after the weights, the warmup batch's blocks and a worst-case prefill of
`max_batch_prefill_tokens`; `f` is `--cuda-memory-fraction`; `T` the device total torch reports.
- 0.9.0-0.9.3: no sizing: the pool is the `--max-batch-total-tokens` given (default 16000), allocated before the
  warmup prefill, which fails when the two do not fit; a plan emits the KV the formula below leaves as that flag.
- 0.9.4-1.4.0: KV = free - (1 - f) x T (no wiggle room).
- 1.4.1-2.3: KV = 0.95 x (free - (1 - f) x T) ("Leave 5% for some wiggle room"; TGI_WIGGLE_ROOM 0.95 from 2.3).
- 2.4: the same with TGI_WIGGLE_ROOM 0.90.
- 3.x: KV = free - (1 - f x W) x T, W = TGI_WIGGLE_ROOM: 0.95 (3.0), 0.93 (3.1-3.2), 0.90 (3.3+).
The warmup batch's own blocks are added back (they were allocated when `free` was read). Block size 16 before 2.2;
2.2: 256 with flashdecoding; 2.3+: 1 (flashinfer), 256 (flashdecoding), 16 (paged).
"""

from __future__ import annotations

from math import floor

from kvops.engines.release import Rule, Version
from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.units import GiB

# The non-torch memory TGI's warmup leaves out of the torch cache, per shard (tp 1, tp >= 2): the fit's prior where no
# TGI log of that tp measures it (kvops.engines.overhead_fit, `non_torch_prior`). TGI reads the device's free memory
# (`torch.cuda.mem_get_info`, utils/import_utils.py), so this holds the CUDA context and every library's buffers,
# which vLLM's non-torch figures (measured above a baseline taken once the context exists) leave out: they are no
# prior for TGI. No TGI log prints it. At tp 1 it is what the one public page showing a card's memory after a TGI
# warmup leaves besides the weights and the pool (tests/fixtures/corpus, tgi-2.2.0-a10g-llama-3.1-8b-instruct:
# nvidia-smi 19882 MiB used on the A10G 15 minutes after warmup, Llama-3.1-8B's 8,030,261,248 16-bit parameters,
# the logged pool of 19056 tokens x 128 KiB): 2183.5 MiB. `init_kv_cache` empties the torch cache before it
# allocates the pool (flash_causal_lm.py at v2.2.0), so the warmup prefill's activations are not in it; the CUDA
# graphs captured after the sizing and whatever the requests served since left cached are, and are taken too (err
# toward less KV). At tp >= 2 the two TGI logs in the fit leave 0.95 and 1.26 GiB per shard besides kvops' model of
# their warmup, NCCL's buffers included: the 1 GiB prior kvops had stands, and the fitted excess (on those logs)
# carries the rest.
NON_TORCH_PRIOR = (19882 * GiB // 1024 - 8_030_261_248 * 2 - 19056 * 128 * 1024, GiB)

NEWEST = "3.3.7"  # the last release (the project is in maintenance mode since 2025-12-11)
FAMILIES = ("TGI 1.x/2.x", "TGI 3.x")
SOURCE = "huggingface/text-generation-inference"


@frozen
class TgiRelease:
    version: Version
    how: str

    @property
    def family(self) -> str:
        return "TGI 3.x" if self.version.at_least(3, 0) else "TGI 1.x/2.x"

    @property
    def label(self) -> str:
        return f"TGI {self.version}"

    @property
    def wiggle_room(self) -> float:
        """The share of the free memory (before 3.0) or of the device (3.0+) the pool may take."""
        version = self.version
        if version.at_least(3, 3):
            return 0.90
        if version.at_least(3, 1):
            return 0.93
        if version.at_least(3, 0):
            return 0.95
        if version.at_least(2, 4):
            return 0.90
        return 0.95 if version.at_least(1, 4, 1) else 1.0

    @property
    def sizes_pool(self) -> bool:
        """0.9.4+: the warmup sizes the pool from free memory. 0.9.0-0.9.3 allocate the `--max-batch-total-tokens`
        given (default 16000) as ceil(N / 16) + 10 blocks and fail the warmup when it does not fit
        (flash_causal_lm.py `warmup(batch, max_total_tokens)`)."""
        return self.version.at_least(0, 9, 4)

    @property
    def attention_sets_block_size(self) -> bool:
        """2.3+: the attention backend picks the block size (flashinfer 1, flashdecoding 256, paged 16)."""
        return self.version.at_least(2, 3)

    def kv_budget(self, total: int, free: int, fraction: float) -> int:
        """KV bytes the shard allocates from the memory free after warmup (before adding the warmup batch back)."""
        if self.version.at_least(3, 0):
            return max(0, floor(free - (1 - fraction * self.wiggle_room) * total))
        return floor(self.wiggle_room * max(0, free - (1 - fraction) * total))

    def budget_formula(self, fraction: float) -> str:
        if self.version.at_least(3, 0):
            return f"free after warmup - (1 - cuda_memory_fraction {fraction:g} x TGI_WIGGLE_ROOM {self.wiggle_room:g}) x total"
        wiggle = f"{self.wiggle_room:g} x " if self.wiggle_room < 1 else ""
        return f"{wiggle}(free after warmup - (1 - cuda_memory_fraction {fraction:g}) x total)"

    def rules(self) -> list[Rule]:
        return [
            Rule(
                f"KV pool = {self.budget_formula(1.0)}",
                f"{SOURCE} v{self.version.major}.{self.version.minor} flash_causal_lm.py warmup",
            ),
            Rule(
                "block size: attention backend (flashinfer 1, flashdecoding 256, paged 16)"
                if self.attention_sets_block_size
                else "block size 16 (256 with flashdecoding from 2.2)",
                f"{SOURCE} models/globals.py",
            ),
            Rule(self.prefill_rule, f"{SOURCE} launcher/src/main.rs v{self.version.major}.{self.version.minor}"),
        ]

    @property
    def prefill_rule(self) -> str:
        """How the launcher picks --max-batch-prefill-tokens when it is not given (prefill.py)."""
        if self.version.at_least(3, 0):
            return (
                "default max-batch-prefill-tokens: the card's f16 FLOP/s x shards // the model's FLOPs a token, else "
                "4096 (qwen2-vl 10000 from 3.1.1, gemma3 8000 from 3.2.0), at most max_position_embeddings and a "
                "VRAM cap"
            )
        if self.version.at_least(2, 4, 1):
            return "default max-batch-prefill-tokens: 4096, at most max_position_embeddings"
        if self.version.at_least(2, 0):
            return "default max-batch-prefill-tokens: max_input_tokens + 50"
        return "default max-batch-prefill-tokens: 4096"

    def to_dict(self) -> dict:
        return {
            "engine": "tgi",
            "version": str(self.version),
            "family": self.family,
            "how": self.how,
            "rules": [rule.to_dict() for rule in self.rules()],
        }


def release(text: str | None, how: str | None = None) -> TgiRelease:
    if text is None:
        return TgiRelease(Version.parse(NEWEST), "the newest release (default; --engine-version to plan another)")
    version = Version.given(text)
    if version.major == 0 and version.minor > 9:
        raise UsageError(f"--engine-version {text}: TGI has no release {version} (0.9.4, then 1.0.0)")
    if version > Version.parse(NEWEST):
        raise UsageError(f"--engine-version {text}: the last TGI release is {NEWEST}")
    if not version.at_least(0, 9):
        raise UsageError(f"--engine-version {text}: TGI sizes its KV pool itself from 0.9; give 0.9 or later")
    return TgiRelease(version, how or f"--engine-version {text}")
