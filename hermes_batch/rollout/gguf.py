"""A trainer's weights as a GGUF file llama.cpp serves: how a policy trained on the CPU reaches the
server that samples its rollouts (`--model=local --local_model=<file>`).

Written as llama.cpp's own converter writes a Qwen2 model (tensor names, hyper-parameters, float32
tensors), with the vocabulary, merges, special tokens and chat template of a GGUF the model shares
its vocabulary with (by default the embedded model's). Qwen2's attention keeps Hugging Face's
layout in GGUF (its rotary embedding is NeoX-style), so no tensor is permuted."""

from __future__ import annotations

import os
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2"}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}
_LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
          "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
          "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
          "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
          "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}


class ExportError(ValueError):
    """A model this module cannot write as GGUF, named with why."""


def write_gguf(model: Any, path: Path, vocabulary: Path) -> Path:
    """Write `model` (a transformers causal LM on any device) to `path` atomically, with the
    tokenizer fields of the GGUF file `vocabulary`; returns `path`."""
    import gguf  # the [rl] extra

    arch = _architecture(model)
    cfg = model.config
    fields = tokenizer_fields(str(vocabulary))
    if len(fields["tokenizer.ggml.tokens"][1]) != cfg.vocab_size:
        raise ExportError(f"{vocabulary} has {len(fields['tokenizer.ggml.tokens'][1])} tokens, the model "
                          f"{cfg.vocab_size}: give the GGUF whose vocabulary the model was built with")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".part", dir=path.parent)
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, arch)
        w.add_name(path.stem)
        w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size)
        w.add_block_count(cfg.num_hidden_layers)
        w.add_feed_forward_length(cfg.intermediate_size)
        w.add_head_count(cfg.num_attention_heads)
        w.add_head_count_kv(cfg.num_key_value_heads)
        w.add_rope_freq_base(float(_rope_theta(cfg)))
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        for key, (kind, value) in fields.items():
            _add_field(w, gguf, key, kind, value)
        for name, tensor in model.state_dict().items():
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                continue  # llama.cpp reads the embedding as the output when there is no output tensor
            w.add_tensor(_tensor_name(name), tensor.detach().to("cpu").float().numpy())
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _architecture(model: Any) -> str:
    names = getattr(model.config, "architectures", None) or [type(model).__name__]
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    raise ExportError(f"cannot write {names[0]} as GGUF here (known: {', '.join(ARCHITECTURES)}); "
                      "convert it with llama.cpp's convert_hf_to_gguf.py and serve it yourself")


def _rope_theta(cfg: Any) -> float:
    params: dict[str, Any] = getattr(cfg, "rope_parameters", None) or {}  # transformers 5 keeps it there
    theta: Any = params.get("rope_theta") or getattr(cfg, "rope_theta", None) or 10000.0
    return float(theta)


def _tensor_name(name: str) -> str:
    if name.startswith("model.layers."):
        layer, rest = name[len("model.layers."):].split(".", 1)
        if rest in _LAYER:
            return f"blk.{layer}.{_LAYER[rest]}"
    elif name in _TOP:
        return _TOP[name]
    raise ExportError(f"no GGUF name for the tensor {name!r}")


@lru_cache(maxsize=2)
def tokenizer_fields(vocabulary: str) -> dict[str, tuple[str, Any]]:
    """The `tokenizer.*` fields of a GGUF file, as (kind, value); read once per process (a large
    vocabulary takes seconds to parse)."""
    import gguf

    reader = gguf.GGUFReader(vocabulary)
    out: dict[str, tuple[str, Any]] = {}
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            out[key] = (f"array:{field.types[-1].name}", field.contents())
        else:
            out[key] = (kind.name, field.contents())
    if "tokenizer.ggml.tokens" not in out:
        raise ExportError(f"{vocabulary} holds no vocabulary (tokenizer.ggml.tokens)")
    return out


def _add_field(w: Any, gguf: Any, key: str, kind: str, value: Any) -> None:
    if kind.startswith("array:"):
        w.add_array(key, value)
    elif kind == "STRING":
        w.add_string(key, value)
    elif kind == "BOOL":
        w.add_bool(key, value)
    elif kind in ("FLOAT32", "FLOAT64"):
        w.add_float32(key, value)
    else:
        w.add_key_value(key, value, getattr(gguf.GGUFValueType, kind))
