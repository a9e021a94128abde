"""Tiny random-weight Hugging Face models, built with transformers and saved
as safetensors (no network), for the engine tests."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 160


def build(kind: str, directory: Path, seed: int = 0, vocab: int = VOCAB) -> torch.nn.Module:
    import transformers as tf

    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=2,
        bos_token_id=1,
    )
    if kind == "llama":
        config, cls = tf.LlamaConfig(**common), tf.LlamaForCausalLM
    elif kind == "qwen2":
        config, cls = tf.Qwen2Config(**common, tie_word_embeddings=True), tf.Qwen2ForCausalLM
    elif kind == "qwen3":
        config, cls = tf.Qwen3Config(**common, head_dim=32), tf.Qwen3ForCausalLM
    else:
        raise ValueError(kind)
    torch.manual_seed(seed)
    model = cls(config).eval()
    model.save_pretrained(directory)
    return model


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def write_tokenizer(directory: Path) -> object:
    """A byte-level BPE tokenizer trained on a toy corpus (259 tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(
        ["hello world, the quick brown fox jumps over the lazy dog"] * 20, trainer
    )
    tok.save(str(directory / "tokenizer.json"))
    return tok
