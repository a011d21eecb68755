"""Chat: each family's template renders its own markers; bad messages name the field."""

import copy

import pytest

from hybridkv import LLM, SamplingParams
from hybridkv.engine.chat import check_messages, render_chat, render_chat_text
from hybridkv.models import list_presets
from hybridkv.models.presets import build_preset_model
from hybridkv.models.tokenizers import load_preset_tokenizer, preset_tokenizer_family

GREEDY = SamplingParams(max_tokens=4)
CHAT = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Why?"}]
# written out by hand from each family's chat format
EXPECTED = {
    "gemma": "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello."
             "<end_of_turn>\n<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n",
    "chatml": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
              "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n",
    "mistral": "<s>[INST] Hi [/INST] Hello.</s>[INST] Why? [/INST]",
    "llama4": "<|begin_of_text|><|header_start|>user<|header_end|>\n\nHi<|eot|>"
              "<|header_start|>assistant<|header_end|>\n\nHello.<|eot|>"
              "<|header_start|>user<|header_end|>\n\nWhy?<|eot|>"
              "<|header_start|>assistant<|header_end|>\n\n",
    "harmony": "<|start|>user<|message|>Hi<|end|>"
               "<|start|>assistant<|channel|>final<|message|>Hello.<|end|>"
               "<|start|>user<|message|>Why?<|end|><|start|>assistant<|channel|>final<|message|>",
    "jamba": "<|startoftext|><|bom|><|user|>Hi<|eom|><|bom|><|assistant|>Hello.<|eom|>"
             "<|bom|><|user|>Why?<|eom|><|bom|><|assistant|>",
    "nemotron_h": "<s><extra_id_1>User\nHi\n<extra_id_1>Assistant\nHello.</s>\n"
                  "<extra_id_1>User\nWhy?\n<extra_id_1>Assistant\n",
}
SYSTEM_START = {
    "gemma": "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>",
    "chatml": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>",
    "mistral": "<s>[INST] Be brief.\n\nHi [/INST]",
    "llama4": "<|begin_of_text|><|header_start|>system<|header_end|>\n\nBe brief.<|eot|>",
    "harmony": "<|start|>developer<|message|># Instructions\n\nBe brief.<|end|>",
    "jamba": "<|startoftext|><|bom|><|system|>Be brief.<|eom|><|bom|><|user|>Hi<|eom|>",
    "nemotron_h": "<s><extra_id_0>System\nBe brief.\n<extra_id_1>User\nHi\n",
}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def llm():
    return LLM("gemma3-tiny", block_size=8, num_blocks=96)


@pytest.mark.parametrize("preset", list_presets())
def test_three_messages_render_the_family_markers(preset):
    tok, family = load_preset_tokenizer(preset), preset_tokenizer_family(preset)
    text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert text == EXPECTED[family.name]
    ids = render_chat(tok, CHAT)
    assert ids == tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    # every marker in the text is one special id, never spelled out in bytes
    specials = set(range(len(family.special_tokens)))
    assert sum(text.count(t) for t in family.special_tokens) == sum(i in specials for i in ids)
    without = render_chat_text(tok, CHAT, add_generation_prompt=False)
    if family.name == "mistral":  # [/INST] already asks for the reply
        assert without == text
    else:
        assert text.startswith(without) and len(without) < len(text)


@pytest.mark.parametrize("preset", list_presets())
def test_a_system_message_opens_the_conversation(preset):
    tok, family = load_preset_tokenizer(preset), preset_tokenizer_family(preset)
    text = render_chat_text(tok, [{"role": "system", "content": "Be brief."}, *CHAT[:1]])
    assert text.startswith(SYSTEM_START[family.name])


def test_chat_equals_generate_on_the_rendered_ids(llm):
    second = [*CHAT[:2], {"role": "user", "content": "And then?"}]
    outs = llm.chat([CHAT, second], GREEDY)
    by_ids = llm.generate([render_chat(llm.tokenizer, c) for c in (CHAT, second)], GREEDY)
    assert [o.output_token_ids for o in outs] == [o.output_token_ids for o in by_ids]
    one = llm.chat(CHAT, GREEDY)
    assert len(one) == 1 and one[0].output_token_ids == outs[0].output_token_ids
    assert one[0].prompt_token_ids == render_chat(llm.tokenizer, CHAT)


def test_text_parts_are_joined_like_a_string(llm):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"},
                                          {"type": "text", "text": "there"}]}]
    assert render_chat(llm.tokenizer, parts) == render_chat(
        llm.tokenizer, [{"role": "user", "content": "Hi\nthere"}])


@pytest.mark.parametrize("messages, match", [
    ([], r"non-empty list"),
    ("hi", r"non-empty list"),
    ([CHAT[0], "hi"], r"messages\[1\] must be a dict"),
    ([{"content": "x"}], r"messages\[0\]\.role is missing"),
    ([CHAT[0], {"role": "wizard", "content": "x"}], r"messages\[1\]\.role: unknown role "
                                                    r"'wizard'; expected one of system, user"),
    ([{"role": 3, "content": "x"}], r"messages\[0\]\.role: unknown role 3"),
    ([CHAT[0], CHAT[1], {"role": "user"}], r"messages\[2\]\.content is missing"),
    ([{"role": "user", "content": None}], r"messages\[0\]\.content is missing"),
    ([{"role": "user", "content": 7}], r"messages\[0\]\.content must be a string"),
    ([{"role": "user", "content": [{"type": "image_url"}]}], r"messages\[0\]\.content\[0\]"),
    ([{"role": "user", "content": [{"type": "text", "text": 5}]}],
     r"messages\[0\]\.content\[0\]"),
])
def test_bad_messages_name_the_field(messages, match):
    with pytest.raises(ValueError, match=match):
        check_messages(messages)


def test_bad_chat_changes_nothing(llm):
    before = (llm.kv.num_free_blocks, llm.stats.steps, llm._counter)
    with pytest.raises(ValueError, match=r"conversation 1: messages\[0\]\.role"):
        llm.chat([CHAT, [{"role": "robot", "content": "x"}]], GREEDY)
    with pytest.raises(ValueError, match=r"^messages\[2\]\.content is missing"):
        llm.chat([*CHAT[:2], {"role": "user"}], GREEDY)
    with pytest.raises(ValueError, match="non-empty list of conversations"):
        llm.chat([], GREEDY)
    assert (llm.kv.num_free_blocks, llm.stats.steps, llm._counter) == before


def test_chat_without_tokenizer_or_template_is_refused():
    bare = LLM(build_preset_model("qwen2-tiny", seed=0), block_size=8, num_blocks=32)
    with pytest.raises(ValueError, match="has none; pass tokenizer="):
        bare.chat(CHAT, GREEDY)
    tok = copy.deepcopy(load_preset_tokenizer("qwen2-tiny"))
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        render_chat(tok, CHAT)
    plain = LLM(build_preset_model("qwen2-tiny", seed=0), block_size=8, num_blocks=32,
                tokenizer=tok)
    assert plain.generate(["Hello"], GREEDY)[0].output_token_ids  # plain text still works
    with pytest.raises(ValueError, match="no chat template"):
        plain.chat(CHAT, GREEDY)


def test_a_failing_template_is_a_value_error():
    tok = copy.deepcopy(load_preset_tokenizer("qwen2-tiny"))
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(ValueError, match="roles must alternate"):
        render_chat(tok, CHAT)
