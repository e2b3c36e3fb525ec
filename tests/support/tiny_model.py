"""Test models built on this machine: a config.json and a tokenizer trained offline with `tokenizers`.

Engines load them with `--load-format dummy` (random weights); nothing comes from a hub.
"""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

# A llama shape the vLLM CPU build accepts (its attention rejects head_dim 16; 64 works).
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def corpus() -> list[str]:
    """Deterministic training text: enough words for a few hundred merges."""
    words = [
        "the",
        "cache",
        "grows",
        "with",
        "every",
        "token",
        "while",
        "the",
        "engine",
        "serves",
        "requests",
        "from",
        "many",
        "users",
        "at",
        "once",
        "memory",
        "pressure",
        "preemption",
        "queue",
        "scheduler",
        "block",
        "page",
        "layer",
        "head",
        "window",
        "latent",
        "budget",
        "plan",
        "watch",
        "alert",
        "runbook",
        "degrade",
        "reject",
        "retry",
        "model",
        "prompt",
        "answer",
        "question",
        "context",
        "document",
    ]
    return [" ".join(words[(i * 7 + j) % len(words)] for j in range(24)) for i in range(400)]


def train_tokenizer(vocab_size: int = 512):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return tokenizer


def build_model(folder: Path, config: dict | None = None) -> Path:
    """Write config.json, tokenizer.json and tokenizer_config.json into `folder`; return it."""
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(TINY_LLAMA if config is None else config)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer = train_tokenizer(min(512, config.get("vocab_size", 512)))
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": config.get("max_position_embeddings", 2048),
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return folder


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(
        description="Build the test model (config.json + offline-trained tokenizer) in FOLDER."
    )
    parser.add_argument("folder", type=Path)
    print(build_model(parser.parse_args().folder))
