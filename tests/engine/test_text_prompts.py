"""String prompts: every preset's built-in tokenizer, a checkpoint's own tokenizer files,
and a tokenizer passed to LLM."""

import pytest
from transformers import PreTrainedTokenizerBase

from hybridkv import LLM, SamplingParams
from hybridkv.models import list_presets
from hybridkv.models.presets import build_preset_model, get_preset
from hybridkv.models.tokenizers import load_preset_tokenizer

GREEDY = SamplingParams(max_tokens=6)
TEXT = "The train left the station at half past eight."


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def small(model, **kwargs):
    return LLM(model, block_size=8, num_blocks=96, **kwargs)


@pytest.mark.parametrize("preset", list_presets())
def test_a_string_prompt_equals_its_encoded_ids(preset):
    llm = small(preset)
    tok = llm.tokenizer
    assert isinstance(tok, PreTrainedTokenizerBase)
    ids = tok.encode(TEXT)
    by_text, by_ids = llm.generate([TEXT, ids], GREEDY)
    assert by_text.prompt_token_ids == ids
    assert by_text.output_token_ids == by_ids.output_token_ids
    assert by_text.text == tok.decode(by_text.output_token_ids, skip_special_tokens=True)
    # the token the engine stops on is the tokenizer's eos (the config's eos id)
    assert tok.eos_token_id == get_preset(preset).build_config().eos_token_id
    assert tok.eos_token_id in llm.runner.eos_token_ids


def test_token_id_prompts_are_unchanged_by_the_tokenizer():
    """A preset with its tokenizer generates what the bare model generates."""
    prompt = list(range(3, 40))
    with_tok = small("jamba-tiny").generate([prompt], GREEDY)[0]
    bare = small(build_preset_model("jamba-tiny", seed=0)).generate([prompt], GREEDY)[0]
    assert with_tok.output_token_ids == bare.output_token_ids
    assert bare.text is None and with_tok.text is not None


def test_string_prompts_are_checked_like_token_prompts():
    llm = small("qwen2-tiny")  # qwen adds no bos: "" encodes to nothing
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        llm.generate(["fine", ""], GREEDY)
    with pytest.raises(ValueError, match="prompt 0 has .* tokens"):
        llm.generate(["word " * 600], GREEDY)


def test_a_checkpoint_directory_loads_its_own_tokenizer(tmp_path):
    build_preset_model("gemma3-tiny", seed=0).save_pretrained(tmp_path)
    load_preset_tokenizer("gemma3-tiny").save_pretrained(tmp_path)
    from_dir, preset = small(tmp_path), small("gemma3-tiny")
    assert from_dir.tokenizer is not None and from_dir.tokenizer is not preset.tokenizer
    assert from_dir.tokenizer.encode(TEXT) == preset.tokenizer.encode(TEXT)
    assert from_dir.tokenizer.chat_template == preset.tokenizer.chat_template
    # same weights (seed 0), same tokenizer: the same greedy text
    assert [o.output_token_ids for o in from_dir.generate([TEXT], GREEDY)] == [
        o.output_token_ids for o in preset.generate([TEXT], GREEDY)]


def test_a_checkpoint_uses_its_files_not_the_preset_of_its_family(tmp_path):
    build_preset_model("gemma3-tiny", seed=0).save_pretrained(tmp_path)
    load_preset_tokenizer("qwen2-tiny").save_pretrained(tmp_path)  # a ChatML tokenizer
    tok = small(tmp_path).tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_a_checkpoint_without_tokenizer_files_takes_token_ids_only(tmp_path):
    build_preset_model("mistral-tiny", seed=0).save_pretrained(tmp_path)
    llm = small(tmp_path)
    assert llm.tokenizer is None
    with pytest.raises(ValueError, match="prompt 0 is a string"):
        llm.generate(["hello"], GREEDY)
    assert llm.generate([[1, 5, 9]], GREEDY)[0].output_token_ids


def test_a_model_object_has_no_tokenizer_unless_given_one(tmp_path):
    model = build_preset_model("mistral-tiny", seed=0)
    assert small(model).tokenizer is None
    tok = load_preset_tokenizer("mistral-tiny")
    assert small(model, tokenizer=tok).tokenizer is tok
    tok.save_pretrained(tmp_path)
    from_dir = small(model, tokenizer=str(tmp_path)).tokenizer
    assert from_dir.encode(TEXT) == tok.encode(TEXT)
    out = small(model, tokenizer=tmp_path).generate([TEXT], GREEDY)[0]
    assert out.prompt_token_ids == tok.encode(TEXT)


def test_a_given_tokenizer_wins_over_the_presets():
    tok = load_preset_tokenizer("qwen2-tiny")
    assert small("gemma3-tiny", tokenizer=tok).tokenizer is tok


@pytest.mark.parametrize("bad, error, match", [
    (42, ValueError, "got int"),
    ("/no/such/tokenizer", FileNotFoundError, "/no/such/tokenizer"),
])
def test_a_bad_tokenizer_argument_is_refused(bad, error, match):
    with pytest.raises(error, match=match):
        small("qwen2-tiny", tokenizer=bad)


def test_a_tokenizer_directory_without_files_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no readable tokenizer in .*" + tmp_path.name):
        small("qwen2-tiny", tokenizer=tmp_path)
