"""The tokenizer families of the presets: special tokens and chat templates.

Each family fixes its special tokens in vocabulary order: id 0 is the pad
token, id 1 the begin-of-sequence token, id 2 the end-of-sequence token (the
ids every preset's config names), then the chat markers. The eos token is
the one that closes an assistant turn in the family's chat template, so the
engine, which stops on the config's `eos_token_id`, ends a chat reply where
the model ends its turn (as the instruction-tuned checkpoints' generation
configs do).

Templates follow each family's own chat format, kept to the plain roles
`system`, `user` and `assistant` with string content:

    gemma       <bos><start_of_turn>user\\nHi<end_of_turn>\\n<start_of_turn>model\\n
    chatml      <|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n
    mistral     <s>[INST] Hi [/INST]
    llama4      <|begin_of_text|><|header_start|>user<|header_end|>\\n\\nHi<|eot|>...
    harmony     <|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>
    jamba       <|startoftext|><|bom|><|user|>Hi<|eom|><|bom|><|assistant|>
    nemotron_h  <s><extra_id_1>User\\nHi\\n<extra_id_1>Assistant\\n

Gemma and Mistral have no system turn: a system message is put in front of
the first turn's text. Mistral's user turn already ends in the prompt for
the reply, so `add_generation_prompt` adds nothing there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenizerFamily:
    """Special tokens and chat template of one family of presets.

    `add_bos`: whether encoding with special tokens puts `bos_token` first
    (chat templates that want it write it themselves).
    """

    name: str
    pad_token: str
    bos_token: str
    eos_token: str
    markers: tuple[str, ...]
    add_bos: bool
    chat_template: str

    @property
    def special_tokens(self) -> list[str]:
        """All special tokens in id order: pad, bos, eos, then the markers."""
        return [self.pad_token, self.bos_token, self.eos_token, *self.markers]


# A leading system message, when the family has no system turn, becomes a
# prefix of the first turn's text.
_SYSTEM_AS_PREFIX = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set turns = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system_prefix = '' -%}"
    "{%- set turns = messages -%}"
    "{%- endif -%}"
)

_GEMMA = (
    "{{- bos_token -}}" + _SYSTEM_AS_PREFIX +
    "{%- for message in turns -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<start_of_turn>' + role + '\\n' + (system_prefix if loop.first else '')"
    " + message['content'] + '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)

_CHATML = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_MISTRAL = (
    "{{- bos_token -}}" + _SYSTEM_AS_PREFIX +
    "{%- for message in turns -%}"
    "{%- if message['role'] == 'user' -%}"
    "{{- '[INST] ' + (system_prefix if loop.first else '') + message['content']"
    " + ' [/INST]' -}}"
    "{%- else -%}"
    "{{- ' ' + message['content'] + eos_token -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)

_LLAMA4 = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' + message['content']"
    " + '<|eot|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|header_start|>assistant<|header_end|>\\n\\n' -}}"
    "{%- endif -%}"
)

# harmony: a user-given system prompt is a developer message; past assistant
# replies are final-channel messages closed by <|end|>; a new reply ends in
# <|return|> (the eos).
_HARMONY = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{{- '<|start|>developer<|message|># Instructions\\n\\n' + message['content']"
    " + '<|end|>' -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' -}}"
    "{%- else -%}"
    "{{- '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' -}}"
    "{%- endif -%}"
)

_JAMBA = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|bom|><|' + message['role'] + '|>' + message['content'] + '<|eom|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|bom|><|assistant|>' -}}{%- endif -%}"
)

_NEMOTRON_H = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{{- '<extra_id_0>System\\n' + message['content'] + '\\n' -}}"
    "{%- elif message['role'] == 'user' -%}"
    "{{- '<extra_id_1>User\\n' + message['content'] + '\\n' -}}"
    "{%- else -%}"
    "{{- '<extra_id_1>Assistant\\n' + message['content'] + eos_token + '\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<extra_id_1>Assistant\\n' -}}{%- endif -%}"
)

FAMILIES: dict[str, TokenizerFamily] = {family.name: family for family in (
    TokenizerFamily("gemma", "<pad>", "<bos>", "<end_of_turn>", ("<start_of_turn>", "<eos>"),
                    True, _GEMMA),
    TokenizerFamily("chatml", "<|pad|>", "<|endoftext|>", "<|im_end|>", ("<|im_start|>",),
                    False, _CHATML),
    TokenizerFamily("mistral", "<pad>", "<s>", "</s>", ("[INST]", "[/INST]"), True, _MISTRAL),
    TokenizerFamily("llama4", "<|finetune_right_pad|>", "<|begin_of_text|>", "<|eot|>",
                    ("<|header_start|>", "<|header_end|>", "<|end_of_text|>"), True, _LLAMA4),
    TokenizerFamily("harmony", "<|endoftext|>", "<|startoftext|>", "<|return|>",
                    ("<|start|>", "<|message|>", "<|end|>", "<|channel|>"), False, _HARMONY),
    TokenizerFamily("jamba", "<|pad|>", "<|startoftext|>", "<|eom|>",
                    ("<|bom|>", "<|system|>", "<|user|>", "<|assistant|>", "<|endoftext|>"),
                    True, _JAMBA),
    TokenizerFamily("nemotron_h", "<pad>", "<s>", "</s>", ("<extra_id_0>", "<extra_id_1>"),
                    True, _NEMOTRON_H),
)}

PRESET_TO_FAMILY: dict[str, str] = {
    "gemma3-tiny": "gemma",
    "gemma2-tiny": "gemma",
    "qwen2-tiny": "chatml",
    "mistral-tiny": "mistral",
    "llama4-tiny": "llama4",
    "gpt-oss-tiny": "harmony",
    "jamba-tiny": "jamba",
    "nemotron-h-tiny": "nemotron_h",
}
