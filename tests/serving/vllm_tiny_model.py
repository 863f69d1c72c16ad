"""Build a tiny Llama model directory that vLLM can serve, without downloading anything.

    <vllm venv python> tests/serving/vllm_tiny_model.py OUT_DIR

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


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR")
    print(build(Path(sys.argv[1])))
