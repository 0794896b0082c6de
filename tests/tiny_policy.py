"""A policy small enough to train on two CPU cores: a random Qwen2 model (hidden 64, 2 layers) over
a byte-level BPE vocabulary of 1,024 tokens (with the three special tokens the chat template
writes), as a tokenizer for TRL and as a GGUF file for llama.cpp. A trainer on the CPU scores every
position against the whole vocabulary: with the embedded model's 151,936 tokens one GRPO step of
twelve agent rollouts took minutes. Learnt merges keep prompts about as long as a real model's
(bytes alone made them 3,100 tokens, where llama.cpp's and the trainer's rotary embeddings drift
apart by 1e-3 in log-probability)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 1024
# Qwen2's pre-tokenizer, which llama.cpp's "qwen2" applies too: the same pieces on both sides, so the
# same merges give the same ids
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")


@lru_cache(maxsize=1)
def tokenizer() -> Any:
    """A byte-level BPE of VOCAB_SIZE tokens learnt from what the agent sends (its system prompt and
    tool schemas), so a rollout's prompt is about as many tokens as a real model's; for transformers."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from hermes_batch.agent import AGENT_SYSTEM_PROMPT
    from hermes_batch.tools import TOOLS
    from hermes_batch.tools.base import openai_schema

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(SPLIT), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    corpus = [AGENT_SYSTEM_PROMPT, *(json.dumps(openai_schema(t)) for t in TOOLS.values())] * 4
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                         show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def vocabulary_gguf(path: Path) -> Path:
    """The same vocabulary as a GGUF file holding nothing else (what write_gguf copies into every
    policy file it writes)."""
    import gguf

    tok = tokenizer()
    model = json.loads(tok.backend_tokenizer.to_str())["model"]
    tokens = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIAL else 1 for t in tokens])  # 3: control tokens
    w.add_token_merges(merges)
    w.add_bos_token_id(tok.pad_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def policy(seed: int = 0) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    tok = tokenizer()
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16384,
                         rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.pad_token_id)
    return Qwen2ForCausalLM(config)
