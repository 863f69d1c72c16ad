"""Build a tiny Llama model directory that vLLM can serve, without downloading anything.

    <vllm venv python> tests/serving/vllm_tiny_model.py OUT_DIR [--weights SEED]

writes ``OUT_DIR/{config.json, generation_config.json, tokenizer.json, tokenizer_config.json,
special_tokens_map.json}``:

* a hand-written ``LlamaForCausalLM`` config — 2 layers, hidden 128, 2 heads of ``head_dim`` 64
  (head_dim 16 crashes vLLM's CPU attention backend on the first request), context 65,536, the
  vocabulary of the tokenizer (≤ 512), float32 (in bfloat16 on a CPU with AMX, vLLM picks its AMX
  attention kernels and a DP engine's worker died of SIGILL on its first request). There are no
  weights: the server runs with ``--load-format dummy`` (random weights, so the text is noise;
  the token *counts* are what the tests check);
* a byte-level BPE tokenizer trained here with ``tokenizers`` on a small generated corpus
  (deterministic: same corpus, same merges), with ``<s>``/``</s>`` and a one-line chat template so
  ``/v1/chat/completions`` works.

With ``--weights SEED`` it also writes ``model.safetensors``: seeded random weights (N(0, σ) per
matrix, norms 1; ≈ 0.5 M parameters), for a server started *without* ``--load-format dummy``.
Dummy weights give near-uniform logits, so any KV gives the same tokens; these give sharp,
prompt-dependent logprobs, so a wrong prefill→decode KV hand-off changes them.

It runs under the vLLM venv's interpreter (``tokenizers`` comes with vLLM) and imports nothing
from balanceroute, so the test's own environment needs neither.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB_SIZE = 512
MAX_POSITIONS = 65536
BOS, EOS = "<s>", "</s>"
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": MAX_POSITIONS,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}


def corpus(lines: int = 2000) -> list[str]:
    """Deterministic English-ish text (a linear congruential walk over a word list)."""
    words = ("the a request replica decode prefill token slot barrier load balance route cluster "
             "server stream chunk usage model llama tiny byte pair encoding vocabulary merge test "
             "one two three four five six seven eight nine ten hello world chat assistant user "
             "system message content quick brown fox jumps over lazy dog").split()
    state, out = 12345, []
    for _ in range(lines):
        n = 4 + state % 9
        line = []
        for _ in range(n):
            state = (1103515245 * state + 12345) % 2**31
            line.append(words[state % len(words)])
        out.append(" ".join(line) + ".")
    return out


def build(out_dir: Path) -> Path:
    """Write the model directory; returns it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    vocab = tok.get_vocab_size()
    if vocab > VOCAB_SIZE or tok.token_to_id(BOS) != 0 or tok.token_to_id(EOS) != 1:
        raise RuntimeError(f"unexpected tokenizer: vocab {tok.get_vocab_size()}, "
                           f"bos {tok.token_to_id(BOS)}, eos {tok.token_to_id(EOS)}")
    tok.save(str(out_dir / "tokenizer.json"))
    files = {
        # Every id the random weights can sample is a real token: vocab_size = the trained size.
        "config.json": {**LLAMA_CONFIG, "vocab_size": vocab},
        "generation_config.json": {"bos_token_id": 0, "eos_token_id": 1},
        "special_tokens_map.json": {"bos_token": BOS, "eos_token": EOS},
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
            "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
            "model_max_length": MAX_POSITIONS, "chat_template": CHAT_TEMPLATE},
    }
    for name, content in files.items():
        (out_dir / name).write_text(json.dumps(content, indent=2))
    return out_dir


def write_weights(out_dir: Path, seed: int) -> Path:
    """Write ``out_dir/model.safetensors``: the Llama of ``config.json`` with N(0, σ) matrices
    (σ = 1 for the embedding, 0.5 for the output head, 1/√fan_in elsewhere; RMS norms 1) drawn
    from ``torch.Generator().manual_seed(seed)`` — the same seed gives the same bytes."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((out_dir / "config.json").read_text())
    vocab, hidden, inter = cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv_heads, head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    gen = torch.Generator().manual_seed(seed)

    def normal(rows: int, cols: int, std: float) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen, dtype=torch.float32) * std

    tensors = {"model.embed_tokens.weight": normal(vocab, hidden, 1.0),
               "model.norm.weight": torch.ones(hidden),
               "lm_head.weight": normal(vocab, hidden, 0.5)}
    shapes = {"self_attn.q_proj": (heads * head_dim, hidden), "self_attn.k_proj": (kv_heads * head_dim, hidden),
              "self_attn.v_proj": (kv_heads * head_dim, hidden), "self_attn.o_proj": (hidden, heads * head_dim),
              "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
    for layer in range(cfg["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        for name, (rows, cols) in shapes.items():
            tensors[prefix + name + ".weight"] = normal(rows, cols, cols ** -0.5)
        tensors[prefix + "input_layernorm.weight"] = torch.ones(hidden)
        tensors[prefix + "post_attention_layernorm.weight"] = torch.ones(hidden)
    path = out_dir / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--weights"):
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR [--weights SEED]")
    print(build(Path(args[0])))
    if len(args) == 3:
        print(write_weights(Path(args[0]), int(args[2])))
