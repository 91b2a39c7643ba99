"""A tiny random causal LM and tokenizer, built in seconds with no download.

No model weights can be fetched in CI or on the lent GPU machine, so every code path of training
(chat template, generation, logprobs, masks, the critic, checkpoints) is exercised on a small
`Qwen2ForCausalLM` with random weights and a byte-level BPE tokenizer trained on the fly on the
package's own text (SKILL.md, the suite's tasks and solutions), with a Qwen-style chat template that
renders tools and hermes `<tool_call>` blocks. It learns nothing about CUDA; it is a stand-in with
the real shapes of the real thing.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen2.5's template, reduced: tools listed in the system turn, assistant tool calls as hermes
# blocks, tool results as <tool_response> blocks inside a user turn.
CHAT_TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions. Function signatures are in <tools></tools>:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each call, return a JSON object within <tool_call></tool_call> tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{% if message.content %}{{ message.content }}{% endif %}
{%- for tc in message.tool_calls or [] %}{{ '\n' }}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments if tc.function.arguments is string else tc.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}{{ '\n' }}<tool_response>
{{ message.content }}
</tool_response>
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>
{% endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def _corpus() -> list[str]:
    root = files("cuda_agent")
    texts = [(root / "agent" / "SKILL.md").read_text(), (root / "agent" / "SKILL_cpu.md").read_text(),
             '<tool_call>\n{"name": "write_file", "arguments": {"path": "kernels/op.cpp", "content": ""}}\n</tool_call>',
             "<tool_response>\nverify: PASSED reward 1\n</tool_response>"]
    suite = Path(str(root / "suite"))
    texts += [p.read_text() for p in sorted(suite.rglob("*.py"))[:60]]
    return texts


def build_tokenizer(vocab_size: int = 1024):
    """A byte-level BPE tokenizer trained on the package's text, with the Qwen chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny(out: Path | None = None, *, vocab_size: int = 1024, hidden: int = 64, layers: int = 2,
               heads: int = 4, seed: int = 0):
    """(model, tokenizer): a random Qwen2ForCausalLM of ~0.2M parameters. With `out`, both are saved
    there (save_pretrained), so every stage and verl can load them by path."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer(vocab_size)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=32768, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if out is not None:
        out = Path(out)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return model, tokenizer
